#!/usr/bin/env python3
"""How well stream/balance.py's model of a step fits the measured outcore rows.

    PYTHONPATH=src python3 bench/balance_fit.py        # CPU, seconds; reads bench/results

For every outcore row of bench/results/stream-h200*.json at 1b/3b/7b-16k without host
copies or held updates (duplicates dropped), balance.predict gives its step from its
device-updated groups and compute_s, overlapped as (compute^K + queue^K)^(1/K), for
several K (K = inf: the larger of the two). The CPU AdamW counts where the row logged its
measured rate (balance_log, the balance planner's rows); the earlier rows logged none, and
their planner had moved groups until the step stopped waiting for the CPU, so only their
copies count. The table compares the prediction with the row's mean step (window_step_s,
else step_s), and so does stream/simulate.py's block-by-block step. Prints the rows and
the error per K and of the simulation; then the same for the rows with the fused host
copies (session 10 on), counted with 16-bit loads and gradients. Writes nothing.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from outcore.models import decoder  # noqa: E402
from outcore.stream import balance  # noqa: E402
from outcore.stream.simulate import simulate  # noqa: E402

CASES = ("1b-16k", "3b-16k", "7b-16k")
SLOTS = 3          # the engine's block slots in these runs
STAGED_GRADS = 8   # Engine.max_staged_grads's default (stream/engine.py)


def group_numels(size: str) -> list[int]:
    """[rest, block 1, ...] of the reference decoder `size` (seq 2048), built on meta."""
    with torch.device("meta"):
        m = decoder(size, max_seq=2048)
    blocks = [sum(p.numel() for p in b.parameters()) for b in m.layers]
    return [sum(p.numel() for p in m.parameters()) - sum(blocks)] + blocks


def rows(fused: bool = False) -> list[dict]:
    """The rows without host copies, or (fused) those with the fused copies (session 10
    on: each row says so), which load 16-bit weights and send bf16 gradients."""
    out, seen, shapes = [], set(), {}
    for path in sorted(glob.glob(str(common.RESULTS / "stream-h200*.json"))):
        doc = json.loads(open(path).read())
        for r in doc.get("runs", []):
            plain = not (doc.get("host_weight_copy") or doc.get("fused_copy")) and \
                r.get("host_weight_copy") in (None, "False")
            if (r.get("system") != "outcore" or r.get("case") not in CASES
                    or "compute_s" not in r or not r.get("device_updated_groups")
                    or (r.get("host_weight_copy") != "fused" if fused else not plain)
                    or r.get("held_gpu_updates") not in
                    (None, "0", 0)):
                continue
            key = (r["case"], round(r["step_s"], 4))
            if key in seen:
                continue
            seen.add(key)
            size = r["case"].split("-")[0]
            numels = shapes.setdefault(size, group_numels(size))
            device = set(r["device_updated_groups"])
            kept = r.get("kept_blocks", 0)   # keep.py's blocks (session 9 on)
            mode, grad = ("all", 2) if fused else (None, 4)
            h2d, d2h, _ = balance.traffic(numels, device, mode, SLOTS, kept, grad)
            log = r.get("balance_log") or []
            out.append({"file": os.path.basename(path), "case": r["case"],
                        "groups": len(device), "compute_s": r["compute_s"],
                        "copies_s": max(h2d, d2h) / balance.LINK_BPS,
                        "cpu_rate": log[-1]["cpu_params_per_s"] if log else 0.0,
                        "numels": numels, "device": device, "kept": kept,
                        "copy_mode": mode, "grad_bytes": grad,
                        "mean_step_s": r.get("window_step_s") or r["step_s"]})
    return out


def predicted(r: dict, k: float) -> float:
    """balance.predict for row r (the engine's default staged-gradient cap)."""
    return balance.predict(r["numels"], r["device"], r["copy_mode"], SLOTS,
                           balance.Rates(r["compute_s"], r["cpu_rate"]), STAGED_GRADS, k=k,
                           kept=r["kept"], grad_bytes=r["grad_bytes"])


def error(r: dict, k: float) -> float:
    return (predicted(r, k) - r["mean_step_s"]) / r["mean_step_s"]


def simulated(r: dict) -> float:
    """stream/simulate.py's step for row r (no fitted parameter)."""
    copies = r["copy_mode"] == "all"
    return simulate(r["numels"], r["device"], SLOTS,
                    balance.Rates(r["compute_s"], r["cpu_rate"]), kept=r["kept"],
                    cpu_load_bytes=2 if copies else 4, cpu_grad_bytes=r["grad_bytes"],
                    copies=copies)


def sim_error(r: dict) -> float:
    return (simulated(r) - r["mean_step_s"]) / r["mean_step_s"]


def report(rs: list[dict], title: str) -> None:
    for r in rs:
        r["predicted_s"] = predicted(r, balance.OVERLAP_K)
        r["simulated_s"] = simulated(r)
    print(title)
    print(common.table(rs, ["file", "case", "groups", "kept", "compute_s", "copies_s",
                            "cpu_rate", "predicted_s", "simulated_s", "mean_step_s"]))
    print(f"{len(rs)} rows; error of the predicted step against the mean step:")
    for k in (3, 4, 6, math.inf):
        err = [error(r, k) for r in rs]
        mark = "  <- balance.OVERLAP_K" if k == balance.OVERLAP_K else ""
        print(f"  K={k}: mean {sum(err) / len(err):+.1%}, rms "
              f"{math.sqrt(sum(e * e for e in err) / len(err)):.1%}{mark}")
    err = [sim_error(r) for r in rs]
    print(f"  simulated (stream/simulate.py): mean {sum(err) / len(err):+.1%}, rms "
          f"{math.sqrt(sum(e * e for e in err) / len(err)):.1%}")


def main() -> int:
    report(rows(), "rows without host copies:")
    report(rows(fused=True), "\nrows with the fused host copies (session 10 on):")
    return 0


if __name__ == "__main__":
    sys.exit(main())
