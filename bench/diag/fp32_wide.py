"""Are fp32 products faster in few wide tiles (lone.FEW_WIDE)? An A/B on one GPU.

    PYTHONPATH=src python3 bench/diag/fp32_wide.py        # about 3 minutes on one H200

The planner widens a lone GPU's tiles only where that leaves MIN_WIDE_TILES (16) C tiles;
fp32 at 16384 in 8192-wide tiles (4 of them) ran 175.0-175.5 ms in two probes against
175.9-176.6 for the 4096-wide pick, and with FEW_WIDE = ("fp32",) the planner's model
prefers wider tiles in 14 of bench/gemm.py's 19 one-GPU fp32 cases. For fp32-16384 and
each fp32 training shape this times the product (outcore.matmul, pinned host matrices,
median of 3 after a warm-up) under three settings: the default; FEW_WIDE; FEW_WIDE with
a 1024-deep first piece (plan.FIRST_PIECE; every plan's, as in the probes). Each case
runs its variants in two rounds, the order rotated between them, and checks two rows of
each product against float64. Writes bench/results/fp32-wide-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from gemm import fill_, median_s, square_cases, train_cases  # noqa: E402

import outcore.gemm.lone as lone  # noqa: E402
import outcore.gemm.plan as plan_mod  # noqa: E402
from outcore.gemm import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

# name -> (lone.FEW_WIDE, plan.FIRST_PIECE, lone.TALL_TA)
VARIANTS = {"default": ((), 0, lone.TALL_TA), "few-wide": (("fp32",), 0, lone.TALL_TA),
            "few-wide-first1024": (("fp32",), 1024, lone.TALL_TA),
            # session 22: whole-height strips for fp32 with a transposed A too (the model
            # puts the fp32 TN shapes 3-11% faster in them; bf16's since session 18)
            "tall": ((), 0, tuple(lone.TALL_TA) + ("fp32",))}
# FP32_WIDE=name,... runs only those variants (and the default); FP32_CASES=text, only the
# cases whose name holds it (e.g. -TN-)
if os.environ.get("FP32_WIDE"):
    VARIANTS = {k: v for k, v in VARIANTS.items()
                if k == "default" or k in os.environ["FP32_WIDE"].split(",")}
ROUNDS, RUNS = 2, 3


def settings(name: str) -> None:
    lone.FEW_WIDE, plan_mod.FIRST_PIECE, lone.TALL_TA = VARIANTS[name]
    plan_mod._cached_search.cache_clear()


def rel_error(c, A, B, C) -> float:
    """Largest |C - ref| / max|ref| over two rows, ref = op(A) @ op(B) in float64."""
    rows = [0, c.m - 1]
    a = (A[:, rows].t() if c.transa else A[rows]).cuda().double()
    b = (B.t() if c.transb else B).cuda().double()
    ref = a @ b
    return ((C[rows].cuda().double() - ref).abs().max() / ref.abs().max()).item()


def time_product(fn) -> tuple[float, str]:
    """Median seconds of RUNS calls of `fn` (a matmul returning its stats) after a warm-up
    (the plan, the arena), and the plan it ran."""
    stats = [fn()]
    # matmul returns once C is in host memory: no sync needed around a run
    runs = median_s(lambda: stats.append(fn()), RUNS, lambda: None)
    return statistics.median(runs), stats[-1].plan


def time_case(c, A, B, C, variant: str) -> tuple[float, str]:
    settings(variant)
    return time_product(lambda: matmul(A, B, C, transa=c.transa, transb=c.transb,
                                       compute="fp32", return_stats=True)[1])


def ab_rounds(c, A, B, C, names: list, timer, rounds: int, base: str) -> list[dict]:
    """Rows of `rounds` rounds of `timer(c, A, B, C, variant)` over `names` (the order
    rotated each round; round 0 checks the product against float64), then each variant's
    median with its speed against `base`'s."""
    rows, times = [], {v: [] for v in names}
    for rnd in range(rounds):
        for v in names[rnd % len(names):] + names[:rnd % len(names)]:
            t, desc = timer(c, A, B, C, v)
            times[v].append(t)
            rows.append({"case": c.name, "variant": v, "round": rnd, "seconds": t,
                         "tflops": c.flops / t / 1e12, "plan": desc,
                         "rel_err": rel_error(c, A, B, C) if rnd == 0 else None})
            print(rows[-1], flush=True)
    ref = statistics.median(times[base])
    for v in names:
        t = statistics.median(times[v])
        rows.append({"case": c.name, "variant": v, "round": "median", "seconds": t,
                     "tflops": c.flops / t / 1e12, f"vs_{base}": ref / t})
    return rows


def ab_cases(cases: list, names: list, timer, rounds: int, base: str) -> list[dict]:
    """ab_rounds over each case, its A, B, C views of three pinned host buffers (A and B
    filled) sized for the largest case."""
    biggest = max(max(c.m * c.k, c.k * c.n, c.m * c.n) for c in cases)
    bufs = [pin_(torch.empty(biggest)) for _ in range(3)]
    for b in bufs[:2]:
        fill_(b)
    rows = []
    for c in cases:
        sa = (c.k, c.m) if c.transa else (c.m, c.k)
        sb = (c.n, c.k) if c.transb else (c.k, c.n)
        A, B, C = (b[:s[0] * s[1]].view(s) for b, s in zip(bufs, (sa, sb, (c.m, c.n))))
        rows += ab_rounds(c, A, B, C, names, timer, rounds, base)
    return rows


def write_ab(doc: dict, rows: list, name: str, base: str) -> None:
    """bench/results/NAME-<machine>.json with `rows` (ab_rounds'), and the medians' table."""
    doc["runs"] = rows
    common.write(doc, f"{name}-{common.machine_name()}")
    print(common.table([r for r in rows if r["round"] == "median"],
                       ["case", "variant", "seconds", "tflops", f"vs_{base}"]))


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/fp32_wide.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("fp32-wide")
    cases = [c for c in square_cases(False) if c.name == "fp32-16384"] + \
        [c for c in train_cases(False) if c.compute == "fp32"]
    cases = [c for c in cases if os.environ.get("FP32_CASES", "") in c.name]
    doc["env"] = {k: os.environ.get(k) for k in ("FP32_WIDE", "FP32_CASES")}
    rows = ab_cases(cases, list(VARIANTS), time_case, ROUNDS, "default")
    settings("default")
    write_ab(doc, rows, "fp32-wide", "default")
    return 0


if __name__ == "__main__":
    sys.exit(main())
