"""Where does a product's host time go before its first copy? (GPU)

    PYTHONPATH=src python3 bench/diag/host_setup.py        # about 30 s on one H200

The gemm probes put 0.8-1.4 ms between `outcore.matmul`'s call and its first copy
(`ready_s`), which counts in the short bf16 products (18-19 ms at 16384 tokens, 8192
features) and in fp32-16384's head. This times, for fp32-16384 and the bf16 NN shape at
16384 tokens and 8192 features (pinned host matrices, after a warm-up): each product's
ready_s over RUNS runs; the host functions of one product by cProfile (top by own time);
and the arena's `largest_free_block` (a memory snapshot) alone. Writes
bench/results/host-setup-<machine>.json, a table last. HOST_SETUP_OLD=1 runs the host rules
before session 27 (new streams each product, the arena's snapshot every product).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from gemm import host_matrices, square_cases, train_cases  # noqa: E402

from outcore.gemm import arena, matmul, worker  # noqa: E402
from outcore.gemm.arena import largest_free_block  # noqa: E402
from outcore.memory import unpin_  # noqa: E402

RUNS = 7
if os.environ.get("HOST_SETUP_OLD"):   # the host rules before session 27
    worker.REUSE_STREAMS = arena.SKIP_SNAPSHOT = False
CASES = ("fp32-16384", "train-NN-t16384-f8192-bf16")


# the steps before a product's first copy (by function name), listed by their total time
SETUP = ("resolve_budget", "make_plan", "_setup", "_make_room", "largest_free_block",
         "memory_snapshot", "__init__", "_make_lanes", "mem_get_info", "_counts",
         "release", "_device_streams")


def profile_top(fn, n: int = 15) -> list[dict]:
    """The n host functions of one call of fn with the most own time (ms), then the SETUP
    ones over 0.02 ms by their total time."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    st = pstats.Stats(prof)
    rows = [{"function": f"{os.path.basename(f)}:{line}({name})", "calls": nc,
             "own_ms": tt * 1e3, "cum_ms": ct * 1e3}
            for (f, line, name), (_, nc, tt, ct, _) in st.stats.items()]
    setup = [r for r in rows if any(f"({s})" in r["function"] for s in SETUP)
             and r["cum_ms"] > 0.02]
    return (sorted(rows, key=lambda r: -r["own_ms"])[:n]
            + sorted(setup, key=lambda r: -r["cum_ms"]))


def measure(c) -> tuple[dict, list[dict]]:
    """Case c's row (median wall, ready and plan ms over RUNS products after a warm-up) and
    one product's host profile."""
    A, B, C = host_matrices(c)

    def once():
        return matmul(A, B, C, transa=c.transa, transb=c.transb, compute=c.compute,
                      return_stats=True)[1]

    once()
    walls, phases = [], []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        phases.append(once().phases())
        walls.append(time.perf_counter() - t0)
    ready = [p["ready_s"] for p in phases]
    prof = profile_top(once)
    # unregistered before the tensors go: a freed range still registered made the next
    # case's matrices, allocated over it, look pinned with stale mappings (session 27: the
    # second case's first copy out failed with "invalid argument" in every variant)
    for x in (A, B, C):
        unpin_(x)
    return ({"case": c.name, "wall_ms": statistics.median(walls) * 1e3,
             "ready_ms": statistics.median(ready) * 1e3,
             "ready_ms_runs": [r * 1e3 for r in ready],
             "plan_ms": statistics.median(p["plan_s"] for p in phases) * 1e3}, prof)


def main() -> int:
    smoke = "--smoke" in sys.argv     # tiny cases on the CPU: the code path only
    if not smoke and not torch.cuda.is_available():
        print("bench/diag/host_setup.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("host-setup")
    names = CASES if not smoke else ("fp32-512", "train-NN-t512-f256-bf16")
    cases = [c for c in square_cases(smoke) + train_cases(smoke) if c.name in names]
    rows, profiles = [], {}
    for c in cases:
        row, profiles[c.name] = measure(c)
        rows.append(row)
    if not smoke:
        snap = []
        for _ in range(20):
            t0 = time.perf_counter()
            largest_free_block(torch.device("cuda", 0))
            snap.append(time.perf_counter() - t0)
        doc["largest_free_block_ms"] = statistics.median(snap) * 1e3
    doc["runs"], doc["profiles"] = rows, profiles
    if not smoke:
        tag = os.environ.get("HOST_SETUP_TAG")    # keeps an earlier call's file
        common.write(doc, f"host-setup-{common.machine_name()}" + (f"-{tag}" if tag else ""))
    for name, prof in profiles.items():
        print(f"\n{name}: host functions by own time (one product, cProfile)")
        print(common.table(prof, ["function", "calls", "own_ms", "cum_ms"]))
    print(f"\nlargest_free_block alone: {doc.get('largest_free_block_ms')} ms")
    print(common.table(rows, ["case", "wall_ms", "ready_ms", "plan_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
