"""Copy pieces of several depths on one product, interleaved run by run. (GPU)

    PYTHONPATH=src python3 bench/diag/piece_sweep.py        # under a minute on one H200

The planner's timing model (outcore/gemm/model.py) ties the bf16 TN training shapes'
copy pieces from 256 to 4096 deep within 1% and takes 512 for the 16384-tall tiles,
though each piece costs the host a copy, a conversion, events and often a GEMM to issue.
This runs each case below in the planner's tiles with pieces of each depth in PIECES,
round-robin, ROUNDS rounds after a warm-up of each (host matrices of their own:
`gemm.host_matrices`), and reports each depth's median. Writes
bench/results/piece-sweep-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from gemm import host_matrices, train_cases  # noqa: E402

from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import unpin_  # noqa: E402

ROUNDS = 7
PIECES = (512, 1024, 2048, 4096)
# case -> the planner's C tile (rows, cols) in session 24's record
CASES = {"train-TN-t16384-f16384-bf16": (16384, 8192),
         "train-TN-t32768-f16384-bf16": (16384, 8192),
         "train-TN-t16384-f8192-bf16": (4096, 4096)}


def main() -> int:
    if not torch.cuda.is_available():
        print("piece_sweep.py needs a GPU")
        return 1
    rows = []
    for c in [c for c in train_cases(False) if c.name in CASES]:
        A, B, C = host_matrices(c)
        variants = [None] + [CASES[c.name] + (c.k, p) for p in PIECES]   # None: the planner

        def once(tile) -> tuple[float, str]:
            torch.cuda.synchronize()   # host sync: each product starts on an idle device
            t0 = time.perf_counter()
            st = matmul(A, B, C, transa=c.transa, transb=c.transb, compute=c.compute,
                        tile=tile, return_stats=True)[1]
            return time.perf_counter() - t0, st.plan

        plans = {v: once(v)[1] for v in variants}                 # warm-up, each
        times: dict = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for v in variants:
                times[v].append(once(v)[0])
        for v in variants:
            rows.append({"case": c.name, "piece": "planner" if v is None else v[3],
                         "median_ms": statistics.median(times[v]) * 1e3,
                         "runs_ms": [t * 1e3 for t in times[v]], "plan": plans[v]})
        for x in (A, B, C):
            unpin_(x)
    doc = common.header("piece-sweep")
    doc["rounds"], doc["runs"] = ROUNDS, rows
    path = common.write(doc, f"piece-sweep-{common.machine_name()}")
    print(common.table(rows, ["case", "piece", "median_ms"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
