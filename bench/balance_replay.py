#!/usr/bin/env python3
"""The balance planner's later moves at 3b-16k, replayed with the CPU rate it plans with.

    PYTHONPATH=src python3 bench/balance_replay.py        # CPU, a second; reads bench/results

For every outcore 3b-16k row of bench/results/stream-h200*.json whose balance planner
logged a move after its first one (`balance_log`), this replays each later plan with the
queues model (balance.choose, the default MODEL) from the groups the planner held, with the
logged compute time and kept capacity, twice: with the CPU AdamW rate that step measured
(balance.CPU_RATE = "last", what the run did) and with the highest rate measured up to
that step ("best"). It prints the groups each would hold, the row's step and mean step, and
the rows whose planner made only its first move, for comparison. Writes nothing.
"""

from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from balance_fit import SLOTS, STAGED_GRADS, group_numels  # noqa: E402

from outcore.stream import balance  # noqa: E402
from outcore.stream.device_choice import candidate_order  # noqa: E402


# planned with stream/simulate.py (session 12, before bench/stream.py recorded the model)
SIMULATED = {"stream-h200-s12-sim.json"}
# run at the staging cap's default since session 30 (no cap where the host has room, as
# it has for 3b on the H200's 128 GiB) before the rows recorded the cap they ran with
NO_CAP = {"stream-h200-s30-3b16k.json"}


def staged_cap(r: dict, head: dict, name: str) -> int | None:
    """The cap on staged gradients row r's planner planned with (None: none): the row's
    `staged_grads_cap`, else its command's --max-staged-grads (0: none), else NO_CAP's or
    the engine's fixed STAGED_GRADS of sessions 6-29."""
    if "staged_grads_cap" in r:
        return r["staged_grads_cap"]
    flag = head.get("max_staged_grads")
    if flag is not None:
        return flag or None
    return None if name in NO_CAP else STAGED_GRADS


def runs(case: str = "3b-16k") -> list[dict]:
    """outcore rows of `case` with a balance log of the queues model, one per (case,
    step) (the same run merged into several files counts once)."""
    out, seen = [], set()
    for path in sorted(glob.glob(str(common.RESULTS / "stream-h200*.json"))):
        doc = json.loads(open(path).read())
        if os.path.basename(path) in SIMULATED or \
                doc.get("balance_model", "queues") != "queues":
            continue
        for r in doc.get("runs", []):
            key = (r.get("case"), round(r.get("step_s", 0), 4))
            if r.get("system") != "outcore" or r.get("case") != case \
                    or not r.get("balance_log") or key in seen:
                continue
            seen.add(key)
            # rows before session 10 do not say; their command does (their part's, in a
            # file joined from several commands)
            # (--append leaves the first part's rows untagged)
            head = doc["parts"][r.get("part", 0)] if doc.get("parts") else doc
            flag = r.get("host_weight_copy")
            copies = flag in ("fused", "all", "True", True) if flag is not None else any(
                f in head.get("command", "") for f in ("--host-weight-copy", "--fused-copy"))
            # block slots and device update order: the command's (3 and "tail" before
            # bench/stream.py recorded them)
            out.append(dict(r, file=os.path.basename(path), copies=copies,
                            cap=staged_cap(r, head, os.path.basename(path)),
                            slots=head.get("block_slots") or SLOTS,
                            order=head.get("update_order") or "tail"))
    return out


def replay(r: dict, numels: list[int]) -> list[dict]:
    """Each later plan of row r, as run ("last") and with the highest rate so far."""
    log = r["balance_log"]
    copies = "all" if r["copies"] else None
    grad_bytes = 2 if copies else 4
    order = candidate_order(len(numels), r["order"])
    held = set(log[0]["added"])
    best = log[0]["cpu_params_per_s"]
    out = []
    for entry in log[1:]:
        best = max(best, entry["cpu_params_per_s"])
        got = {}
        for mode, rate in (("last", entry["cpu_params_per_s"]), ("best", best)):
            rates = balance.Rates(entry["compute_s"], rate, balance.LINK_BPS)
            got[mode] = choose_from(numels, order, held, copies, rates,
                                    entry.get("kept_capacity"), grad_bytes,
                                    bool(r.get("lazy_copies")), r["cap"],
                                    r.get("cpu_update_order", "arrival"), r["slots"])
        out.append({"file": r["file"], "step": entry["step"], "held": len(held),
                    "logged": len(held | set(entry["added"])) - len(entry["back"]),
                    "last": len(got["last"]), "best": len(got["best"]), "cap": r["cap"]})
        held = (held | set(entry["added"])) - set(entry["back"])
    return out


def choose_from(numels, order, held, copies, rates, kept, grad_bytes,
                lazy: bool = False, cap: int | None = STAGED_GRADS,
                cpu_order: str = "arrival", slots: int = SLOTS) -> set[int]:
    """balance.choose as the run's planner called it (lazy: DeviceUpdater.lazy_copies;
    cap: Engine.max_staged_grads; cpu_order: the CPU worker's, "arrival" before session
    31, whose rows record it as `cpu_update_order`; slots: Engine's block slots)."""
    return balance.choose(numels, order, held, copies, slots, rates, cap, kept or 0,
                          grad_bytes, lazy=lazy, cpu_order=cpu_order)


def main() -> int:
    numels = group_numels("3b")
    rows, moved, stayed = [], [], []
    for r in runs():
        steps = replay(r, numels)
        rows += steps
        (moved if steps else stayed).append(
            {"file": r["file"], "groups": len(r.get("device_updated_groups") or []),
             "step_s": r["step_s"], "mean_step_s": r.get("window_step_s"),
             "copies": r["copies"]})
    print("later plans, replayed (groups held after each):")
    print(common.table(rows, ["file", "step", "held", "logged", "last", "best", "cap"]))
    print("rows whose planner moved again:")
    print(common.table(moved, ["file", "groups", "copies", "step_s", "mean_step_s"]))
    print("rows whose planner kept its first choice:")
    print(common.table(stayed, ["file", "groups", "copies", "step_s", "mean_step_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
