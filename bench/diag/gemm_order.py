"""Why bench/gemm.py's tf32 and bf16 rows run slower than bench/gemm_probe.py's (GPU).

    PYTHONPATH=src python3 bench/diag/gemm_order.py        # about 1 min on one H200

Session 11: the same plans took 223 ms (tf32-32768) and 189 ms (bf16) in the probe, and
229-243 ms and 201-214 ms in two runs of the bench, where the fp32 rows (in-core and
cuBLASXt, its handles closed after each row) and an in-core row of the same case run
first. This times outcore tf32 and bf16 at 32768 (the planner's plan, bench/gemm.py's
run_outcore: a warm-up, then the median of 3) first, after the fp32-16384 in-core and
cuBLASXt rows, after each case's own in-core row, and again; and the host-side costs
before a product's first copy: the arena's look at the allocator's free blocks
(gemm/arena.largest_free_block) and a cached plan lookup. Writes
bench/results/gemm-order-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
import gemm as bench  # noqa: E402

from outcore.gemm.arena import largest_free_block  # noqa: E402
from outcore.gemm.plan import make_plan  # noqa: E402
from outcore.memory import pin_  # noqa: E402


def host_costs(dev: torch.device) -> dict:
    """Median seconds of one free-block look and of one cached plan lookup (20 each)."""
    def med(fn) -> float:
        out = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)
    n = 32768
    return {"largest_free_block_s": med(lambda: largest_free_block(dev)),
            "segments": len(torch.cuda.memory_snapshot()),
            "plan_lookup_s": med(lambda: make_plan(n, n, n, host_dtype=torch.float32,
                                                   compute="tf32", budget=100 << 30))}


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/gemm_order.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    env = bench.Env(False, 3, time.perf_counter() + 1e9, [dev])
    env.bufs = [torch.empty(32768 * 32768) for _ in range(3)]
    for b in env.bufs:
        bench.fill_(b)
    env.bufs = [pin_(b) for b in env.bufs]
    env.bw = bench.measure_bandwidth(env)
    cases = {c.name: c for c in bench.square_cases(False)}
    doc = common.header("gemm-order")
    doc["bandwidth_gbps"] = env.bw
    rows = doc["runs"]

    def outcore(name: str, when: str) -> None:
        r = bench.run_outcore(env, cases[name], [dev], check=False)
        rows.append({"case": name, "when": when, "wall_s": r["wall_s"], "runs_s": r["runs_s"],
                     "tflops": r["tflops"], "plan": r["plan"], **host_costs(dev)})
        print(f"{name:12s} {when:24s} {r['wall_s'] * 1e3:7.1f} ms", flush=True)

    for name in ("tf32-32768", "bf16-32768"):
        outcore(name, "first")
    bench.run_incore(env, cases["fp32-16384"], dev)
    bench.run_cublasxt(env, cases["fp32-16384"], [dev])
    for name in ("tf32-32768", "bf16-32768"):
        outcore(name, "after fp32 rows")
    for name in ("tf32-32768", "bf16-32768"):
        bench.run_incore(env, cases[name], dev)
        outcore(name, "after its in-core row")
    for name in ("tf32-32768", "bf16-32768"):
        outcore(name, "again")
    common.write(doc, f"gemm-order-{common.machine_name()}")
    print(common.table(rows, ["case", "when", "wall_s", "tflops", "largest_free_block_s",
                              "segments", "plan_lookup_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
