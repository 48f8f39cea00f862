"""Sizing one out-of-core product before anything is allocated.

    plan = make_plan(m, n, k, host_dtype=torch.float32, compute="bf16",
                     budget=parse_bytes("8GiB"), n_devices=2, device_type="cuda")

The plan (planned.py's GemmPlan: what one device holds, all of it counted against
`budget`) is the largest tile whose working set fits, its K cut into blocks where whole
panels do not, and a cache of as many blocks as the rest of the budget holds.

The schedule is chosen here too (tile order, and for one device whether to stream the
first part of K over all tiles first, see `estimate_seconds`), from the device rates in
`Rates`: they only steer the schedule; a wrong guess costs speed, never correctness.
"""

from __future__ import annotations

import numbers
from dataclasses import replace
from functools import lru_cache

import torch

from ..errors import OutcoreError
from ..units import fmt_bytes
from .computes import cached_itemsize
from .model import Rates, estimate_seconds
from .planned import GemmPlan, _fixed_bytes, _size, operand_bytes
from .tiles import cdiv

PIECE_BYTES = 32 << 20      # one copy (and event) per 32 MiB: compute starts early enough
MIN_TILE = {"cuda": 64, "cpu": 4}
DEFAULT_TILE = {"cuda": 4096, "cpu": 256}
MIN_WIDE_TILES = 16         # C tiles a product needs before a lone device widens its tiles
MIN_PIECES = 4              # K pieces a tile keeps at least when the planner deepens them
MAX_STRIPS = 4              # row strips the last tile of a lone device is cut into
# Opt-in, not measured yet (session 13, for bench/gemm_probe.py): every block's first copy
# piece this many rows of K deep (0: the plan's piece). fp32-16384 in 8192-wide tiles waits
# about 3 ms for its first 2048-deep pieces; a 512-deep first piece would start it sooner.
FIRST_PIECE = 0
MIN_STRIP = {"cuda": 512, "cpu": 4}   # rows a strip keeps at least (its GEMM stays large)
# Accumulators of a lone GPU's plan without a prologue, where the budget holds them. With 2,
# a tile's GEMMs wait for the copy out of the tile two before it: at bf16-32768 on the H200
# the compute stream idled 3.4 ms so near the end, behind C's copies out (gemm-probe-h200-
# s16.json). Session 16, 7 pairs of runs against 2: bf16-32768 faster in all 7 (0.2-1.4%,
# about 0.8% on average), fp32-16384 the same (gemm-h200-s16-acc*.json and the logs
# gemm-h200-s16-accs-ab2-*.log, whose JSON files did not come back).
LONE_ACCS = 4
# Several GPUs: the tiles a lone GPU would take, the order's last ones in strips that the
# queue hands out last (shared.py), instead of tiles small enough to balance throughout.
# Session 14, two H200s at fp32-32768: 2048-wide tiles (the rule below) ran 94.0 TFLOP/s,
# 1.79x one GPU in 8192-wide ones. False: that rule again.
SHARED_LONE_TILES = True


def _piece(tm, tn, tk, host_dtype) -> int:
    pk = max(1, PIECE_BYTES // (max(tm, tn) * _size(host_dtype)))
    if pk >= 256:
        pk -= pk % 256
    return min(pk, tk)


def _tile_arg(tile):
    """None | T | (tm, tn) | (tm, tn, tk) | (tm, tn, tk, pk) -> 4 values (None = auto).
    Any integer type counts (numpy's too); floats, strings and bools do not."""
    if tile is None:
        return None, None, None, None
    vals = (tile, tile) if isinstance(tile, numbers.Integral) else (
        tuple(tile) if isinstance(tile, (tuple, list)) else ())
    if not 2 <= len(vals) <= 4 or not all(isinstance(v, numbers.Integral)
                                          and not isinstance(v, bool) and v > 0 for v in vals):
        raise OutcoreError(f"tile={tile!r} is not valid: give a positive int T (T x T tiles) or "
                           "a tuple (rows, cols[, depth[, copy piece depth]]) of positive ints")
    return tuple(int(v) for v in vals) + (None,) * (4 - len(vals))


def _fit(tm, tn, k, tk_req, pk_req, host_dtype, compute, budget):
    """(tile_k, piece_k, cache room) for tm x tn tiles within `budget`, or None.

    Whole-K panels when four fit (two tiles' A and B: the next loads while this computes),
    else K cut into blocks so that four (at worst two) fit.
    """
    row, cb = max(tm, tn), cached_itemsize(compute)
    tk = min(tk_req, k) if tk_req else k
    if not tk_req:
        pk = pk_req or _piece(tm, tn, tk, host_dtype)
        room = budget - _fixed_bytes(tm, tn, min(pk, tk), 2, host_dtype, compute)
        if room < 4 * row * k * cb:
            tk = room // (4 * row * cb) or room // (2 * row * cb)
            if tk >= 256:
                tk -= tk % 256
            tk = min(tk, k)
    if tk < 1:
        return None
    pk = min(pk_req or _piece(tm, tn, tk, host_dtype), tk)
    room = budget - _fixed_bytes(tm, tn, pk, 2, host_dtype, compute)
    return (tk, pk, room) if room >= 2 * row * tk * cb else None


def make_plan(m: int, n: int, k: int, *, host_dtype: torch.dtype, compute: str, budget: int,
              tile=None, n_devices: int = 1, device_type: str = "cuda",
              rates: Rates | None = None, layout: tuple[bool, bool] = (False, False)) -> GemmPlan:
    """Choose tiles, cache size and order so that one device's buffers fit `budget` bytes.

    layout: whether A and B are stored transposed (it sets the row width of the copies).
    Raises OutcoreError when the budget is too small for one tile's working set.

    Plans are remembered (the last PLAN_CACHE of them, with the default rates): the search
    is serial before the first copy (session 20, development CPU: 0.68 s for bf16 at
    32768, 0.47 s tf32, 0.08 s fp32; GemmStats.plan_s reports it), and a training loop asks
    for the same shapes at every step. The benches time cached plans (their warm-up run
    makes them).
    """
    tile = _tile_arg(tile)   # hashable, and a bad tile is reported before any lookup
    from . import lone, model, shared
    args = (m, n, k, host_dtype, compute, budget, tile, n_devices, device_type, tuple(layout),
            lone.FLAT_TILES, FIRST_PIECE, SHARED_LONE_TILES, MAX_STRIPS,
            MIN_STRIP.get(device_type), lone.settings(), model.settings(), LONE_ACCS,
            (PIECE_BYTES, MIN_TILE.get(device_type), DEFAULT_TILE.get(device_type)),
            shared.settings())
    if rates is not None:
        return _search(*args, rates)
    return _cached_search(*args)


PLAN_CACHE = 256


@lru_cache(maxsize=PLAN_CACHE)
def _cached_search(*args) -> GemmPlan:
    return _search(*args, None)


def _search(m, n, k, host_dtype, compute, budget, tile, n_devices, device_type, layout,
            flat, first_piece, shared_lone, _max_strips, _min_strip, _lone_settings,
            _model_settings, lone_accs, _settings, _shared_settings, rates) -> GemmPlan:
    """make_plan's work, on its normalized arguments (the strip settings, read by
    with_strips, the tile and piece sizes, and the modules' settings() are in them only
    to key the plan cache: a plan made under one value is never served under another)."""
    plan = None
    if n_devices > 1 and device_type == "cuda" and tile[0] is None and shared_lone:
        from .shared import shared   # shared.py imports this module
        plan = shared(_search_tiles(m, n, k, host_dtype, compute, budget, tile, 1,
                                    device_type, layout, flat, rates), n_devices)
    if plan is None:
        plan = _search_tiles(m, n, k, host_dtype, compute, budget, tile, n_devices,
                             device_type, layout, flat, rates)
    if (lone_accs > plan.n_acc and n_devices == 1 and device_type == "cuda"
            and not plan.prologue):
        more = replace(plan, n_acc=lone_accs)
        plan = more if more.device_bytes() <= budget else plan
    if not 0 < first_piece < plan.piece_k:
        return plan
    plan = replace(plan, first_piece=first_piece)
    if plan.est_seconds is None:
        return plan
    return replace(plan, est_seconds=estimate_seconds(plan, rates or Rates(), layout=layout))


def _search_tiles(m, n, k, host_dtype, compute, budget, tile, n_devices, device_type, layout,
                  flat, rates) -> GemmPlan:
    """The tiles, pieces and order of make_plan's plan (its first piece aside)."""
    tm_req, tn_req, tk_req, pk_req = tile
    cb = cached_itemsize(compute)
    if tm_req is not None:
        tm, tn = min(tm_req, m), min(tn_req, n)
        fit = _fit(tm, tn, k, tk_req, pk_req, host_dtype, compute, budget)
    else:
        t, t_min, fit = DEFAULT_TILE.get(device_type, 4096), MIN_TILE.get(device_type, 4), None
        if n_devices > 1:
            # enough tiles that devices of unequal speed can balance: the last tiles of a
            # slow device set the end, so they should be short
            while t > 2048 and cdiv(m, t) * cdiv(n, t) < 64 * n_devices:
                t //= 2
        while t >= t_min:
            tm, tn = min(t, m), min(t, n)
            f = _fit(tm, tn, k, tk_req, pk_req, host_dtype, compute, budget)
            if f is not None and (fit is None or f[0] >= min(k, 256)):
                fit = (f, tm, tn)   # the largest tile that fits, or a smaller one with deeper K
            if fit is not None and fit[0][0] >= min(k, 256):
                break
            t //= 2
        if fit is not None:
            fit, tm, tn = fit
    if fit is None:
        row = max(tm, tn)
        need = _fixed_bytes(tm, tn, 1, 2, host_dtype, compute) + 2 * row * cb
        raise OutcoreError(
            f"gpu_memory={fmt_bytes(budget)} is too small for one {tm}x{tn} tile's working set "
            f"(at least {fmt_bytes(need)}: two accumulators and one block of A and B): raise "
            "gpu_memory" + (" or pass a smaller tile" if tm_req is not None else ""))
    tk, pk, room = fit
    mt, nt, nk = cdiv(m, tm), cdiv(n, tn), cdiv(k, tk)
    total_blocks = nk * (mt + nt)
    # every block cached when all of op(A) and op(B) fit at their own sizes (a whole-width
    # strip's A block is far smaller than its B block), else slots of the larger size
    n_slots = (total_blocks if room >= operand_bytes(m, n, k, compute)
               else min(room // (max(tm, tn) * tk * cb), total_blocks))
    plan = GemmPlan(m, n, k, tm, tn, tk, pk, compute, host_dtype, n_slots=int(n_slots), n_acc=2,
                    budget=budget)
    lone_device = n_devices == 1
    if lone_device:
        plan = with_strips(plan, device_type)
    if n_slots >= total_blocks:
        rates = rates or Rates()
        from .lone import flatter, maybe_prologue, wider   # lone.py imports this module
        best = maybe_prologue(plan, n_devices, device_type, rates,
                              piece_fixed=pk_req is not None, layout=layout)
        if tm_req is None and n_devices == 1 and device_type == "cuda":
            best = wider(best, rates, layout)
            if flat:
                best = flatter(best, rates, layout)
        return best
    # Cache-limited: keep a band of panels of one operand resident, stream the other.
    g = max(1, n_slots // nk - 2)
    rows_traffic = m * k + k * n * cdiv(mt, min(g, mt))
    cols_traffic = k * n + m * k * cdiv(nt, min(g, nt))
    if rows_traffic <= cols_traffic:
        plan = replace(plan, order="rows", band=min(g, mt))
    else:
        plan = replace(plan, order="cols", band=min(g, nt))
    return with_strips(plan, device_type) if lone_device else plan


def with_strips(plan: GemmPlan, device_type: str) -> GemmPlan:
    """`plan` with its last tile cut into row strips of at least MIN_STRIP rows (at most
    MAX_STRIPS): for one device, whose tiles come in the plan's order."""
    rows = replace(plan, strips=1).tiles()[-1].rows
    strips = max(1, min(MAX_STRIPS, rows // MIN_STRIP.get(device_type, 4)))
    n_acc = max(plan.n_acc, plan.mt * plan.nt + strips - 1) if plan.prologue else plan.n_acc
    return replace(plan, strips=strips, n_acc=n_acc)
