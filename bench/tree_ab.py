#!/usr/bin/env python3
"""One bench/stream.py case (or bench/swap.py's ResNet-152 rows) at two source trees,
alternated (ABBA), with a table last.

    tar -xf build/src-old.tar -C old     # the old commit's src, bench/*.py and bench/diag
    OUTCORE_COMMIT=<new sha> PYTHONPATH=src python3 bench/tree_ab.py --old-dir old \
        --old-commit <old sha> --tag s43 --out-dir $OUT

Runs bench/stream.py (outcore alone, compiled, no largest row, no GPU tests) in the old
tree, this tree, this tree, the old tree, each its own process and results file
(stream-h200-ab-<tag>-{old,new}{1,2}.json in each tree's bench/results, copied to
--out-dir with each run's log), then prints every run's median step and time split. The
order cancels a drift of the machine over the call; two runs a tree show the spread.
Give each run room for its setup, not only its steps: a 7b-16k run took 194 s in all in
session 46 (its 11 steps about 50 s; the rest building the model, the engine's host state
and pinning, with the eager build of that time), and runs given 100 and 170 s were
stopped before their first step. The first process on a fresh machine also compiles the
model's kernels with an empty cache (session 45's first 7b-16k run made no step in 200
s): run another case first, or give the first run more.
With --bench swap each run is `bench/swap.py --no-wide` (swap-h200-ab-<tag>-*.json): the
ResNet-152 max batch and throughput rows of each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(tree: Path, commit: str, name: str, args, out_dir: Path) -> dict | list | None:
    """One run in `tree`: stream's outcore row, or every row of swap's (None: no file)."""
    if args.bench == "swap":
        cmd = [sys.executable, "bench/swap.py", "--no-wide", "--budget-s", str(args.timeout),
               "--out", name]
    else:
        cmd = [sys.executable, "bench/stream.py", "--cases", args.case, "--systems",
               "outcore", "--compiled", "--largest", "0", "--skip-tests", "--timeout",
               str(args.timeout), "--steps", str(args.steps), "--out", name]
    env = dict(os.environ, OUTCORE_COMMIT=commit, PYTHONPATH="src", PYTHONUNBUFFERED="1")
    log = out_dir / f"{name}.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=args.timeout + 60).returncode
    result = tree / "bench" / "results" / f"{name}.json"
    print(f"{name}: rc {rc}", flush=True)
    if not result.exists():
        return None
    if not (out_dir / result.name).exists() or not result.samefile(out_dir / result.name):
        shutil.copy(result, out_dir / result.name)   # the new tree's results may be out_dir
    runs = json.loads(result.read_text())["runs"]
    if args.bench == "swap":
        return runs
    rows = [r for r in runs if r.get("system") == "outcore"]
    return rows[0] if rows else None


def _swap_table(rows) -> None:
    """Each run's max batches and images/s (an error row: its first words)."""
    print(f"\n{'run':5} {'commit':8} {'case':28} {'system':12} {'batch':>6} {'img/s':>8}")
    for label, commit, runs in rows:
        for r in runs or [{"case": "no result"}]:
            val = (f"{r['images_per_s']:8.1f}" if "images_per_s" in r else
                   f"{r['max_batch']:>8}" if "max_batch" in r else
                   str(r.get("error", ""))[:40])
            print(f"{label:5} {commit:8} {r.get('case', ''):28} {r.get('system', ''):12} "
                  f"{r.get('batch', ''):>6} {val}")


def _stream_table(rows) -> None:
    """Each run's median step, mean over its measured steps and time split."""
    print(f"\n{'run':5} {'commit':8} {'step_s':>7} {'mean_s':>7} {'compute':>8} "
          f"{'copy_w':>7} {'opt_w':>7} {'dev_params':>11} {'peak_gb':>8}")
    for label, commit, r in rows:
        if r is None or "step_s" not in r:   # no file, or an error row (a timeout)
            print(f"{label:5} {commit:8} {'no result' if r is None else r.get('error')}")
            continue
        steps = [s["step_s"] for s in r.get("steps", [])]   # the measured steps only
        mean = sum(steps) / len(steps) if steps else float("nan")
        print(f"{label:5} {commit:8} {r['step_s']:7.3f} {mean:7.3f} {r['compute_s']:8.3f} "
              f"{r['copy_wait_s']:7.3f} {r['optimizer_wait_s']:7.3f} "
              f"{r['device_updated_params'] / 1e9:10.2f}B {r['peak_gpu_gb']:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-dir", required=True, help="the old tree (src, bench)")
    ap.add_argument("--old-commit", required=True)
    ap.add_argument("--bench", default="stream", choices=["stream", "swap"])
    ap.add_argument("--case", default="3b-16k")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=185, help="seconds per run's case (the "
                    "first process on a fresh machine took over 120 s in session 43)")
    ap.add_argument("--order", default="old1,new1,new2,old2", help="runs in order: old<N> "
                    "or new<N>")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    new_commit = os.environ.get("OUTCORE_COMMIT", "unknown")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trees = {"old": (Path(args.old_dir).resolve(), args.old_commit),
             "new": (HERE.parent, new_commit)}
    rows = []
    for label in args.order.split(","):
        tree, commit = trees[label[:3]]
        row = _run(tree, commit, f"{args.bench}-h200-ab-{args.tag}-{label}", args, out_dir)
        rows.append((label, commit[:7], row))
    if args.bench == "swap":
        _swap_table(rows)
        return
    _stream_table(rows)


if __name__ == "__main__":
    main()
