"""fp32 products with their tile GEMMs through cuBLASLt's configured kernel, or cuBLAS's own
pick: an A/B on one GPU.

    PYTHONPATH=src python3 bench/diag/lt_ab.py        # about 4 minutes on one H200

Session 21's `bench/diag/lt_algos.py` (lt-algos-h200.json) found cuBLASLt's algorithm 55 with
the 256 x 128 tile running the fp32 4096^2 x 16384 tiles at 53.3 TFLOP/s and
4096^2 x 2048 pieces at 52.2, where cuBLAS's pick runs 51.4 and 50.0. `outcore.gemm.ltmm`
sends fp32 GEMMs that way on sm_90. This times every fp32 case of bench/gemm.py
(fp32-16384, fp32-32768 and the 18 fp32 training shapes; outcore.matmul, pinned host
matrices, median of 3 after a warm-up) with ltmm on ("lt") and off ("cublas"), over
ROUNDS rounds in alternating order; round 0 checks two rows of each product against
float64. Writes bench/results/lt-ab-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from fp32_wide import ab_cases, time_product, write_ab  # noqa: E402
from gemm import square_cases, train_cases  # noqa: E402

from outcore.gemm import ltmm, matmul  # noqa: E402

ROUNDS = int(os.environ.get("LT_AB_ROUNDS", "3"))


def timer(c, A, B, C, variant: str):
    ltmm.ENABLED = variant == "lt"
    before = ltmm.calls
    t, plan = time_product(lambda: matmul(A, B, C, transa=c.transa, transb=c.transb,
                                          compute="fp32", return_stats=True)[1])
    assert (ltmm.calls > before) == ltmm.ENABLED, "the variant did not take its path"
    return t, plan


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/lt_ab.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("lt-ab")
    only = os.environ.get("LT_AB_CASES")
    cases = [c for c in square_cases(False) + train_cases(False) if c.compute == "fp32"
             and (not only or c.name in only.split(","))]
    rows = ab_cases(cases, ["lt", "cublas"], timer, ROUNDS, "cublas")
    ltmm.ENABLED = True
    write_ab(doc, rows, "lt-ab", "cublas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
