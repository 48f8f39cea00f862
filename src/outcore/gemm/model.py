"""A timing model of one device running a plan: what the planner chooses the schedule by.

One h2d link, one compute engine, one d2h link, each serial: pieces load in the order they
are first needed, a GEMM starts when its pieces have landed (and takes the next pieces too
when they land before it can start: `merged_end`), a GEMM's rate depends on its shape
(`kernel_rate`), a tile's copy-out starts when its last GEMM is done. The host enqueues
tile i's loads only once tile i - depth has computed (the worker's flow control). It
ignores cache eviction (it is only asked when everything fits) and per-call overheads; its
rates only steer the schedule, a wrong guess costs speed, never correctness. A piece that
is not contiguous in host memory is a 2-D copy of rows, and narrow rows cross PCIe well
below the contiguous rate (`ROW_FACTOR`), and so do C tiles narrower than C going out
(`D2H_ROW_FACTOR`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .planned import GemmPlan
from .schedule import LONE_DEPTH
from .tiles import spans


# 2-D host-to-device copies: row bytes -> fraction of the contiguous rate, while the d2h
# link is busy too (the case of a GEMM). Fitted to bench/results/gemm-probe-h200.json
# (tf32/bf16 at 32768: 8 and 16 KiB rows ran at ~32 GB/s per direction; 32 KiB rows
# ~40 GB/s); wider rows (not measured) are assumed to gain slowly.
ROW_FACTOR = ((8 << 10, 0.55), (16 << 10, 0.6), (32 << 10, 0.75), (64 << 10, 0.8),
              (128 << 10, 0.9), (1 << 20, 1.0))


# The same for C tiles going out (rows of tile_n elements; contiguous when the tile is the
# whole width of C), fitted to the products, not to the copies alone. On the H200 a C tile
# of 16 KiB rows costs a bf16 product more than its copy's rate says: the copies alone
# (bench/diag/copy_rows.py, copy-rows-h200.json) take 16 KiB rows out at 46.9 GB/s beside
# copies in, 0.93 of contiguous rows, yet the NT training shapes at 16384 features ran
# 1.08x, 1.16x and 1.22x faster in 8192-wide tiles than in the 4096-wide ones this model
# chose without this table (gemm-h200-s19-{mid,off}{1,2}.json; what the extra cost is,
# per-tile work or the copies' interplay, the model does not say). 32 KiB rows at 0.97: at
# 0.87 the TN shape t32768-f16384 went to one 16384^2 tile, 0.93x (-wide{1,2}.json).
D2H_ROW_FACTOR = ((16 << 10, 0.73), (32 << 10, 0.97), (64 << 10, 1.0))
# Whether estimate_seconds charges C's narrow rows (D2H_ROW_FACTOR) at all: a setting for
# bench A/Bs (False: the model of sessions 11-18, C out at the contiguous rate).
D2H_ROWS = True


def settings() -> tuple:
    """The settings above that steer a plan: part of the plan cache's key."""
    return D2H_ROWS, tuple(D2H_ROW_FACTOR), tuple(ROW_FACTOR), LONE_DEPTH


def row_factor(row_bytes: int, contiguous: bool = False, table=ROW_FACTOR) -> float:
    """Fraction of the contiguous rate a 2-D copy of rows of `row_bytes` reaches (`table`:
    ROW_FACTOR for copies in, D2H_ROW_FACTOR for C's copies out)."""
    if contiguous or row_bytes >= table[-1][0]:
        return 1.0
    if row_bytes <= table[0][0]:
        return table[0][1] * row_bytes / table[0][0]
    for (b0, f0), (b1, f1) in zip(table, table[1:]):
        if row_bytes <= b1:
            return f0 + (f1 - f0) * (row_bytes - b0) / (b1 - b0)
    return 1.0


# GEMM kernels (acc += a @ b) by shape, fp32 on the H200 (bench/results/gemm-probe-h200.json,
# session 11): a smaller C tile and a shallower K run slower, 48.9 TFLOP/s at 4096 x 4096 x
# 2048, 51.3 at 4096 x 4096 x 16384, 52.3 at 8192 x 8192 x 16384, 52.8 at 16384^3. Fitted as
# peak x (1 - edge / rows - edge / cols) x k / (k + depth): within 2% of those and 5 more
# shapes but one (16384^2 x 1024: 4% low). Other computes: their flat rate (bf16's measured
# rates do not follow the shape smoothly).
# tf32x3 (split.py's three GEMMs, the large one in BIG_CHUNK-deep calls): 45 shapes of 512
# to 8192 rows, 4096 to 16384 columns, K 2048 to 16384 (bench/diag/x3_shapes.py) with
# BIG_CHUNK 512, fitted as above: peak 106.4 TFLOP/s, within 17% of every shape
# (x3-shapes-h200-k512.json, session 26). It changed 5 of the bench's 20 tf32x3 plans, and
# each new plan ran 1.02-1.26x faster than the old fit's, alternating in one process
# (tile-ab-h200-x3fit.json, session 27).
KERNEL_FIT = {"fp32": (57.0, 140.0), "tf32x3": (140.0, 400.0)}   # compute -> (edge, depth)


def kernel_rate(rates: "Rates", compute: str, rows: int, cols: int, k: int) -> float:
    """FLOP/s of one rows x cols x k GEMM accumulated into a C tile."""
    peak = rates.flops[compute]
    if compute not in KERNEL_FIT:
        return peak
    edge, depth = KERNEL_FIT[compute]
    return peak * max(0.5, 1.0 - edge / rows - edge / cols) * k / (k + depth)


@dataclass(frozen=True)
class Rates:
    """Per-device rates the schedule is chosen with (H200 figures from DESIGN.md; fp32's
    and tf32x3's are the peaks of `kernel_rate`'s fits)."""
    flops: dict = field(default_factory=lambda: {
        "fp64": 60e12, "fp32": 53.6e12, "tf32": 414e12, "tf32x3": 106.4e12,
        "bf16": 801e12})
    h2d: float = 55e9
    d2h: float = 55e9
    hbm: float = 3.0e12          # device memory, read + write of an accumulator per GEMM
    launch: float = 8e-6         # per GEMM call


def _size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def merged_end(ready: Sequence[float], s: int, comp: float) -> int:
    """End (exclusive) of the GEMM starting at piece s, the one rule of the worker and of
    this model: pieces land at `ready` (in order), compute is free at `comp`, and the GEMM
    takes each next piece that has landed by the time it can start (see clock.py)."""
    start = max(comp, ready[s])
    e = s + 1
    while e < len(ready) and ready[e] <= start:
        e += 1
    return e


def estimate_seconds(plan: GemmPlan, rates: Rates, depth: int = LONE_DEPTH,
                     layout: tuple[bool, bool] = (False, False)) -> float:
    """Seconds one device takes for `plan` under `rates`, at most `depth` tiles queued
    (see the module docstring). layout: whether A and B are stored transposed (op(A) = A.T),
    which sets the row width of each piece's copy.

    The planner runs this for every candidate (about 160 of them for bf16 at 32768, some
    with thousands of pieces), so the per-piece work is kept to list lookups: each piece's
    copy time is worked out once per panel shape, and a panel's landing times are kept in
    a list by piece."""
    hb = _size(plan.host_dtype)
    kspans = spans(plan.k, plan.tile_k)
    pspans = [plan.pieces(k1 - k0) for k0, k1 in kspans]
    starts = [[p0 for p0, _ in ps] for ps in pspans]
    ends = [[p1 for _, p1 in ps] for ps in pspans]
    link = comp = d2h = issue = 0.0
    ta, tb = layout
    a_rows = plan.a_rows and not ta   # as DeviceWorker._by_rows
    b_rows = plan.b_rows and tb
    ab = _size(plan.acc_dtype)
    h2d = rates.h2d
    # (panel rows or cols, K block) -> each piece's copy time (a list), or the whole
    # block's (a float) where the block goes by rows
    a_cost: dict = {}
    b_cost: dict = {}
    # (panel index, K block) -> each piece's landing time (None: not loaded), or the
    # block's where it goes by rows
    a_land: dict = {}
    b_land: dict = {}
    gemm_s: dict = {}   # (rows, cols, k) -> seconds of that GEMM, accumulator traffic and
    #                     launch included, after its pieces have landed

    def costs(operand: str, size: int, kb: int):
        """Copy seconds of the pieces of a `size`-row A panel (or `size`-col B panel) in
        K block kb: nbytes / (h2d * row factor), as the link adds them up."""
        kl = kspans[kb][1] - kspans[kb][0]
        if a_rows if operand == "A" else b_rows:
            return size * kl * hb / (h2d * row_factor(kl * hb, kl == plan.k))
        out = []
        for p0, p1 in pspans[kb]:
            kk = p1 - p0
            if operand == "A":
                f = row_factor(size * hb, size == plan.m) if ta else \
                    row_factor(kk * hb, kk == plan.k)
            else:
                f = row_factor(kk * hb, kk == plan.k) if tb else \
                    row_factor(size * hb, size == plan.n)
            out.append(size * kk * hb / (h2d * f))
        return out

    def panel(lands: dict, cost_of: dict, operand: str, idx: int, size: int, kb: int):
        """(landing times, copy seconds) of one panel's pieces in K block kb: lists by
        piece (a landing time None until loaded), or floats where the block goes by rows
        (the landing time None until loaded)."""
        cost = cost_of.get((size, kb))
        if cost is None:
            cost = cost_of[(size, kb)] = costs(operand, size, kb)
        if isinstance(cost, float):
            return lands.get((idx, kb)), cost
        times = lands.get((idx, kb))
        if times is None:
            times = lands[(idx, kb)] = [None] * len(cost)
        return times, cost

    def load(lands: dict, idx: int, kb: int, times, cost, p: int) -> float:
        """Piece p's landing time, loading it (or its whole block, by rows) if needed."""
        nonlocal link
        if isinstance(cost, float):
            t = lands.get((idx, kb))
            if t is None:
                link = max(link, issue) + cost
                t = lands[(idx, kb)] = link
            return t
        t = times[p]
        if t is None:
            link = max(link, issue) + cost[p]
            t = times[p] = link
        return t

    def run(t, kb, q0, q1):
        """Like DeviceWorker._gemm: the pieces' loads (whole panels: a strip's tile needs
        all of its panel), then GEMMs over runs of them cut by merged_end."""
        nonlocal comp
        pr = min(plan.tile_m, plan.m - t.i * plan.tile_m)
        pc = min(plan.tile_n, plan.n - t.j * plan.tile_n)
        at, ac = panel(a_land, a_cost, "A", t.i, pr, kb)
        bt, bc = panel(b_land, b_cost, "B", t.j, pc, kb)
        a_all = at[q0:q1] if isinstance(ac, list) else None
        b_all = bt[q0:q1] if isinstance(bc, list) else None
        if (at is not None and bt is not None and (a_all is None or None not in a_all)
                and (b_all is None or None not in b_all)):
            # everything has landed already: no link time to add
            ready = list(map(max, a_all or [at] * (q1 - q0), b_all or [bt] * (q1 - q0)))
        else:
            # pieces load in order, A's before B's at each piece (the worker's order)
            ready = [max(load(a_land, t.i, kb, at, ac, p), load(b_land, t.j, kb, bt, bc, p))
                     for p in range(q0, q1)]
        s, n = 0, len(ready)
        while s < n:
            e = n if s == 0 and max(ready) <= comp else merged_end(ready, s, comp)
            k = ends[kb][q0 + e - 1] - starts[kb][q0 + s]
            key = (t.rows, t.cols, k)
            g = gemm_s.get(key)
            if g is None:
                flops = 2.0 * t.rows * t.cols * k
                acc_rw = 2.0 * t.rows * t.cols * ab / rates.hbm
                g = gemm_s[key] = (flops / kernel_rate(rates, plan.compute, t.rows, t.cols, k),
                                   acc_rw)
            comp = max(comp, max(ready[s:e])) + g[0] + g[1] + rates.launch
            s = e

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
        out_f = (row_factor(t.cols * hb, t.cols == plan.n, D2H_ROW_FACTOR) if D2H_ROWS
                 else 1.0)
        d2h = max(d2h, comp) + t.rows * t.cols * hb / (rates.d2h * out_f)
    return max(comp, d2h)
