#!/usr/bin/env python3
"""The CPU AdamW's rate with and without the bf16 copy of the weights (host_weight_copy).

    PYTHONPATH=src python3 bench/adamw_cast.py               # 200M params; ~1 min on 16 cores
    PYTHONPATH=src python3 bench/adamw_cast.py --params 20e6 # smaller

Three ways to update one flat group of fp32 params on the host, every core at work:
  fused       torch's fused AdamW (what the engine runs without copies)
  fused+cast  the same, then the cast to a bf16 copy (host_weight_copy=True)
  one-pass    stream/cast_kernel.py: the update writes the copy as it goes
                 (host_weight_copy="fused")
  one-pass-nt the same, the copy written by non-temporal stores (cast_kernel.STREAM_STORES)
  halves      the weights held as their bf16 and a 16-bit remainder (stream/halves.py, a
                 prototype the engine does not use): 4 B/param of weights read and
                 written, where one-pass reads 4 and writes 6
--copies runs every way a second time while a thread keeps pinned copies of 1 GiB going
to and from the GPU on two streams, as the engine's copies share host memory with its
CPU AdamW (those rows are named "<way>+copies" and record the copies' GB/s meanwhile).
Median of --reps timed runs after one warm-up each, in G params/s. Writes
bench/results/adamw-cast-<machine>.json (the rates, the kernel's build time) and prints a
table. No GPU is used: on a GPU machine it measures that machine's host.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

# --thp: torch's CPU allocations of 2 MiB and more on transparent huge pages. libc10 reads
# THP_MEM_ALLOC_ENABLE when it loads, so the script starts itself again with it set.
if "--thp" in sys.argv and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, THP_MEM_ALLOC_ENABLE="1"))

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from outcore.calibration import median_s  # noqa: E402
from outcore.stream import cast_kernel, halves  # noqa: E402
from outcore.stream.optimizer import _adamw  # noqa: E402


def time_way(name: str, fn, n: int, reps: int) -> dict:
    """Median of `reps` timed calls of fn after one untimed."""
    s = median_s(fn, reps)
    return {"way": name, "params": n, "median_s": s, "params_per_s": n / s,
            "threads": torch.get_num_threads()}


class Copies:
    """A thread copying 1 GiB pinned buffers host->GPU and GPU->host on two streams, on
    and on, until the `with` block ends; rate(): GB/s both ways since the last call."""

    def __init__(self, nbytes: int = 1 << 30):
        self.h = [torch.empty(nbytes, dtype=torch.uint8).pin_memory() for _ in range(2)]
        self.d = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.streams = [torch.cuda.Stream() for _ in range(2)]
        self.moved, self.stop, self.since = 0, False, time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop:
            with torch.cuda.stream(self.streams[0]):
                self.d[0].copy_(self.h[0], non_blocking=True)
            with torch.cuda.stream(self.streams[1]):
                self.h[1].copy_(self.d[1], non_blocking=True)
            # host sync: one pair of copies in flight at a time, so `moved` counts bytes
            # that crossed, not bytes queued
            torch.cuda.synchronize()
            self.moved += 2 * self.h[0].numel()

    def rate(self) -> float:
        now, moved = time.perf_counter(), self.moved
        self.moved, self.since, dt = 0, now, now - self.since
        return moved / dt / 1e9

    def __enter__(self):
        self.thread.start()
        time.sleep(0.5)   # the copies under way before the first timed pass
        self.rate()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=200e6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="results name or path (default: "
                    "adamw-cast-<machine>)")
    ap.add_argument("--copies", action="store_true", help="also time each way beside "
                    "host<->GPU copies both ways (needs CUDA)")
    ap.add_argument("--bf16-grad", action="store_true", help="bf16 gradients, as the engine "
                    "lands them on the host (default fp32, as in sessions 8-32's runs)")
    ap.add_argument("--thp", action="store_true", help="torch's buffers on transparent huge "
                    "pages (THP_MEM_ALLOC_ENABLE=1)")
    args = ap.parse_args()
    n = int(args.params)
    t = time.perf_counter()
    mod = cast_kernel.load()
    build_s = time.perf_counter() - t
    gen = torch.Generator().manual_seed(0)
    p, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3
    if args.bf16_grad:
        g = g.to(torch.bfloat16)
    hi, r = halves.split(p)
    m, v, out = torch.zeros(n), torch.zeros(n), torch.empty(n, dtype=torch.bfloat16)
    step = torch.zeros(())
    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    # torch's fused AdamW takes the gradient in the weights' dtype: converted once here, so
    # its rows time the AdamW alone (session 35's file converted it in every timed call)
    g32 = g.float() if args.bf16_grad else g

    def fused():
        _adamw([p], [g32], [m], [v], [step], fused=True, **kw)

    def fused_cast():
        fused()
        out.copy_(p)

    def one_pass(stream: bool = False):
        cast_kernel.step_cast(mod, p, g, m, v, out, step=int(step) + 1, stream=stream, **kw)

    ways = [("fused", fused), ("fused+cast", fused_cast)]
    if mod is not None:
        ways += [("one-pass", one_pass), ("one-pass-nt", lambda: one_pass(True)),
                 ("halves", lambda: cast_kernel.step_halves(mod, hi, r, g, m, v,
                                                            step=int(step) + 1, **kw))]
    rows = [time_way(name, fn, n, args.reps) for name, fn in ways]
    if args.copies:
        with Copies() as c:
            rows += [dict(time_way(name + "+copies", fn, n, args.reps), copies_gbps=c.rate())
                     for name, fn in ways]
    for r in rows:
        base = rows[0 if "+copies" not in r["way"] else len(ways)]["params_per_s"]
        r["vs_fused"] = r["params_per_s"] / base
    doc = common.header("adamw-cast")
    doc["runs"] = rows
    doc["kernel_build_s"] = build_s
    doc["grad_dtype"] = str(g.dtype).replace("torch.", "")
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
                              "threads", "copies_gbps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
