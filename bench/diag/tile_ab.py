"""Plan variants of outcore.matmul against each other, alternating in one process. (GPU)

    PYTHONPATH=src python3 bench/diag/tile_ab.py bf16-32768 [CASE ...]   # ~1 min a case
    TILE_AB=planner,8192x8192,4096x4096 ... (the variants)

A variant is "planner" or parts joined by "+": ROWSxCOLS forces matmul(tile=),
compute=C overrides the case's arithmetic, mem=SIZE sets gpu_memory (mem=4GiB), x3chunk=N
sets split.BIG_CHUNK (tf32x3's depth of one call of its large term) for that variant's
runs, x3fit=EDGE:DEPTH:PEAK plans with tf32x3's kernel fit (model.KERNEL_FIT,
Rates.flops) set so (each plan searched once, before the timed runs, like the planner's
own cache), and set=MODULE.NAME=VALUE sets
outcore.gemm.MODULE.NAME for that variant's runs (set=worker.REUSE_STREAMS=0). Each row has
the host's median time before the first copy and after the device's end (ready_ms,
after_ms: GemmStats.phases).

Session 26's record ran bf16-32768 in the planner's whole-width 1024-row strips at 186-202
ms in one process and 179 in another (model: 173; the bound 157). Such strips need all of
B before any C tile is done, so C's 4.3 GB go out in the second half, beside A's copies in,
where both directions share the link (97.5 GB/s together, 55 each alone). Square tiles in
the growing order finish C from early on, so its copies out spread over the product: the
planner's model has no term for the two directions slowing each other and has not weighed
that. This times each variant in ROUNDS rounds, the variants' order rotated each round, the
median of RUNS runs a round (host matrices as bench/gemm.py makes them, pinned), checks
entries of each product against float64 (bench/gemm.py's check_row), and writes
bench/results/tile-ab-<machine>.json (TILE_AB_TAG=T: tile-ab-<machine>-T.json), a table
last. Session 26 (tile-ab-h200.json): the square tiles lost, 8192^2 216 ms and 4096 x
8192 214 against the strips' 177, as the planner's model said (209, 202, 173).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import statistics
import sys
from dataclasses import replace

import torch

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import common  # noqa: E402
from gemm import check_row, fill_, median_s, square_cases, train_cases  # noqa: E402

from outcore.gemm import model as model_mod  # noqa: E402
from outcore.gemm import plan as plan_mod  # noqa: E402
from outcore.gemm import split as split_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402

# the module, not the function outcore.gemm re-exports under the same name
matmul_mod = importlib.import_module("outcore.gemm.matmul")
from outcore.memory import pin_  # noqa: E402

VARIANTS = os.environ.get("TILE_AB", "planner,8192x8192,4096x4096,16384x16384,2048x32768")
TAG = os.environ.get("TILE_AB_TAG")
ROUNDS, RUNS = 3, 3
SMOKE = False          # True: the bench's smoke cases on the CPU (a dry run of this logic)


def parse(variant: str) -> tuple[dict, int | None, tuple | None, dict]:
    """matmul keywords, the BIG_CHUNK and the tf32x3 fit (None: the defaults) of a variant,
    and the module settings it makes ({"worker.REUSE_STREAMS": 0, ...})."""
    kw: dict = {}
    chunk = fit = None
    sets: dict = {}
    for part in variant.split("+"):
        if part.startswith("set="):
            name, value = part[4:].split("=")
            sets[name] = float(value) if "." in value else int(value)
        elif part.startswith("compute="):
            kw["compute"] = part.split("=", 1)[1]
        elif part.startswith("mem="):
            kw["gpu_memory"] = part.split("=", 1)[1]
        elif part.startswith("x3chunk="):
            chunk = int(part.split("=", 1)[1])
        elif part.startswith("x3fit="):
            fit = tuple(float(x) for x in part.split("=", 1)[1].split(":"))
        elif part != "planner":
            kw["tile"] = tuple(int(x) for x in part.split("x"))
    return kw, chunk, fit, sets


@contextlib.contextmanager
def settings(sets: dict):
    """outcore.gemm's module attributes set to `sets`' values for the enclosed runs
    ("worker.REUSE_STREAMS" is outcore.gemm.worker.REUSE_STREAMS), restored after."""
    mods = {n: importlib.import_module("outcore.gemm." + n.rsplit(".", 1)[0]) for n in sets}
    old = {n: getattr(mods[n], n.rsplit(".", 1)[1]) for n in sets}
    for n, v in sets.items():
        setattr(mods[n], n.rsplit(".", 1)[1], type(old[n])(v))
    try:
        yield
    finally:
        for n, v in old.items():
            setattr(mods[n], n.rsplit(".", 1)[1], v)


@contextlib.contextmanager
def x3_fit(fit: tuple | None):
    """matmul planning with tf32x3's kernel fit (edge, depth, peak FLOP/s in TFLOP/s) for
    the enclosed runs; plans memoized per fit, as make_plan's cache does for the default
    (whose key does not hold the fit, so it is bypassed here)."""
    if fit is None:
        yield
        return
    edge, depth, peak = fit
    old_fit = model_mod.KERNEL_FIT["tf32x3"]
    rates = model_mod.Rates(flops={**model_mod.Rates().flops, "tf32x3": peak * 1e12})
    memo = _FIT_PLANS.setdefault(fit, {})

    def planned(*args, **kw):
        key = (args, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in memo:
            memo[key] = plan_mod.make_plan(*args, rates=rates, **kw)
        return memo[key]
    model_mod.KERNEL_FIT["tf32x3"] = (edge, depth)
    matmul_mod.make_plan = planned
    try:
        yield
    finally:
        matmul_mod.make_plan = plan_mod.make_plan
        model_mod.KERNEL_FIT["tf32x3"] = old_fit


_FIT_PLANS: dict = {}


def main() -> int:
    if not SMOKE and (not torch.cuda.is_available() or len(sys.argv) < 2):
        print("usage (GPU): tile_ab.py CASE [CASE ...]  (bench/gemm.py's case names)")
        return 2
    cases = {c.name: c for c in square_cases(SMOKE) + train_cases(SMOKE)}
    picked = [cases[n] for n in sys.argv[1:]]
    variants = VARIANTS.split(",")
    default_chunk = split_mod.BIG_CHUNK
    dev = "cpu" if SMOKE else 0
    sync = (lambda: None) if SMOKE else torch.cuda.synchronize
    numel = max(max(c.m * c.k, c.k * c.n, c.m * c.n) for c in picked)
    bufs = [torch.empty(numel) for _ in range(3)]
    for i, b in enumerate(bufs):
        fill_(b, salt=i)
    bufs = [pin_(b) for b in bufs]
    doc = common.header("tile-ab")
    doc.update(rounds=ROUNDS, runs_per_round=RUNS, variants=variants, runs=[])
    for c in picked:
        sa = (c.k, c.m) if c.transa else (c.m, c.k)
        sb = (c.n, c.k) if c.transb else (c.k, c.n)
        A, B, C = (b[:s[0] * s[1]].view(s) for b, s in zip(bufs, (sa, sb, (c.m, c.n))))
        kw = dict(transa=c.transa, transb=c.transb, compute=c.compute, devices=dev,
                  return_stats=True)
        got: dict = {v: {"rounds": [], "plan": None, "ready_ms": [], "after_ms": []}
                     for v in variants}
        for r in range(ROUNDS):
            for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                stats = []
                vkw, chunk, fit, sets = parse(v)
                run = lambda: stats.append(matmul(A, B, C, **{**kw, **vkw})[1])  # noqa: E731
                split_mod.BIG_CHUNK = chunk or default_chunk
                try:
                    with x3_fit(fit), settings(sets):
                        run()                             # warm-up: buffers and the plan
                        got[v]["rounds"].append(statistics.median(median_s(run, RUNS, sync)))
                        for ph in (st.phases() for st in stats[1:]):
                            got[v]["ready_ms"].append(ph["ready_s"] * 1e3)
                            got[v]["after_ms"].append((ph["wall_s"] - ph["synced_s"]) * 1e3)
                        if r == 0:
                            got[v].update(check_row(A, B, C, replace(c, compute=vkw.get(
                                "compute", c.compute))))
                finally:
                    split_mod.BIG_CHUNK = default_chunk
                got[v]["plan"] = stats[-1].plan
        for v in variants:
            t = statistics.median(got[v]["rounds"])
            host = {f"{x}_median": statistics.median(got[v][x]) for x in ("ready_ms", "after_ms")}
            doc["runs"].append({"case": c.name, "variant": v, "wall_s": t,
                                "tflops": c.flops / t / 1e12, **host, **got[v]})
            print(f"{c.name} {v}: {t * 1e3:.1f} ms (rounds "
                  + ", ".join(f"{x * 1e3:.1f}" for x in got[v]["rounds"])
                  + f") [{got[v]['plan']}]", flush=True)
    path = common.write(doc, f"tile-ab-{common.machine_name()}" + (f"-{TAG}" if TAG else ""))
    print(common.table(doc["runs"], ["case", "variant", "wall_s", "tflops", "ready_ms_median",
                                     "after_ms_median", "check_ok"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
