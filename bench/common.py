"""Shared by the bench scripts: results file in DESIGN.md's format, timing, machine facts."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def git_commit() -> str:
    """HEAD of the tree; where the tree has no .git (the GPU machine's copy), the
    OUTCORE_COMMIT environment variable the run was given, else "unknown"."""
    if os.environ.get("OUTCORE_COMMIT"):
        return os.environ["OUTCORE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT,
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_name() -> str:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    base = "h200" if "h200" in name else name.replace("nvidia ", "").replace(" ", "-")
    return base if n == 1 else f"{base}x{n}"


def header(benchmark: str) -> dict:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {"benchmark": benchmark, "command": " ".join(["python3"] + sys.argv),
            "commit": git_commit(), "machine": f"nvidia-{machine_name()}" if gpus else "cpu",
            "gpus": gpus, "torch": torch.__version__,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host_cpus": os.cpu_count(), "runs": []}


# cases_kept, systems_kept: set where bench/merge_parts.py took only some cases' or
# systems' rows of that part
PART_KEYS = ("command", "commit", "date", "gpus", "torch", "gpu_tests", "cases_kept",
             "systems_kept")


def join_parts(old: dict, new: dict) -> dict:
    """`old` (a results document, maybe already in parts) with `new`'s header as one more
    part; the top-level command, commit, date and torch become the newest part's. The
    caller tags `new`'s rows with their part index (len(parts) - 1)."""
    parts = old.get("parts") or [{k: old.get(k) for k in PART_KEYS}]
    old["parts"] = parts + [{k: new.get(k) for k in PART_KEYS}]
    for k in ("command", "commit", "date", "torch"):
        old[k] = new[k]
    return old


def write(doc: dict, name: str) -> Path:
    """bench/results/NAME.json, or NAME itself when it is a path (a temporary name, then a
    rename: a reader never sees half a file)."""
    path = Path(name) if os.sep in name else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


def out_path(arg: str | None, default: str) -> str:
    """A bench's --out: a bare name (no directory) is bench/results/<name>.json, as
    stream.py and parallel.py take it; anything else is the path itself; None: default."""
    if not arg:
        return default
    if os.sep not in arg:
        return str(RESULTS / (arg.removesuffix(".json") + ".json"))
    return arg


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def table(rows: list[dict], cols: list[str]) -> str:
    """A fixed-width text table of `cols` for each row (missing -> '-')."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "-" if v is None else str(v)[:40]
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    w = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols))]
    lines += ["  ".join(x[i].ljust(w[i]) for i in range(len(cols))) for x in cells]
    return "\n".join(lines)


# ---- a profiler trace, reduced per CUDA stream -----------------------------------------
def trace_events(trace_path: str) -> list[dict]:
    """The events of a chrome trace (torch.profiler's export_chrome_trace)."""
    with open(trace_path) as f:
        return json.load(f)["traceEvents"]


def trace_streams(trace, top_gaps: int = 8) -> dict:
    """Per-stream busy time, span and copy rate from a chrome trace (a path, or its
    trace_events), and the `top_gaps` longest idle gaps of the stream that ran the most
    kernel time: where they start (s from the trace's first device op) and which kernels
    they sit between."""
    ev = trace_events(trace) if isinstance(trace, str) else trace
    per: dict = {}
    for e in ev:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args", {})
        s = per.setdefault(str(args.get("stream")), {"iv": [], "bytes": 0, "kinds": set()})
        s["iv"].append((e["ts"], e["ts"] + e["dur"], e.get("name", "")[:60]))
        s["kinds"].add(e["cat"])
        s["bytes"] += int(args.get("bytes", 0) or 0)
    if not per:
        return {}
    t0 = min(a for s in per.values() for a, _, _ in s["iv"])
    t1 = max(b for s in per.values() for _, b, _ in s["iv"])
    out: dict = {"span_s": (t1 - t0) / 1e6}
    busiest, most = None, -1.0
    for sid, s in per.items():
        iv = sorted(s["iv"])
        busy = sum(b - a for a, b, _ in iv)
        row = {"kinds": sorted(s["kinds"]), "ops": len(iv), "busy_s": busy / 1e6,
               "first_s": (iv[0][0] - t0) / 1e6, "idle_after_s": (t1 - iv[-1][1]) / 1e6,
               "gaps_s": (iv[-1][1] - iv[0][0] - busy) / 1e6}
        if s["bytes"]:
            row["gb"] = s["bytes"] / 1e9
            row["gbps_while_busy"] = s["bytes"] / (busy / 1e6) / 1e9 if busy else None
        out[f"stream {sid}"] = row
        if "kernel" in s["kinds"] and busy > most:
            busiest, most = iv, busy
    if busiest:
        gaps = sorted(((b[0] - a[1], a, b) for a, b in zip(busiest, busiest[1:])),
                      reverse=True)[:top_gaps]
        host = [(e["ts"], e["ts"] + e["dur"], e.get("cat"), e.get("name", "")[:60]) for e in ev
                if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cuda_runtime")]
        out["longest_gaps"] = [{"gap_ms": g / 1e3, "at_s": (a[1] - t0) / 1e6,
                                "after": a[2], "before": b[2],
                                "host": _host_during(host, a[1], b[0])}
                               for g, a, b in gaps if g > 0]
    return out


def trace_timeline(trace, out_path) -> int:
    """A compact copy of a chrome trace for reading offline (the whole trace of two 3B
    steps is too large to bring back): every device op (kernel, copy, memset, and the
    engine's record_function phases as the device saw them) as [stream, start_us, dur_us,
    cat, name, bytes]; the phases on the host and every runtime call of 0.1 ms or more as
    [-1, start_us, dur_us, cat, name, 0]; times from the first device op. Gzipped JSON;
    returns the number of rows. trace: a path, or its trace_events."""
    import gzip
    ev = trace_events(trace) if isinstance(trace, str) else trace
    dev, host = [], []
    for e in ev:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args", {})
        if cat in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            dev.append([int(args.get("stream", 0) or 0), e["ts"], e["dur"], cat,
                        e.get("name", "")[:48], int(args.get("bytes", 0) or 0)])
        elif cat == "user_annotation" or (cat == "cuda_runtime" and e["dur"] >= 100):
            host.append([-1, e["ts"], e["dur"], cat, e.get("name", "")[:48], 0])
    if not any(r[3] != "gpu_user_annotation" for r in dev):
        return 0
    t0 = min(r[1] for r in dev if r[3] != "gpu_user_annotation")
    rows = sorted(dev + host, key=lambda r: r[1])
    for r in rows:
        r[1] = round(r[1] - t0, 1)
        r[2] = round(r[2], 1)
    with gzip.open(out_path, "wt") as f:
        json.dump({"columns": ["stream", "start_us", "dur_us", "cat", "name", "bytes"],
                   "rows": rows}, f)
    return len(rows)


def _host_during(host: list, t0: float, t1: float) -> list[str]:
    """What the host was in while the device idled from t0 to t1: the annotations (engine
    phases) open at t0, and runtime calls longer than 0.2 ms overlapping the gap."""
    names = [f"{n}" for a, b, c, n in host if c == "user_annotation" and a <= t0 < b]
    names += [f"{n} {(min(b, t1) - max(a, t0)) / 1e3:.1f} ms" for a, b, c, n in host
              if c == "cuda_runtime" and b - a > 200 and a < t1 and b > t0]
    return names[:8]


# ---- a co-running process that takes part of one GPU (never GPU settings) -------------
HOG = r"""
import select, sys, torch
dev = torch.device(sys.argv[1]); n = int(sys.argv[2]); torch.set_num_threads(1)
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
b = torch.randn_like(a)
for _ in range(3): a @ b
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    for _ in range(8): c = a @ b
    if dev.type == "cuda": torch.cuda.synchronize(dev)  # host sync: short queue, prompt stop
"""


class Hog:
    """Another process running matmuls nonstop on one device (it takes part of its time)."""

    def __init__(self, device: torch.device, smoke: bool):
        self.cmd = [sys.executable, "-c", HOG, str(device), "256" if smoke else "8192"]

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the co-running matmul process did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.write("stop\n")   # it polls stdin between batches of matmuls
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()      # our own child, by its handle
            self.proc.wait()
