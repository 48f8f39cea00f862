#!/usr/bin/env python3
"""Outcore-only A/Bs of engine options at one case, in one command, with a table last.

    PYTHONPATH=src python3 bench/stream_ab.py                 # 3b-16k, compiled: ~8 min
    PYTHONPATH=src python3 bench/stream_ab.py --dry-run       # the commands only

Runs the GPU tests once, then bench/stream.py once per variant (each its own results file,
bench/results/stream-h200-ab-<variant>.json, with its command, commit and every figure),
and prints each variant's median step, mean step, device-updated groups and time split
beside `--reference` (a row of an earlier results file, e.g. the run of record's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VARIANTS = {  # name: bench/stream.py flags (session 5's NOTES, "Next GPU session")
    "tune": ["--gpu-updates", "auto", "--tune-updates", "--tune-trials", "8", "--warmup", "30",
             "--max-extra-warmup", "40"],
    # The host copies ran in session 6 (slower, and the loss jumped back: a write-back
    # race, fixed since; the GPU tests that reproduce it passed in session 7): every
    # block's copies, or only the device-updated blocks' (no cast on the CPU, whose AdamW
    # it slowed).
    "copy": ["--host-weight-copy"],
    "device-copy": ["--device-weight-copy"],
    "settle": ["--settle-compiles"],
    # Session 7: the step is h2d-bound once 22 blocks update on the device (a model of
    # the queues, stream/balance.py, fitted to 1.038 s there and 0.948 for session 5's 19
    # groups): the groups from that model instead, alone and with the host copies
    # (predicted about 0.93 s and 0.84 s at 2.5 G params/s of CPU AdamW, against 1.08 s
    # for the run of record's 23 groups, 1.05 s measured by the mean).
    # Session 8: balance ran 0.888 s (9 groups), balance-copy 0.939 s and copy 1.02 s,
    # against the run of record's 1.038 s with auto; balance became the default, and
    # `auto` is the variant that runs the planner before it.
    "balance": ["--gpu-updates", "balance"],
    "balance-copy": ["--gpu-updates", "balance", "--host-weight-copy"],
    "auto": ["--gpu-updates", "auto"],
    # Session 9: keep.py (device-updated blocks' weights stay on the GPU for the next
    # forward, which the session-8 counts say is bound by its fp32 loads), with the balance
    # planner's groups, and with 12 blocks fixed, every other one past block 3
    # (interleave: each device block's 12 B/param beside a CPU block's 4 in backward).
    # It ran 0.877 s (keep), 0.865 s (keep-12i) against 0.928 s without (balance, then the
    # default) and became the default: `no-keep` is the variant without it.
    "no-keep": ["--no-keep-weights"],
    "keep-12i": ["--gpu-updates", "12", "--update-order", "interleave"],
    # next: the planner's own count in the interleaved order (keep-12i's every-other
    # layout spreads the device blocks' 12 B/param each way across backward)
    "interleave": ["--update-order", "interleave"],
    # next: 16-bit host copies written in the CPU AdamW's own pass (stream/cast_kernel.py).
    # stream/simulate.py puts 3b-16k at 0.86 s with every block's loads at 2 B/param and
    # the CPU AdamW 12% slower, against 0.91 s for the default and 0.89 s with the cast
    # after the AdamW (26% slower, as in session 8)
    "fused-copy": ["--fused-copy"],
    # Session 14's profile at 3b-16k: the compute stream idles ~130 ms a step, all of it in
    # backward's device-updated stretch with both copy directions busy; no 16-bit copies
    # out of device updates there (2 B/param less d2h), alone and with rest and 9 blocks
    # fixed (the balance planner's pick is rest and 11: fewer device blocks, a shorter
    # stretch, more CPU work)
    "lazy": ["--lazy-copies"],
    "lazy-9": ["--lazy-copies", "--gpu-updates", "9"],
    # then the m, v of the first 3 device blocks of that stretch kept on the device
    # (DeviceUpdater.resident_mv: 16 B/param less over the link there, 2.7 GB of device
    # memory), with the kept weights (which then get less room) and without them (the
    # forward they serve did not wait on the link in the profile)
    "res3": ["--lazy-copies", "--resident-mv", "3"],
    "res3-nokeep": ["--lazy-copies", "--resident-mv", "3", "--no-keep-weights"],
    "no-copy": ["--no-host-weight-copy"],   # the default before session 10 ("auto" since)
    # next (session 12, none run yet): the planner's CPU rate, its model, and 4 device slots
    # (2 blocks loaded ahead) in the interleaved order, which stream/simulate.py puts at
    # about 0.80 s against 0.85 for the default; the fixed count the fastest runs settled on
    "best-rate": ["--cpu-rate", "best"],
    "sim-model": ["--balance-model", "simulate"],
    "slots4": ["--block-slots", "4"],
    "slots4-i": ["--block-slots", "4", "--update-order", "interleave"],
    "slots4-i-sim": ["--block-slots", "4", "--update-order", "interleave",
                     "--balance-model", "simulate"],
    "fixed-10": ["--gpu-updates", "10"],
    # Session 30: the cap on gradients staged for the CPU AdamW (Engine.max_staged_grads,
    # 8). Backward waits at the cap, and that wait counts as optimizer wait (0.23-0.35 s a
    # step in session 29's 3b-16k), so the balance planner moves more AdamW to the device;
    # without it backward runs on and the CPU works through its backlog into the next
    # forward, whose first CPU-updated block comes after the device-updated ones. Only
    # measured before at 1b-16k (session 7: 0.295 s against 0.299).
    "staged16": ["--max-staged-grads", "16"],
    "staged-free": ["--max-staged-grads", "0"],
    "staged-free-10": ["--max-staged-grads", "0", "--gpu-updates", "10"],
    # Session 31: the CPU AdamW taking the landed gradient the next forward needs first
    # (stream/cpu_order.py), so the backlog at backward's end is the blocks the forward
    # needs last. Its A/B ran with it as the default ("balance") against "arrival" (the
    # oldest first): 0.888/0.930/0.882 s against 0.906/0.910/0.858, no faster; "arrival"
    # is the default again and "need" the opt-in variant
    "arrival": ["--cpu-order", "arrival"],
    "need": ["--cpu-order", "need"],
    # Session 32: the CPU AdamW pass writing the bf16 copies by non-temporal stores
    # (stream/cast_kernel.STREAM_STORES): an ordinary store reads each line of the copy
    # from host memory first, 2 B/param of the ~30 the pass moves
    "nt": ["--copy-stores", "stream"],
    # Session 36: nt against balance moved with the planner's pick (1.44B or 1.56B device
    # params in either variant, the fewer faster in both rounds): the stores on a fixed plan
    # (rest and 10 blocks), against fixed-10; 0.883 and 0.880 s against 0.871: no faster
    "nt-10": ["--copy-stores", "stream", "--gpu-updates", "10"],
    # session 34: rest's m, v from the compute stream's pool became the default (the h2d
    # stream's pool kept a 1.6 GB segment for them at 3b-16k); this is the rule before it
    "mv-h2d": ["--rest-mv-on-h2d"],
}


def commands(args) -> list[tuple[str, list[str]]]:
    base = [sys.executable, os.path.join(common.ROOT, "bench", "stream.py"), "--cases",
            args.case, "--systems", "outcore", "--largest", "0", "--steps", str(args.steps)] + \
        (["--compiled"] if args.compiled else [])
    out = []
    for i, name in enumerate(args.variants.split(",")):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}: choose from {', '.join(VARIANTS)}")
        tests = [] if i == 0 and not args.skip_tests else ["--skip-tests"]
        out.append((name, base + VARIANTS[name] + tests +
                    ["--out", out_name(args.case, name, args.tag)]))
    return out


def out_name(case: str, variant: str, tag: str = "") -> str:
    """The results file's name: stream-h200-ab[-<tag>]-<variant> at 3b-16k (as since
    session 5), with -<case> before the variant at another case. A tag keeps an A/B from
    overwriting an earlier one's files (session 9's overwrote session 8's)."""
    parts = ["stream-h200-ab"] + ([tag] if tag else []) + ([] if case == "3b-16k" else [case])
    return "-".join(parts + [variant])


def row_of(path: str, case: str) -> dict | None:
    try:
        doc = json.loads(open(path).read())
    except (OSError, ValueError):
        return None
    return next((r for r in doc["runs"] if r["system"] == "outcore" and r["case"] == case),
                None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="3b-16k")
    ap.add_argument("--tag", default="", help="put in every results file's name "
                    "(stream-h200-ab-<tag>-...), so this A/B overwrites no earlier one")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--reference", default=str(common.RESULTS / "stream-h200.json"))
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per variant")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    rows = []
    ref = row_of(args.reference, args.case)
    if ref is not None:
        rows.append(dict(ref, variant="reference"))
    for name, cmd in commands(args):
        print(" ".join(cmd), flush=True)
        if args.dry_run:
            continue
        subprocess.run(cmd, cwd=common.ROOT)   # a failed variant leaves its error row
        r = row_of(str(common.RESULTS / f"{out_name(args.case, name, args.tag)}.json"),
                   args.case)
        rows.append(dict(r or {}, variant=name))
    print(common.table(rows, ["variant", "step_s", "window_step_s", "tokens_per_s",
                              "compute_s", "copy_wait_s", "forward_s", "backward_s",
                              "optimizer_wait_s",
                              "device_updated_params", "plan_settled", "error"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
