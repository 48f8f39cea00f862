"""Where a bench case's product spends its time on one GPU: its runs timed, then one run
traced per CUDA stream, with the link's use in each direction over time. (GPU)

    PYTHONPATH=src python3 bench/diag/gemm_trace.py train-NT-t16384-f8192-bf16 ...

Any case of bench/gemm.py by name (host matrices fp32 and pinned, as there). For each: the
median of 5 runs after a warm-up, then one run under torch.profiler, reduced by
common.trace_streams, its whole timeline kept beside the results
(gemm-trace-<machine>-<case>.trace.json.gz), and the link's busy share each way in tenths
of the product's span (h2d and d2h copies' time on their streams). Writes
bench/results/gemm-trace-<machine>.json and prints a table last.

GEMM_TRACE_TILE=ROWS,COLS[,...] forces outcore's tiles (matmul(tile=));
GEMM_TRACE_COMPUTE=C runs every case with matmul(compute=C); GEMM_TRACE_TAG=T
names the files gemm-trace-<machine>-T.json and ...-T-<case>.trace.json.gz instead.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import common  # noqa: E402
from gemm import fill_, median_s, square_cases, train_cases  # noqa: E402

from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

TENTHS = 10
TILE = os.environ.get("GEMM_TRACE_TILE")
TAG = os.environ.get("GEMM_TRACE_TAG")
COMPUTE = os.environ.get("GEMM_TRACE_COMPUTE")   # overrides the cases' arithmetic


def link_use(rows: list, span_us: float) -> dict:
    """Busy share of each copy direction in each tenth of the span (from a timeline's rows:
    [stream, start_us, dur_us, cat, name, bytes])."""
    out = {}
    for way, tag in (("h2d", "HtoD"), ("d2h", "DtoH")):
        busy = [0.0] * TENTHS
        for r in rows:
            if r[3] != "gpu_memcpy" or tag not in r[4]:
                continue
            a, b = r[1], r[1] + r[2]
            for i in range(TENTHS):
                lo, hi = span_us * i / TENTHS, span_us * (i + 1) / TENTHS
                busy[i] += max(0.0, min(b, hi) - max(a, lo))
        out[way] = [round(x / (span_us / TENTHS), 2) for x in busy]
    return out


def main() -> int:
    if not torch.cuda.is_available() or len(sys.argv) < 2:
        print("usage (GPU): gemm_trace.py CASE [CASE ...]  (bench/gemm.py's case names)")
        return 2
    cases = {c.name: c for c in square_cases(False) + train_cases(False)}
    picked = [cases[n] for n in sys.argv[1:]]
    numel = max(max(c.m * c.k, c.k * c.n, c.m * c.n) for c in picked)
    bufs = [torch.empty(numel) for _ in range(3)]
    for b in bufs:
        fill_(b)
    bufs = [pin_(b) for b in bufs]
    doc = common.header("gemm-trace")
    name = common.machine_name() + (f"-{TAG}" if TAG else "")
    from torch.profiler import ProfilerActivity, profile
    for c in picked:
        sa = (c.k, c.m) if c.transa else (c.m, c.k)
        sb = (c.n, c.k) if c.transb else (c.k, c.n)
        A, B, C = (b[:s[0] * s[1]].view(s) for b, s in zip(bufs, (sa, sb, (c.m, c.n))))
        kw = dict(transa=c.transa, transb=c.transb, compute=COMPUTE or c.compute, devices=0,
                  return_stats=True,
                  tile=tuple(int(x) for x in TILE.split(",")) if TILE else None)
        st = [matmul(A, B, C, **kw)[1]]                 # warm-up: buffers, handles, plan
        runs = median_s(lambda: st.append(matmul(A, B, C, **kw)[1]), 5, lambda: None)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            matmul(A, B, C, **kw)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            streams = common.trace_streams(path)
            out = common.RESULTS / f"gemm-trace-{name}-{c.name}.trace.json.gz"
            common.trace_timeline(path, out)
        with gzip.open(out, "rt") as f:
            rows = [r for r in json.load(f)["rows"] if r[0] != -1]
        span = max(r[1] + r[2] for r in rows)
        ph = [x.phases() for x in st[1:]]
        doc["runs"].append({"case": c.name, "plan": st[-1].plan, "runs_s": runs,
                            "wall_s": statistics.median(runs),
                            "tflops": c.flops / statistics.median(runs) / 1e12,
                            "ready_s": statistics.median(p["ready_s"] for p in ph),
                            "after_s": statistics.median(p["wall_s"] - p["synced_s"]
                                                         for p in ph),
                            "streams": streams, "link_use": link_use(rows, span),
                            "h2d_bytes": st[-1].h2d_bytes, "d2h_bytes": st[-1].d2h_bytes})
        r = doc["runs"][-1]
        print(f"{c.name}: {r['wall_s'] * 1e3:.1f} ms, {r['tflops']:.1f} TFLOP/s "
              f"[{r['plan']}]\n  h2d use by tenths {r['link_use']['h2d']}\n"
              f"  d2h use by tenths {r['link_use']['d2h']}", flush=True)
    path = common.write(doc, f"gemm-trace-{name}")
    print(common.table(doc["runs"], ["case", "wall_s", "tflops", "ready_s", "after_s"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
