"""bench/stream.py's record keeping: profiles, the plot, parts of a results file, the GPU
tests' summary. Split out of stream.py, which keeps the cases and the systems' workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import common

def profile_steps(step, name: str, n: int = 2) -> None:
    """Two steps under torch.profiler: the kernels that take the device's time, and how
    much of the wall time the device was busy, written to results/stream-profile-NAME.txt."""
    try:
        _profile(step, name, n)
    except Exception as e:  # the profile is an extra: never lose the run's figures to it
        print(f"  profile failed: {type(e).__name__}: {e}", flush=True)


def _profile(step, name: str, n: int) -> None:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6  # microseconds -> s
    table = events.table(sort_by="self_device_time_total", row_limit=30)
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        prof.export_chrome_trace(trace)
        events = common.trace_events(trace)   # parsed once (hundreds of MB at 3B)
        streams = common.trace_streams(events, top_gaps=12)
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        n_rows = common.trace_timeline(events, common.RESULTS
                                       / f"stream-timeline-{name}.json.gz")
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    path = common.RESULTS / f"stream-profile-{name}.txt"
    path.write_text(f"{n} steps, wall {wall:.3f} s, device kernels {busy:.3f} s "
                    f"(sum over streams; copies included)\n\n{table}\n\nper stream, and "
                    f"the longest gaps of the busiest one:\n"
                    f"{json.dumps(streams, indent=1, default=str)}\n")
    print(f"  profile: {path.name}: wall {wall:.3f} s, device {busy:.3f} s; timeline "
          f"stream-timeline-{name}.json.gz ({n_rows} rows)", flush=True)


def plot(doc: dict, path, cases_known) -> None:
    """Model TFLOP/s per system for the rows of `cases_known` (bench/stream.py CASES)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # said, not silent: a results file merged without it keeps an older plot beside it
        print(f"matplotlib is not installed: {path} was not redrawn "
              "(pip install matplotlib, then run the merge again)", file=sys.stderr)
        return
    cases = list(dict.fromkeys(r["case"] for r in doc["runs"] if r["case"] in cases_known))
    systems = ["outcore", "pytorch", "fsdp2"]
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.27
    for j, s in enumerate(systems):
        ys = [next((r.get("model_tflops") or 0 for r in doc["runs"]
                    if r["case"] == c and r["system"] == s), 0) for c in cases]
        ax.bar([i + (j - 1) * w for i in range(len(cases))], ys, w, label=s)
    ax.set_xticks(range(len(cases)), cases)
    ax.set_ylabel("model TFLOP/s (6 x params x tokens / step)")
    ax.set_title(f"stream, {doc['machine']}, torch {doc['torch']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def appended(doc: dict, name: str) -> dict:
    """--append: the existing results file NAME with this invocation as one more part.

    One command may run at most 10 minutes on the lent GPU machines and every case with
    every system takes longer, so the file is filled by several commands. Each part keeps
    its own command, commit and date, and each row says which part measured it; the
    systems of one case always run in the same part."""
    path = common.RESULTS / f"{name}.json" if os.sep not in name else Path(name)
    if not path.exists():
        # a fresh file would pass for the whole run: say so instead (the GPU machine's
        # tree holds only what was copied to it; bench/merge_parts.py joins files later)
        raise SystemExit(f"--append: {path} does not exist; run the first part without "
                         "--append, or copy its file into the tree first")
    return common.join_parts(json.loads(path.read_text()), doc)


def part_of(doc: dict) -> dict:
    """{'part': index of this invocation in doc['parts']} for an appended file, else {}."""
    return {"part": len(doc["parts"]) - 1} if "parts" in doc else {}


def gpu_tests() -> dict:
    """Runs tests/stream/test_gpu.py (fp32 numerics against plain PyTorch, the budget) in a
    subprocess first, so every results file says whether the engine was correct on this GPU."""
    t = time.time()
    p = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                        str(common.ROOT / "tests" / "stream" / "test_gpu.py")],
                       capture_output=True, text=True, cwd=common.ROOT)
    tail = (p.stdout + p.stderr).strip().splitlines()
    summary = next((l for l in reversed(tail) if " passed" in l or " failed" in l
                    or " skipped" in l or " error" in l), tail[-1] if tail else "")
    print(f"== gpu tests: {summary}", flush=True)
    if p.returncode != 0:
        sys.stdout.write("\n".join(tail[-30:]) + "\n")
    return {"module": "tests/stream/test_gpu.py", "returncode": p.returncode,
            "summary": summary.strip("= "), "wall_s": round(time.time() - t, 1)}
