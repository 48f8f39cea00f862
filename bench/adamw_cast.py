#!/usr/bin/env python3
"""The CPU AdamW's rate with and without the bf16 copy of the weights (host_weight_copy).

    PYTHONPATH=src python3 bench/adamw_cast.py               # 200M params; ~1 min on 16 cores
    PYTHONPATH=src python3 bench/adamw_cast.py --params 20e6 # smaller

Three ways to update one flat group of fp32 params on the host, every core at work:
  fused       torch's fused AdamW (what the engine runs without copies)
  fused+cast  the same, then the cast to a bf16 copy (host_weight_copy=True)
  one-pass    stream/cast_kernel.py: the update writes the copy as it goes
                 (host_weight_copy="fused")
Median of --reps timed runs after one warm-up each, in G params/s. Writes
bench/results/adamw-cast-<machine>.json (the rates, the kernel's build time) and prints a
table. No GPU is used: on a GPU machine it measures that machine's host.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# --thp: torch's CPU allocations of 2 MiB and more on transparent huge pages. libc10 reads
# THP_MEM_ALLOC_ENABLE when it loads, so the script starts itself again with it set.
if "--thp" in sys.argv and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, THP_MEM_ALLOC_ENABLE="1"))

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from outcore.stream import cast_kernel  # noqa: E402
from outcore.stream.optimizer import _adamw  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=200e6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="results name or path (default: "
                    "adamw-cast-<machine>)")
    ap.add_argument("--thp", action="store_true", help="torch's buffers on transparent huge "
                    "pages (THP_MEM_ALLOC_ENABLE=1)")
    args = ap.parse_args()
    n = int(args.params)
    t = time.perf_counter()
    mod = cast_kernel.load()
    build_s = time.perf_counter() - t
    gen = torch.Generator().manual_seed(0)
    p, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3
    m, v, out = torch.zeros(n), torch.zeros(n), torch.empty(n, dtype=torch.bfloat16)
    step = torch.zeros(())
    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def fused():
        _adamw([p], [g], [m], [v], [step], fused=True, **kw)

    def fused_cast():
        fused()
        out.copy_(p)

    def one_pass():
        cast_kernel.step_cast(mod, p, g, m, v, out, step=int(step) + 1, **kw)

    ways = [("fused", fused), ("fused+cast", fused_cast)]
    if mod is not None:
        ways.append(("one-pass", one_pass))
    rows = []
    for name, fn in ways:
        fn()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        s = common.median(times)
        rows.append({"way": name, "params": n, "median_s": s, "params_per_s": n / s,
                     "threads": torch.get_num_threads()})
    base = rows[0]["params_per_s"]
    for r in rows:
        r["vs_fused"] = r["params_per_s"] / base
    doc = common.header("adamw-cast")
    doc["runs"] = rows
    doc["kernel_build_s"] = build_s
    doc["thp_mem_alloc"] = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
    try:   # the kernel's THP mode: "[madvise]" needs the env var, "[always]" does not
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            doc["thp_mode"] = f.read().strip()
    except OSError:
        doc["thp_mode"] = None
    doc["kernel_error"] = cast_kernel._built.get("error")
    name = common.out_path(args.out, f"adamw-cast-{common.machine_name()}")
    print(common.write(doc, name))
    print(common.table(rows, ["way", "params", "median_s", "params_per_s", "vs_fused",
                              "threads"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
