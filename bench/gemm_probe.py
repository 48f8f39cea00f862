#!/usr/bin/env python3
"""Where the time of an out-of-core GEMM goes on one GPU: tile/piece variants and a
per-stream timeline of one product.

    PYTHONPATH=src python3 bench/gemm_probe.py        # about 1 min on one H200

First the in-core rate of each tile shape's GEMM (KERNELS). Then for each case of CASES,
each plan variant is timed (median of 3 after a warm-up; with the host's share before the
first copy and after the device is done); then the products of the TRACED variants run
once each under torch.profiler, and the trace is reduced per CUDA stream: busy seconds,
span, the copies' achieved GB/s, and for the stream that runs the GEMMs the idle time
before its first kernel, inside its span and after its last kernel. Writes
bench/results/gemm-probe-<machine>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from gemm import fill_, median_s  # noqa: E402

import outcore.gemm.lone as lone  # noqa: E402
import outcore.gemm.mmacc as mmacc  # noqa: E402
import outcore.gemm.plan as plan_mod  # noqa: E402
import outcore.gemm.loads as loads_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

N = 32768
# Earlier variants (row slabs, 2048-deep 4096 tiles, the flat tiles' first sweep) are in
# git history and their figures in bench/NOTES.md; session 11 keeps the contenders.
# (compute, size, [(label, tile or None for the planner's choice, settings)]): settings
# are module attributes set for that variant only (session 11 also timed mmacc's first GEMM
# as torch.mm: no faster, removed; its no-strips variant ran as fast as the strips)
FIRST_1024, FIRST_512 = ({(plan_mod, "FIRST_PIECE"): d} for d in (1024, 512))
# session 14's next: the last tile in 8 strips of 256 rows (bf16: a shorter tail after the
# last copy in), or in 2 (fp32-16384: fewer, larger strip GEMMs)
STRIPS_8 = {(plan_mod, "MAX_STRIPS"): 8, (plan_mod, "MIN_STRIP"): {"cuda": 256, "cpu": 4}}
STRIPS_2 = {(plan_mod, "MAX_STRIPS"): 2}
# session 16: A's panels whole by rows (the default for bf16 since) against K pieces
NO_A_ROWS = {(lone, "A_ROWS"): ()}
EAGER = {(loads_mod, "LAZY_PIECES"): False}
CASES = [
    ("bf16", N, [("a-rows", None, {}), ("a-pieces", None, NO_A_ROWS)]),
    # session 13: 8192-wide tiles (kernels 52.4 TFLOP/s against 51.0 in 4096-wide ones)
    # wait about 3 ms for their first 2048-deep pieces; plan.FIRST_PIECE cuts that wait
    # session 23: a tile's pieces enqueued as its GEMMs need them (loads.LAZY_PIECES)
    # against all before its first GEMM, and with it smaller first pieces
    ("fp32", 16384, [("auto", None, {}), ("eager", None, EAGER),
                     ("first512", None, FIRST_512), ("first1024", None, FIRST_1024),
                     ("eager-first512", None, {**EAGER, **FIRST_512}),
                     ("piece4096", (4096, 4096, 16384, 4096), {}),
                     ("8192", (8192, 8192, 16384, 2048), {}),
                     ("8192-first1024", (8192, 8192, 16384, 2048), FIRST_1024),
                     ("8192-first512", (8192, 8192, 16384, 2048), FIRST_512),
                     ("8192-strips2", (8192, 8192, 16384, 2048), STRIPS_2),
                     ("rows-4096", (4096, 16384, 16384, 2048), {})]),
    ("fp32", N, [("auto", None, {})]),
    # session 13: C tiles as whole-width row strips, so that B's pieces (full rows of B)
    # and, with whole-K pieces, A's are contiguous copies; B crosses first, then A by strips
    ("bf16", N, [("auto", None, {}), ("4096x16384", (4096, 16384, N, 16384), {}),
                 ("rows-2048-K", (2048, N, N, N), {}), ("rows-4096-K", (4096, N, N, N), {}),
                 ("rows-2048-8k", (2048, N, N, 8192), {}),
                 ("rows-2048-8k-strips8", (2048, N, N, 8192), STRIPS_8)]),
    ("tf32", N, [("auto", None, {}), ("rows-2048-K", (2048, N, N, N), {}),
                 ("rows-2048-8k", (2048, N, N, 8192), {})]),
]
# variants whose product also runs once under the profiler (PROBE_TRACED: a comma list)
TRACED = tuple(os.environ.get("PROBE_TRACED", "auto,rows-2048-K,a-rows,a-pieces").split(","))
# with PROBE_TIMELINE=1, each traced product's whole timeline is kept too, beside the
# results: gemm-probe-<machine>-<case>-<variant>.trace.json.gz (common.trace_timeline)
TIMELINE = os.environ.get("PROBE_TIMELINE") == "1"
# In-core GEMMs of the tiles' shapes (m, n, k) as the workers run them: acc += a @ b
# ("addmm1"), a tile's first GEMM ("addmm0": addmm_ with beta=0; "mm": torch.mm(out=)).
# Session 11's probes (gemm-probe-h200-s11a.json, gemm-probe-h200.json) timed more shapes
# and the three ops (no op faster than another).
# Session 14 adds the pieces' own shapes (K = 2048: how a tile runs while its panels are
# still arriving) and the whole fp32-16384 product, the in-core figure the tiles chase.
KERNELS = ([("fp32", "addmm1", shape) for shape in ((4096, 4096, 16384), (8192, 8192, 16384),
                                                    (8192, 16384, 16384), (4096, 16384, 16384),
                                                    (4096, 4096, 2048), (8192, 8192, 2048),
                                                    (16384, 16384, 16384))]
           + [("bf16", "addmm1", shape) for shape in ((4096, 16384, 32768),
                                                      (2048, 32768, 32768),
                                                      (4096, 32768, 32768))])


def kernel_rates() -> list[dict]:
    """TFLOP/s on the GPU of each KERNELS entry (median of 5)."""
    rows = []
    for compute, op, (m, n, k) in KERNELS:
        dt = torch.bfloat16 if compute == "bf16" else torch.float32
        a = torch.randn(m, k, device="cuda").to(dt)
        b = torch.randn(k, n, device="cuda").to(dt)
        acc = torch.zeros(m, n, device="cuda")
        if op == "mm":
            def fn():
                torch.mm(a, b, out=acc)
        else:
            def fn(beta=1.0 if op == "addmm1" else 0.0):
                mmacc.mm_acc(acc, a, b, 1.0, beta)
        for _ in range(2):
            fn()
        runs = median_s(fn, 5, torch.cuda.synchronize)
        t = statistics.median(runs)
        rows.append({"compute": compute, "op": op, "m": m, "n": n, "k": k, "seconds": t,
                     "tflops": 2.0 * m * n * k / t / 1e12})
        print(f"kernel {compute} {op} {m}x{n}x{k}: {rows[-1]['tflops']:.1f} TFLOP/s",
              flush=True)
    torch.cuda.empty_cache()
    return rows


@contextlib.contextmanager
def applied(settings: dict):
    """A variant's module settings for the enclosed products (restored after; the plan
    cache cleared both ways, as plans are remembered per shape). Session 16's first traces
    ran without them: both were of the default plan."""
    saved = {key: getattr(*key) for key in settings}
    for (mod, name), value in settings.items():
        setattr(mod, name, value)
    plan_mod._cached_search.cache_clear()
    try:
        yield
    finally:
        for (mod, name), value in saved.items():
            setattr(mod, name, value)
        plan_mod._cached_search.cache_clear()


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/gemm_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, help="only the first N entries of CASES")
    ap.add_argument("--no-kernels", action="store_true", help="skip the in-core kernels")
    ap.add_argument("--only", help="only this case of CASES, e.g. fp32-16384")
    ap.add_argument("--out", default=f"gemm-probe-{common.machine_name()}",
                    help="results name under bench/results/")
    args = ap.parse_args()
    doc = common.header("gemm-probe")
    doc["kernels"] = [] if args.no_kernels else kernel_rates()
    bufs = [torch.empty(N * N) for _ in range(3)]
    for b in bufs:
        fill_(b)
    bufs = [pin_(b) for b in bufs]         # pinned once, as in bench/gemm.py
    for compute, n, variants in CASES[:args.first]:
        if args.only and f"{compute}-{n}" != args.only:
            continue
        A, B, C = (b[:n * n].view(n, n) for b in bufs)
        flops = 2.0 * n ** 3
        for label, tile, settings in variants:
            st = []

            def once():
                st.append(matmul(A, B, C, compute=compute, return_stats=True, tile=tile)[1])
            with applied(settings):
                once()   # warm-up: buffers, handles, the copy probe
                runs = median_s(once, 3, lambda: None)   # matmul returns when C is on the host
            t = statistics.median(runs)
            # the host's share of each timed run: before the first copy (ready_s) and
            # after the device was done (wall_s - synced_s)
            phases = [x.phases() for x in st[1:]]
            ready = statistics.median(ph["ready_s"] for ph in phases)
            after = statistics.median(ph["wall_s"] - ph["synced_s"] for ph in phases)
            doc["runs"].append({"case": f"{compute}-{n}", "tile": label, "plan": st[-1].plan,
                                "wall_s": t, "runs_s": runs, "tflops": flops / t / 1e12,
                                "phases": phases, "host_before_s": ready,
                                "host_after_s": after})
            print(f"{compute}-{n} {label}: {t * 1e3:.0f} ms  {flops / t / 1e12:.1f} "
                  f"TFLOP/s  host before {ready * 1e3:.2f} ms, after {after * 1e3:.2f} ms  "
                  f"[{st[-1].plan}]", flush=True)
        from torch.profiler import ProfilerActivity, profile
        for label, tile, settings in variants:
            if label not in TRACED:
                continue
            with applied(settings), profile(activities=[ProfilerActivity.CPU,
                                                        ProfilerActivity.CUDA]) as prof:
                matmul(A, B, C, compute=compute, tile=tile)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trace.json")
                prof.export_chrome_trace(path)
                tl = common.trace_streams(path)
                if TIMELINE:
                    common.trace_timeline(path, common.RESULTS / (
                        f"{args.out}-{compute}-{n}-{label}.trace.json.gz"))
            doc["runs"].append({"case": f"{compute}-{n}", "tile": label, "timeline": tl})
            print(f"timeline {compute}-{n} {label}:", json.dumps(tl, indent=1, default=str),
                  flush=True)
        common.write(doc, args.out)
    print(common.table(doc["kernels"], ["compute", "op", "m", "n", "k", "tflops"]))
    print(common.table([r for r in doc["runs"] if "tflops" in r],
                       ["case", "tile", "tflops", "wall_s", "host_before_s", "host_after_s",
                        "plan"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
