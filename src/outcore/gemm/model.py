"""A timing model of one device running a plan: what the planner chooses the schedule by.

One h2d link, one compute engine, one d2h link, each serial: pieces load in the order they
are first needed, a GEMM starts when its pieces have landed, a tile's copy-out starts when
its last GEMM is done. The host enqueues tile i's loads only once tile i - depth has
computed (the worker's flow control). It ignores cache eviction (it is only asked when everything fits)
and per-call overheads; its rates only steer the schedule, a wrong guess costs speed,
never correctness. A piece that is not contiguous in host memory is a 2-D copy of rows,
and narrow rows cross PCIe well below the contiguous rate (`ROW_FACTOR`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .schedule import LONE_DEPTH
from .tiles import spans

if TYPE_CHECKING:   # plan.py imports this module: annotations only
    from .plan import GemmPlan


# 2-D host-to-device copies: row bytes -> fraction of the contiguous rate, while the d2h
# link is busy too (the case of a GEMM). Fitted to bench/results/gemm-probe-h200.json
# (tf32/bf16 at 32768: 8 and 16 KiB rows ran at ~32 GB/s per direction; 32 KiB rows
# ~40 GB/s); wider rows (not measured) are assumed to gain slowly.
ROW_FACTOR = ((8 << 10, 0.55), (16 << 10, 0.6), (32 << 10, 0.75), (64 << 10, 0.8),
              (128 << 10, 0.9), (1 << 20, 1.0))


def row_factor(row_bytes: int, contiguous: bool = False) -> float:
    """Fraction of the contiguous h2d rate a copy of rows of `row_bytes` reaches."""
    if contiguous or row_bytes >= ROW_FACTOR[-1][0]:
        return 1.0
    if row_bytes <= ROW_FACTOR[0][0]:
        return ROW_FACTOR[0][1] * row_bytes / ROW_FACTOR[0][0]
    for (b0, f0), (b1, f1) in zip(ROW_FACTOR, ROW_FACTOR[1:]):
        if row_bytes <= b1:
            return f0 + (f1 - f0) * (row_bytes - b0) / (b1 - b0)
    return 1.0


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
    return dtype.itemsize


def estimate_seconds(plan: GemmPlan, rates: Rates, depth: int = LONE_DEPTH,
                     layout: tuple[bool, bool] = (False, False)) -> float:
    """Seconds one device takes for `plan` under `rates`, at most `depth` tiles queued
    (see the module docstring). layout: whether A and B are stored transposed (op(A) = A.T),
    which sets the row width of each piece's copy."""
    hb = _size(plan.host_dtype)
    rate = rates.flops[plan.compute]
    kspans = spans(plan.k, plan.tile_k)
    pspans = [spans(k1 - k0, plan.piece_k) for k0, k1 in kspans]
    avail: dict = {}
    link = comp = d2h = issue = 0.0

    def need(key, nbytes, factor):
        nonlocal link
        if key not in avail:
            link = max(link, issue) + nbytes / (rates.h2d * factor)
            avail[key] = link
        return avail[key]

    ta, tb = layout
    ab = _size(plan.acc_dtype)
    known: dict = {}   # (rows, cols, kk) -> factors: few distinct shapes, many pieces

    def factors(t, kk):
        """Row-width factors of A's and B's piece of tile t, kk deep."""
        key = (t.rows, t.cols, kk)
        if key not in known:
            fa = (row_factor(t.rows * hb, t.rows == plan.m) if ta
                  else row_factor(kk * hb, kk == plan.k))
            fb = (row_factor(kk * hb, kk == plan.k) if tb
                  else row_factor(t.cols * hb, t.cols == plan.n))
            known[key] = (fa, fb)
        return known[key]

    def gemm(t, kb, q0, q1, ready):
        nonlocal comp
        k = pspans[kb][q1 - 1][1] - pspans[kb][q0][0]
        acc_rw = 2.0 * t.rows * t.cols * ab / rates.hbm
        comp = max(comp, ready) + 2.0 * t.rows * t.cols * k / rate + acc_rw + rates.launch

    def run(t, kb, q0, q1):
        """Like DeviceWorker._gemm: a piece loaded now gets its own GEMM, runs of pieces
        already on the device are merged into one."""
        seg, seg_ready = None, 0.0
        for p in range(q0, q1):
            ka, kb_ = ("A", t.i, kb, p), ("B", t.j, kb, p)
            fresh = ka not in avail or kb_ not in avail
            kk = pspans[kb][p][1] - pspans[kb][p][0]
            fa, fb = factors(t, kk)
            ready = max(need(ka, t.rows * kk * hb, fa), need(kb_, t.cols * kk * hb, fb))
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
