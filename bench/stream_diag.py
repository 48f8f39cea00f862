#!/usr/bin/env python3
"""In-process A/Bs of the engine's internals at one case, to find where a step's time went.

    PYTHONPATH=src python3 bench/stream_diag.py                        # 1b-16k, compiled
    PYTHONPATH=src python3 bench/stream_diag.py --variants default,no-peaks --steps 6
    PYTHONPATH=src python3 bench/stream_diag.py --smoke               # CPU, seconds

Each variant builds a fresh model and Engine in this one process (torch.compile's kernels
are built once), runs --warmup steps, then --steps measured ones, and reports the median
step, the time split and the device-updated groups; then a NaN probe: a tiny model with
AdamW moved to the device for chosen groups before the first step, in fp32 and bf16, its
losses and whether every master stays finite. Writes bench/results/stream-diag-<machine>
.json (or --out) with every figure. An older tree runs the same variants that it knows:
PYTHONPATH=old/src ... --out NAME.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _no_peaks(eng):
    if hasattr(eng, "peaks"):
        eng.peaks.read = None   # inactive: no allocator reads at block boundaries


def _no_cap(eng):
    if hasattr(eng, "max_staged_grads"):
        eng.max_staged_grads = None


def _all_affordable(eng):
    if hasattr(type(eng.updater), "affordable"):
        eng.updater.affordable = lambda gs: gs


def _eleven(eng):
    eng.updater.enable(list(range(min(11, len(eng.groups)))))


VARIANTS = {  # name: what is changed on the Engine before its first step
    "default": None,
    "no-peaks": _no_peaks,
    "no-cap": _no_cap,
    "all-affordable": _all_affordable,
    "no-gc": "gc",               # gc.disable() over the steps
    "eleven-groups": _eleven,    # session 6's run of record moved groups 0-10 at 1b-16k
}


def run_variant(name: str, args, b) -> dict:
    import outcore
    from outcore.models import decoder
    torch.manual_seed(0)
    model = decoder(args.size, max_seq=args.seq, compiled=args.compiled,
                    **({"layers": args.layers} if args.layers else {}))
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=1e-4, weight_decay=0.0),
                         device=args.device, gpu_memory=args.gpu_memory)
    change = VARIANTS[name]
    if callable(change):
        change(eng)
    if change == "gc":
        gc.collect()
        gc.disable()
    times, splits, losses = [], [], []
    try:
        for i in range(args.warmup + args.steps):
            t = time.perf_counter()
            losses.append(eng.train_step(b))
            dt = time.perf_counter() - t
            if i >= args.warmup:
                s = eng.stats
                times.append(dt)
                splits.append((s.compute_s, s.copy_wait_s, s.optimizer_wait_s))
        eng.synchronize()
    finally:
        gc.enable()
    k = times.index(common.median(times))
    row = {"variant": name, "step_s": common.median(times), "steps_s": times,
           "compute_s": splits[k][0], "copy_wait_s": splits[k][1],
           "optimizer_wait_s": splits[k][2], "losses": losses,
           "device_updated_groups": sorted(eng.updater.groups),
           "peak_gpu_gb": getattr(eng.stats, "peak_reserved_bytes", 0) / 1e9}
    eng.close()
    del eng, model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def nan_probe(device: str) -> list[dict]:
    """A tiny decoder, AdamW of `groups` on the device from the first step: its losses,
    and whether every master is finite after 4 steps."""
    import outcore
    from outcore.models import decoder
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for label in ("none", "all", "head", "tail", "rest"):
            torch.manual_seed(0)
            eng = outcore.Engine(decoder("tiny", layers=6), optimizer=outcore.AdamW(lr=1e-3),
                                 device=device, compute_dtype=dtype, gpu_updates=0)
            n = len(eng.groups)
            groups = {"none": [], "all": list(range(n)), "head": [1, 2, 3],
                      "tail": list(range(n - 3, n)), "rest": [0]}[label]
            eng.updater.enable(groups)
            g = torch.Generator().manual_seed(1)
            x = torch.randint(0, 256, (4, 64), generator=g)
            try:
                losses = [eng.train_step({"input_ids": x, "labels": x}) for _ in range(4)]
                eng.synchronize()
                bad = [k for k, m in enumerate(eng.host.master) if not torch.isfinite(m).all()]
                err = None
            except Exception as exc:   # the probe reports, the next one runs
                losses, bad, err = [], [], f"{type(exc).__name__}: {exc}"[:300]
            rows.append({"dtype": str(dtype).replace("torch.", ""), "groups": label,
                         "losses": losses, "nonfinite_masters": bad, "error": err})
            eng.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--gpu-memory", default="14.5GiB")
    ap.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny model, 2+2 steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.size, args.layers, args.tokens, args.seq = "tiny", 4, 256, 64
        args.compiled, args.warmup, args.steps, args.gpu_memory = False, 2, 2, None
    for name in args.variants.split(","):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}: choose from {', '.join(VARIANTS)}")
    from outcore.models import decoder
    vocab = decoder(args.size, max_seq=args.seq).cfg.vocab if args.smoke else 32000
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (args.tokens // args.seq, args.seq), generator=g)
    b = {"input_ids": x, "labels": x}
    doc = common.header("stream-diag")
    doc.update(size=args.size, tokens=args.tokens, compiled=args.compiled)
    for name in args.variants.split(","):
        row = run_variant(name, args, b)
        print(f"{name}: {row['step_s']:.3f} s  compute {row['compute_s']:.3f}  copy wait "
              f"{row['copy_wait_s']:.3f}  opt wait {row['optimizer_wait_s']:.3f}  groups "
              f"{row['device_updated_groups']}", flush=True)
        doc["runs"].append(row)
        common.write(doc, args.out or f"stream-diag-{common.machine_name()}")   # so far
    if not args.no_probe:
        doc["nan_probe"] = nan_probe(args.device)
        for r in doc["nan_probe"]:
            print(f"probe {r['dtype']:8s} {r['groups']:5s} losses "
                  f"{[round(v, 3) for v in r['losses']]} nonfinite {r['nonfinite_masters']}"
                  f" {r['error'] or ''}", flush=True)
    path = common.write(doc, args.out or f"stream-diag-{common.machine_name()}")
    print(common.table(doc["runs"], ["variant", "step_s", "compute_s", "copy_wait_s",
                                     "optimizer_wait_s", "peak_gpu_gb"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
