"""Plans that cache every block at its own size: do their new picks run faster? One GPU.

    PYTHONPATH=src python3 bench/diag/exact_cache.py        # about 2 minutes on one H200

Session 20: where a plan caches every block of A and B, each cache slot now takes its
block's own size (BlockCache(exact=True)), not the larger of the two blocks' sizes. A
whole-width strip's plan for bf16 at 32768 (1024 x 32768 tiles) then holds 6.5 GiB where
it was counted as 68.5, and the planner takes it under budgets that used to exclude it;
so does tf32 its 2048-row strips. (This diag's first run, exact-cache-h200-s20a.json, had
tf32 at the bench's budget in 1024-row strips with a prologue, the model's pick by 1%:
0.92x the 2048-row ones, hence lone.MIN_STRIP_ROWS.) This times, alternating over
ROUNDS rounds (median of RUNS after a warm-up each), each case's new pick (the
planner's) against the tiles it took before (forced through `tile`; the planner picks
their piece and prologue, so they may differ from then: each row records its plan):
  tf32-32768 under gpu_memory=16GiB: new 2048-row strips (the bench's plan) against
    8192^2 tiles;
  bf16-32768 under gpu_memory=16GiB: new 1024-row strips against 2048 x 8192 tiles;
  bf16-32768 under gpu_memory=8GiB: new 1024-row strips against 4096 x 8192 tiles.
Round 0 checks two rows of each product against float64. Writes
bench/results/exact-cache-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from fp32_wide import ab_rounds, time_product, write_ab  # noqa: E402
from gemm import fill_, square_cases  # noqa: E402

from outcore.gemm import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

# case -> (gpu_memory, {variant: tile or None for the planner's})
CASES = {"tf32-32768@16GiB": ("16GiB", {"planner": None,
                                        "before": (8192, 8192, 32768, 8192)}),
         "bf16-32768@16GiB": ("16GiB", {"planner": None, "before": (2048, 8192, 32768)}),
         "bf16-32768@8GiB": ("8GiB", {"planner": None, "before": (4096, 8192, 32768)})}
ROUNDS = 3


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/exact_cache.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("exact-cache")
    by_name = {c.name: c for c in square_cases(False)}
    n = 32768
    A, B, C = (pin_(torch.empty(n, n)) for _ in range(3))
    fill_(A.view(-1))
    fill_(B.view(-1))
    rows = []
    for name, (mem, variants) in CASES.items():
        c = by_name[name.split("@")[0]]

        def timer(c, A, B, C, v, mem=mem, variants=variants):
            return time_product(lambda: matmul(A, B, C, compute=c.compute, tile=variants[v],
                                               gpu_memory=mem, return_stats=True)[1])
        got = ab_rounds(c, A, B, C, list(variants), timer, ROUNDS, "before")
        for r in got:
            r["case"], r["gpu_memory"] = name, mem
        rows += got
        torch.cuda.empty_cache()
    write_ab(doc, rows, "exact-cache", "before")
    return 0


if __name__ == "__main__":
    sys.exit(main())
