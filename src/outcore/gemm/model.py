"""A timing model of one device running a plan: what the planner chooses the schedule by.

One h2d link, one compute engine, one d2h link, each serial: pieces load in the order they
are first needed, a GEMM starts when its pieces have landed, a tile's copy-out starts when
its last GEMM is done. The host enqueues tile i's loads only once tile i - depth has
computed (the worker's flow control). It ignores cache eviction (it is only asked when everything fits)
and per-call overheads; its rates only steer the schedule, a wrong guess costs speed,
never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .schedule import LONE_DEPTH
from .tiles import spans


@dataclass(frozen=True)
class Rates:
    """Per-device rates the schedule is chosen with (H200 figures from DESIGN.md)."""
    flops: dict = field(default_factory=lambda: {
        "fp64": 60e12, "fp32": 51e12, "tf32": 414e12, "bf16": 801e12})
    h2d: float = 55e9
    d2h: float = 55e9
    hbm: float = 3.0e12          # device memory, read + write of an accumulator per GEMM
    launch: float = 8e-6         # per GEMM call


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def estimate_seconds(plan: GemmPlan, rates: Rates, depth: int = LONE_DEPTH) -> float:
    """Seconds one device takes for `plan` under `rates`, at most `depth` tiles queued
    (see the module docstring)."""
    hb = _size(plan.host_dtype)
    rate = rates.flops[plan.compute]
    kspans = spans(plan.k, plan.tile_k)
    pspans = [spans(k1 - k0, plan.piece_k) for k0, k1 in kspans]
    avail: dict = {}
    link = comp = d2h = issue = 0.0

    def need(key, nbytes):
        nonlocal link
        if key not in avail:
            link = max(link, issue) + nbytes / rates.h2d
            avail[key] = link
        return avail[key]

    def gemm(t, kb, q0, q1, ready):
        nonlocal comp
        k = pspans[kb][q1 - 1][1] - pspans[kb][q0][0]
        acc_rw = 2.0 * t.rows * t.cols * _size(plan.acc_dtype) / rates.hbm
        comp = max(comp, ready) + 2.0 * t.rows * t.cols * k / rate + acc_rw + rates.launch

    def run(t, kb, q0, q1):
        """Like DeviceWorker._gemm: a piece loaded now gets its own GEMM, runs of pieces
        already on the device are merged into one."""
        seg, seg_ready = None, 0.0
        for p in range(q0, q1):
            ka, kb_ = ("A", t.i, kb, p), ("B", t.j, kb, p)
            fresh = ka not in avail or kb_ not in avail
            kk = pspans[kb][p][1] - pspans[kb][p][0]
            ready = max(need(ka, t.rows * kk * hb), need(kb_, t.cols * kk * hb))
            if fresh:
                if seg is not None:
                    gemm(t, kb, seg, p, seg_ready)
                    seg = None
                gemm(t, kb, p, p + 1, ready)
            elif seg is None:
                seg, seg_ready = p, ready
            else:
                seg_ready = max(seg_ready, ready)
        if seg is not None:
            gemm(t, kb, seg, q1, seg_ready)

    tiles = plan.tiles()
    # like DeviceWorker._task: the prologue covers at most K block 0's pieces
    pro = min(plan.prologue, len(pspans[0])) if len(tiles) > 1 else 0
    for p in range(pro):
        for t in tiles:
            run(t, 0, p, p + 1)
    done: list[float] = []
    for x, t in enumerate(tiles):
        if pro == 0 and x >= depth:
            issue = done[x - depth]      # the host waits for tile x - depth to compute
        for kb in range(len(kspans)):
            run(t, kb, pro if kb == 0 else 0, len(pspans[kb]))
        done.append(comp)
        d2h = max(d2h, comp) + t.rows * t.cols * hb / rates.d2h
    return max(comp, d2h)
