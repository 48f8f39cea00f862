"""A timing model of one device running a plan: what the planner chooses the schedule by.

One h2d link, one compute engine, one d2h link, each serial: pieces load in the order they
are first needed, a GEMM starts when its pieces have landed, a tile's copy-out starts when
its last GEMM is done. It ignores cache eviction (it is only asked when everything fits)
and per-call overheads; its rates only steer the schedule, a wrong guess costs speed,
never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .tiles import spans


@dataclass(frozen=True)
class Rates:
    """Per-device rates the schedule is chosen with (H200 figures from DESIGN.md)."""
    flops: dict = field(default_factory=lambda: {
        "fp64": 60e12, "fp32": 51e12, "tf32": 414e12, "bf16": 801e12})
    h2d: float = 55e9
    d2h: float = 55e9


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimate_seconds(plan: GemmPlan, rates: Rates) -> float:
    """Seconds one device takes for `plan` under `rates` (see the module docstring)."""
    hb = _size(plan.host_dtype)
    rate = rates.flops[plan.compute]
    kspans = spans(plan.k, plan.tile_k)
    pspans = [spans(k1 - k0, plan.piece_k) for k0, k1 in kspans]
    avail: dict = {}
    link = comp = d2h = 0.0

    def need(key, nbytes):
        nonlocal link
        if key not in avail:
            link += nbytes / rates.h2d
            avail[key] = link
        return avail[key]

    def unit(t, kb, p):
        nonlocal comp
        kk0, kk1 = pspans[kb][p]
        ready = max(need(("A", t.i, kb, p), t.rows * (kk1 - kk0) * hb),
                    need(("B", t.j, kb, p), t.cols * (kk1 - kk0) * hb))
        comp = max(comp, ready) + 2.0 * t.rows * t.cols * (kk1 - kk0) / rate

    tiles = plan.tiles()
    for p in range(plan.prologue):
        for t in tiles:
            unit(t, 0, p)
    for t in tiles:
        for kb in range(len(kspans)):
            for p in range(plan.prologue if kb == 0 else 0, len(pspans[kb])):
                unit(t, kb, p)
        d2h = max(d2h, comp) + t.rows * t.cols * hb / rates.d2h
    return max(comp, d2h)
