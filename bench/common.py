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


def write(doc: dict, name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


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
