"""tf32x3's error on sums of one sign (Gram matrices, non-negative data), by BIG_CHUNK. (GPU)

    PYTHONPATH=src python3 bench/diag/x3_gram.py        # about 30 s on one H200

Session 25's record sampled one entry of A A^T's diagonal (a sum of squares) whose tf32x3
error was 68x cuBLASXt's, as one truncation per 8-deep tensor-core step would make it:
about (BIG_CHUNK / 8) x 2^-24 of the sum. This measures it on purpose: C = A A^T through
outcore.matmul (A pinned on the host, M x K), for A uniform in [-1, 1) and in [0, 1), as
fp32, tf32 and tf32x3 with split.BIG_CHUNK in CHUNKS, each against float64, with the
largest error relative to sum |a||b| on C's diagonal and off it, and the time (end to
end, into a new pageable host matrix: for comparing the rows only). Writes
bench/results/x3-gram-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm import split as split_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import pin_, unpin_  # noqa: E402

M, K = 4096, 16384
CHUNKS = (2048, 1024, 512, 256)
DEV, DEVICES = "cuda", 0     # where the float64 reference is made, and matmul's devices


def main() -> int:
    if DEV == "cuda" and not torch.cuda.is_available():
        print("x3_gram.py needs a GPU")
        return 1
    default = split_mod.BIG_CHUNK
    rows = []
    g = torch.Generator().manual_seed(3)
    for data, lo in (("signed", -1.0), ("non-negative", 0.0)):
        A = pin_(torch.rand(M, K, generator=g) * (1.0 - lo) + lo)
        a = A.to(DEV).double()
        ref, scale = a @ a.t(), a.abs() @ a.abs().t()
        diag = torch.eye(M, dtype=torch.bool, device=DEV)
        runs = [("fp32", None), ("tf32", None)] + [("tf32x3", kc) for kc in CHUNKS]
        for compute, kc in runs:
            split_mod.BIG_CHUNK = kc if kc is not None else default
            try:
                matmul(A, A, transb=True, devices=DEVICES, compute=compute)   # warm-up
                t0 = time.perf_counter()      # matmul returns once C is on the host
                out = matmul(A, A, transb=True, devices=DEVICES, compute=compute)
                t = time.perf_counter() - t0
            finally:
                split_mod.BIG_CHUNK = default
            rel = (out.to(DEV).double() - ref).abs() / scale
            rows.append({"data": data, "compute": compute, "big_chunk": kc,
                         "diag_max_rel_error": rel[diag].max().item(),
                         "off_max_rel_error": rel[~diag].max().item(), "ms": t * 1e3})
        unpin_(A)
        del a, ref, scale, diag
        if DEV == "cuda":
            torch.cuda.empty_cache()
    doc = common.header("x3-gram")
    doc["runs"] = rows
    path = common.write(doc, f"x3-gram-{common.machine_name()}")
    print(common.table(rows, ["data", "compute", "big_chunk", "diag_max_rel_error",
                              "off_max_rel_error", "ms"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
