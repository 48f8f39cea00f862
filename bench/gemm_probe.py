#!/usr/bin/env python3
"""Where the time of an out-of-core GEMM goes on one GPU: tile/piece variants and a
per-stream timeline of one product.

    PYTHONPATH=src python3 bench/gemm_probe.py        # about 1 min on one H200

First the in-core rate of each tile shape's GEMM (KERNELS). Then for tf32 and bf16 at
32768 (and fp32 at 16384), each plan variant is timed (median of 3
after a warm-up); then the default plan's product runs once under torch.profiler, and the
trace is reduced per CUDA stream: busy seconds, span, the copies' achieved GB/s, and for
the stream that runs the GEMMs the idle time before its first kernel, inside its span and
after its last kernel. Writes bench/results/gemm-probe-<machine>.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from gemm import fill_, median_s  # noqa: E402

import outcore.gemm.plan as plan_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

N = 32768
# Earlier variants (row slabs, 2048-deep 4096 tiles, the flat tiles' first sweep) are in
# git history and their figures in bench/NOTES.md; session 11 keeps the contenders.
CASES = [  # (compute, size, tile variants; None = the planner's choice; "no-strips": the
           # planner's choice with the last tile whole)
    ("tf32", N, [None, "no-strips", (8192, 8192, N, 8192), (4096, 16384, N, 16384)]),
    ("bf16", N, [None, "no-strips", (8192, 8192, N, 8192), (4096, 16384, N, 16384),
                 (2048, 8192, N, 8192), (4096, 16384, N, 8192)]),
    ("fp32", 16384, [None, "no-strips", (4096, 4096, 16384, 4096), (8192, 8192, 16384, 2048),
                     (8192, 8192, 16384, 1024), (8192, 8192, 16384, 4096)]),
]
# In-core GEMMs of the tiles' shapes (m, n, k), accumulated into C as the workers do: how
# fast the kernels of each tile shape run with nothing else on the GPU (fp32 at 16384
# spends 173 of its 178 ms in GEMM kernels, against 163 ms for the whole product in-core)
KERNELS = {
    "fp32": [(4096, 4096, 2048), (4096, 4096, 16384), (8192, 8192, 2048), (8192, 8192, 16384),
             (4096, 16384, 16384), (16384, 4096, 16384), (2048, 16384, 16384),
             (16384, 16384, 1024), (16384, 16384, 2048), (16384, 16384, 16384)],
    "bf16": [(4096, 4096, 8192), (8192, 8192, 8192), (8192, 8192, 32768),
             (2048, 8192, 32768), (4096, 16384, 32768), (2048, 32768, 4096),
             (32768, 32768, 32768)],
}


def kernel_rates() -> list[dict]:
    """TFLOP/s of acc += a @ b on the GPU for each shape of KERNELS (median of 5)."""
    from outcore.gemm.mmacc import mm_acc
    rows = []
    for compute, shapes in KERNELS.items():
        dt = torch.bfloat16 if compute == "bf16" else torch.float32
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda").to(dt)
            b = torch.randn(k, n, device="cuda").to(dt)
            acc = torch.zeros(m, n, device="cuda")
            for _ in range(2):
                mm_acc(acc, a, b, 1.0, 1.0)
            runs = median_s(lambda: mm_acc(acc, a, b, 1.0, 1.0), 5, torch.cuda.synchronize)
            t = statistics.median(runs)
            rows.append({"compute": compute, "m": m, "n": n, "k": k, "seconds": t,
                         "tflops": 2.0 * m * n * k / t / 1e12})
            print(f"kernel {compute} {m}x{n}x{k}: {rows[-1]['tflops']:.1f} TFLOP/s", flush=True)
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/gemm_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("gemm-probe")
    doc["kernels"] = kernel_rates()
    bufs = [torch.empty(N * N) for _ in range(3)]
    for b in bufs:
        fill_(b)
    bufs = [pin_(b) for b in bufs]         # pinned once, as in bench/gemm.py
    for compute, n, tiles in CASES:
        A, B, C = (b[:n * n].view(n, n) for b in bufs)
        flops = 2.0 * n ** 3
        for tile in tiles:
            st = []
            strips = plan_mod.MAX_STRIPS
            if tile == "no-strips":
                plan_mod.MAX_STRIPS = 1
                plan_mod._cached_search.cache_clear()   # plans are remembered per shape

            def once():
                st.append(matmul(A, B, C, compute=compute, return_stats=True,
                                 tile=None if tile == "no-strips" else tile)[1])
            once()   # warm-up: buffers, handles, the copy probe
            runs = median_s(once, 3, lambda: None)   # matmul returns when C is on the host
            plan_mod.MAX_STRIPS = strips
            plan_mod._cached_search.cache_clear()
            t = statistics.median(runs)
            doc["runs"].append({"case": f"{compute}-{n}", "tile": tile or "auto",
                                "plan": st[-1].plan, "wall_s": t, "runs_s": runs,
                                "tflops": flops / t / 1e12})
            print(f"{compute}-{n} {tile or 'auto'}: {t * 1e3:.0f} ms  {flops / t / 1e12:.1f} "
                  f"TFLOP/s  [{st[-1].plan}]", flush=True)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            matmul(A, B, C, compute=compute)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            tl = common.trace_streams(path)
        doc["runs"].append({"case": f"{compute}-{n}", "tile": "auto", "timeline": tl})
        print(json.dumps(tl, indent=1, default=str), flush=True)
        common.write(doc, f"gemm-probe-{common.machine_name()}")
    print(common.table(doc["kernels"], ["compute", "m", "n", "k", "tflops"]))
    print(common.table([r for r in doc["runs"] if "tflops" in r],
                       ["case", "tile", "tflops", "wall_s", "plan"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
