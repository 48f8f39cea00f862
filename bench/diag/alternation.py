"""Why do some products alternate between two times, run after run? (GPU)

    PYTHONPATH=src python3 bench/diag/alternation.py        # about 30 s on one H200

In session 24's strips A/B (gemm-h200-s24-strip*.json) the bf16 NT shape at 16384 tokens
and 8192 features ran 19.1, 17.8, 19.1, 17.7, 19.1 ms, run after run, in each of four
processes; the record's run of the same case, after other cases, 17.9 three times. Its
B pieces are 2-D copies of 8 KiB rows. This runs that product and the NN one RUNS times
each in one process (host matrices of their own, filled and pinned as bench/gemm.py
fills and pins its buffers: `gemm.host_matrices`) and records each
product's time with where its device arena began (the address mod 2 MiB and whether the
address repeats), to see whether the slow runs share an arena. Writes
bench/results/alternation-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from gemm import host_matrices, train_cases  # noqa: E402

from outcore.gemm import arena as arena_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402

RUNS = 12
CASES = ("train-NT-t16384-f8192-bf16", "train-NN-t16384-f8192-bf16")


def main() -> int:
    if not torch.cuda.is_available():
        print("alternation.py needs a GPU")
        return 1
    seen: list[int] = []
    init = arena_mod.Arena.__init__

    def recording_init(self, device, nbytes):
        init(self, device, nbytes)
        seen.append(self.buf.data_ptr())

    arena_mod.Arena.__init__ = recording_init
    rows = []
    for c in [c for c in train_cases(False) if c.name in CASES]:
        A, B, C = host_matrices(c)
        ptrs: dict[int, int] = {}
        for i in range(RUNS + 1):
            torch.cuda.synchronize()      # host sync: each product starts on an idle device
            t0 = time.perf_counter()
            matmul(A, B, C, transa=c.transa, transb=c.transb, compute=c.compute)
            wall = time.perf_counter() - t0
            p = seen[-1]
            ptrs.setdefault(p, len(ptrs))
            rows.append({"case": c.name, "run": i, "wall_ms": wall * 1e3,
                         "arena": ptrs[p], "arena_mod_2m": p % (2 << 20),
                         "reserved_gib": torch.cuda.memory_reserved() / 2**30})
    doc = common.header("alternation")
    doc["runs"] = rows
    path = common.write(doc, f"alternation-{common.machine_name()}")
    print(common.table(rows, ["case", "run", "wall_ms", "arena", "arena_mod_2m",
                              "reserved_gib"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
