"""`outcore plan`'s predicted step against measured steps on the same machine. (GPU)

    OUTCORE_COMMIT=<sha> PYTHONPATH=src python3 bench/plan_gpu.py [--measure 3b-16k,train-1b]

For each case, `outcore plan` as a user runs it with the run's settings (the bench's: no
clipping, 16-bit host copies, compiled kernels, a 14.5 GiB budget; the trainer's: its
defaults), then, for the cases in --measure, the run itself: `bench/stream.py --systems
outcore` for the bench cases (median and mean step of its measured steps), `outcore train
--max-steps 20` for train-1b (its summary's tokens/s, the median step). About 1 minute a
plan, 1-2 a measured bench case. Writes bench/results/plan-<machine>.json (each command's
output in plan-<machine>.log), a table last.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

import common
from cli_gpu import CLI, run

BENCH = ["--no-clip", "--host-weight-copy", "--compile-kernels", "--gpu-memory", "14.5GiB",
         "--seq-len", "2048"]
CASES = {   # name: (plan arguments, how to measure it)
    "1b-16k": (["--model", "1b", "--tokens-per-step", "16384", *BENCH], "stream"),
    "3b-16k": (["--model", "3b", "--tokens-per-step", "16384", *BENCH], "stream"),
    "7b-16k": (["--model", "7b", "--tokens-per-step", "16384", *BENCH], "stream"),
    "3b-64k": (["--model", "3b", "--tokens-per-step", "65536", *BENCH], "stream"),
}
# `outcore train`'s defaults (train-1b, train-3b): 16 x 256 tokens a step, clipping (held
# updates, every AdamW on the CPU after backward)
TRAIN_ARGS: dict[str, list[str]] = {}
TRAIN_PLAN = ["--tokens-per-step", "4096", "--seq-len", "256", "--compile-kernels"]
for _m in ("1b", "3b"):
    # the same without clipping: updates start block by block (the streamed step's model);
    # and with clipping, blocks updated on the GPU by their next load (deferred.py)
    for _v, _plan, _train in (("", [], []),
                              ("-noclip", ["--no-clip"], ["--max-grad-norm", "0",
                                                          "--no-skip-nonfinite"]),
                              ("-held", ["--held-gpu-updates", "auto"],
                               ["--held-gpu-updates", "auto"])):
        CASES[f"train-{_m}{_v}"] = (["--model", _m, *TRAIN_PLAN, *_plan], "train")
        TRAIN_ARGS[f"train-{_m}{_v}"] = ["--model", _m, *_train]
SPLIT = ("step_s", "compute_s", "copy_wait_s", "optimizer_wait_s")
STEP = re.compile(r"-> ~([\d.]+)(?:-([\d.]+))? s")
COMPUTE = re.compile(r"compute ([\d.]+) s")


def planned(case: str, log: list[str]) -> dict:
    rc, text, wall = run(CLI + ["plan", *CASES[case][0]], 300, log)
    m, c = STEP.search(text), COMPUTE.search(text)
    lo = float(m.group(1)) if m else None
    return {"case": case, "plan_rc": rc, "plan_wall_s": wall,
            "predicted_lo_s": lo, "predicted_hi_s": float(m.group(2) or lo) if m else None,
            "predicted_compute_s": float(c.group(1)) if c else None}


def measured(case: str, tmp: Path, log: list[str]) -> dict:
    if CASES[case][1] == "stream":
        out = f"plan-measure-{case}"
        rc, _, _ = run([sys.executable, str(common.ROOT / "bench" / "stream.py"), "--cases",
                        case, "--systems", "outcore", "--compiled", "--largest", "0",
                        "--skip-tests", "--timeout", "360", "--out", out], 420, log)
        f = common.ROOT / "bench" / "results" / f"{out}.json"
        rows = [r for r in json.loads(f.read_text())["runs"]
                if r.get("system") == "outcore"] if f.exists() else []
        if rc != 0 or not rows or not rows[0].get("step_s"):
            return {"measured_rc": rc}
        r = rows[0]
        return {"measured_rc": rc, "measured_s": r["step_s"], "measured_mean_s":
                r.get("window_step_s"), "measured_compute_s": r.get("compute_s")}
    rc, text, _ = run(CLI + ["train", "--compile-kernels", "--max-steps",
                             "20", "--no-tensorboard", "--output-dir", str(tmp / case),
                             *TRAIN_ARGS[case]], 300, log)
    m = re.search(r"([\d,]+) tokens/s \(median step\)", text)
    tps = float(m.group(1).replace(",", "")) if m else None
    row = {"measured_rc": rc, "measured_s": 4096 / tps if tps else None}
    # the time split of the steps after the first 3 (compile, the planner's first moves),
    # from the run's metrics.jsonl: a median of each column
    f = tmp / case / "metrics.jsonl"
    steps = [json.loads(ln) for ln in f.read_text().splitlines()][3:] if f.exists() else []
    for k in SPLIT:
        vals = [r[k] for r in steps if r.get(k) is not None]
        if vals:
            row[f"measured_{k}_median"] = statistics.median(vals)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--measure", default="3b-16k,train-1b", help="cases also run ('' none)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"unknown case(s) {bad}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    doc, log, rows = common.header("plan"), [], []
    name = args.out or f"plan-{common.machine_name()}"
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            row = planned(case, log)
            if case in args.measure.split(","):
                row.update(measured(case, Path(tmp), log))
                if row.get("measured_s") and row["predicted_lo_s"]:
                    row["measured_over_predicted_hi"] = row["measured_s"] / row["predicted_hi_s"]
            rows.append(row)
            doc["runs"] = rows
            common.write(doc, name)   # after every case: a cut run keeps what it measured
    (common.ROOT / "bench" / "results" / f"{name}.log").write_text("\n".join(log))
    print(common.table(rows, ["case", "predicted_compute_s", "predicted_lo_s",
                              "predicted_hi_s", "measured_s", "measured_mean_s",
                              "measured_compute_s", "measured_compute_s_median",
                              "measured_optimizer_wait_s_median"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
