"""One device holding everything (the whole product fits its cache): the schedule's
shape, chosen by the timing model (model.py).

`maybe_prologue` picks the copy piece and whether to stream the first pieces of K over
all tiles; `wider` tries tiles twice as large; `flatter` (FLAT_TILES) tiles wider
than tall or taller than wide, and whole-width or (a transposed A) whole-height strips.
Each keeps a candidate only when the model says it is clearly faster.
"""

from __future__ import annotations

from dataclasses import replace

from .model import KERNEL_FIT, Rates, estimate_seconds
from .plan import MIN_PIECES, MIN_WIDE_TILES, _fit, with_strips
from .planned import GemmPlan, operand_bytes
from .tiles import cdiv

# On by default since session 11's probe (bench/results/gemm-probe-h200.json): bf16 at
# 32768 took 190 ms in the planner's flat pick (2048 x 8192) and 186 in 4096 x 16384 tiles,
# against 204 ms in its square pick (8192 x 8192); tf32 the same 221-223 ms either way.
# bench/gemm.py --square-tiles turns it off.
FLAT_TILES = True
# The short sides of the flat tiles flatter() tries, and the heights of its whole-width
# strips. Strips 1024 rows tall since session 19: the model then takes them in 15 of the
# 19 bf16 cases of bench/gemm.py (a shorter tail after the last copy in), and they ran
# faster in two alternating rounds (gemm-h200-s19-side{1024,2048}-{1,2}.json, where flat
# tiles 1024 wide were candidates too and never chosen): bf16-32768 1.04x (0.876 of the
# bound against 0.843), the training shapes 1.00-1.06x; fp32 and tf32 keep their plans.
# Each candidate costs a model run, so flat tiles keep their three sides.
FLAT_SIDES: tuple[int, ...] = (2048, 4096, 8192)
STRIP_ROWS: tuple[int, ...] = (1024, 2048, 4096, 8192)
# Whole-width strips SHORT_STRIP rows tall are candidates too where M is at most
# SHORT_STRIP_MAX_M (0: nowhere). Session 19's A/B of 512-row strips on every bf16 case
# (gemm-h200-s19b-side{512,1024}-{1,2}.json): at 16384 tokens 1.04-1.11x (NN at 16384
# features 0.99x), at 32768-65536 tokens with 8192 features 0.89-0.96x.
SHORT_STRIP = 512
SHORT_STRIP_MAX_M = 16384
# The shortest whole-width strips a compute may take. Session 20: once the cache took each
# block at its own size, tf32 at 32768 could hold 1024-row strips with a prologue (32
# accumulators), the model's pick by 1%, and they ran 0.92x the 2048-row ones
# (bench/diag/exact_cache.py, exact-cache-h200.json).
MIN_STRIP_ROWS = {"tf32": 2048}
PIECE_FACTORS = (1, 2, 4, 8)          # copy pieces the model weighs, x the default piece
# Computes whose plans may copy A's panels whole, in contiguous chunks of rows (plan.a_rows)
# instead of K pieces (2-D copies of rows of 8-32 KiB: 34-49 GB/s alone on the H200 against
# 55 for 8-16 KiB). Session 16 on the H200: the bf16 NN training shapes 1.02-1.24x faster
# with it, NT 1.03-1.07x, bf16-32768 the same (gemm-h200-s16-rows.json against -norows);
# fp32 no faster (-fp32rows against -fp32pieces: fp32-16384 179.6 ms against 177.5).
A_ROWS = ("bf16",)
# The same for a transposed B's panels (stored N x K: the NT training shapes), where K is
# at least B_ROWS_MIN_K: session 16 measured the bf16 NT shapes at K = N = 16384 5-8%
# faster with it, and at 8192 2-9% slower (gemm-h200-s16-brows.json against
# -nobrows.json). Default since session 18, for K >= 16384 only: the NT shapes at 16384
# features 1.04-1.14x faster in its A/B (gemm-h200-s18-brows*.json against -nobrows*).
B_ROWS: tuple[str, ...] = ("bf16",)
B_ROWS_MIN_K = 16384
WIDE_PIECE_FACTORS = PIECE_FACTORS + (16, 32)   # for whole-width row strips
# Computes whose wider candidates need only FEW_WIDE_TILES C tiles, not MIN_WIDE_TILES:
# where compute, not the link, bounds the product, few large tiles still overlap their
# copies (fp32-16384 in 8192-wide tiles, 4 of them, ran 175.0-175.5 ms in two probes
# against 175.9-176.6 for the planner's 4096-wide pick: gemm-probe-h200-s14a.json,
# gemm-probe-h200.json). Opt-in: session 18's A/B over fp32-16384 and the 18 fp32 training
# shapes (bench/diag/fp32_wide.py, fp32-wide-h200.json) had the 16384-feature shapes within
# 1% either way and the 8192-feature ones 1.4-3.1% slower with ("fp32",).
FEW_WIDE: tuple[str, ...] = ()
FEW_WIDE_TILES = 4
# Computes whose plans with a transposed A (stored K x M) may take whole-height column
# strips of C, however few (flatter), where M is at least TALL_TA_MIN_M. Session 18's A/B
# of the bf16 TN training shapes (gemm-h200-s18-tall{1,2}.json against -notall{1,2}):
# at M = 16384 1.06x, 1.17x and 1.24x (the planner's other tiles copy A in 8 KiB rows),
# at M = 8192 0.89-0.93x (a single 8192 x 8192 tile, against 4096-wide tiles whose A rows
# are 16 KiB).
# Their last tile stays in row strips: session 34 cut it into column strips of 2048, each
# loading its own columns of B (packed contiguous by a host thread, or not), and the TN
# shape at 16384 tokens and features ran 59-62 ms against 52 (gemm-h200-s34-*.json): the
# strips' C goes out in 8 KiB rows, and all of C can only go out after the first tile's
# whole A and B panel have landed, so its narrower rows out lengthened the product.
TALL_TA: tuple[str, ...] = ("bf16",)
TALL_TA_MIN_M = 16384


def settings() -> tuple:
    """The module's settings that steer a plan (FLAT_TILES aside, which plan.py passes on
    by itself): part of the plan cache's key, so a plan made under one setting is never
    served under another."""
    return (tuple(A_ROWS), tuple(B_ROWS), B_ROWS_MIN_K, tuple(FEW_WIDE), FEW_WIDE_TILES,
            tuple(TALL_TA), TALL_TA_MIN_M, tuple(FLAT_SIDES), tuple(STRIP_ROWS), SHORT_STRIP,
            SHORT_STRIP_MAX_M, tuple(sorted(MIN_STRIP_ROWS.items())), MIN_PIECES,
            MIN_WIDE_TILES, tuple(PIECE_FACTORS), tuple(WIDE_PIECE_FACTORS))


def whole_k(plan: GemmPlan, tm: int, tn: int, rates: Rates,
            layout: tuple[bool, bool], fewest: int | None = None) -> GemmPlan | None:
    """`plan`'s product in tm x tn tiles with whole-K panels and every block cached, its
    piece and prologue chosen by the model; None when that does not fit the budget or
    makes fewer tiles than `fewest` (default MIN_WIDE_TILES, FEW_WIDE_TILES for FEW_WIDE:
    copies and compute then barely overlap, measured slower)."""
    m, n, k = plan.m, plan.n, plan.k
    if fewest is None:
        fewest = FEW_WIDE_TILES if plan.compute in FEW_WIDE else MIN_WIDE_TILES
    if cdiv(m, tm) * cdiv(n, tn) < fewest:
        return None
    # whole K asked for: _fit's own pick wants four blocks of the larger size in the
    # budget, where every block cached at its own size is what this plan holds
    f = _fit(tm, tn, k, k, None, plan.host_dtype, plan.compute, plan.budget)
    if f is None:
        return None
    blocks = cdiv(m, tm) + cdiv(n, tn)
    if f[2] < operand_bytes(m, n, k, plan.compute):   # every block cached, at its own size
        return None
    cand = with_strips(GemmPlan(m, n, k, tm, tn, k, f[1], plan.compute, plan.host_dtype,
                                n_slots=blocks, n_acc=2, budget=plan.budget), "cuda")
    # whole-width strips: a 32 MiB piece of a 32768-wide B row is only 256 rows deep, so
    # their pieces may grow to 1 GiB (the probe's best: 8192 deep at 32768)
    factors = WIDE_PIECE_FACTORS if tn == n else PIECE_FACTORS
    return maybe_prologue(cand, 1, "cuda", rates, layout=layout, factors=factors)


def better(cand: GemmPlan | None, plan: GemmPlan, margin: float = 0.02) -> bool:
    """The model says `cand` is clearly (by `margin`) faster than `plan`."""
    return cand is not None and cand.est_seconds is not None and \
        cand.est_seconds < (1.0 - margin) * plan.est_seconds


def wider(plan: GemmPlan, rates: Rates, layout: tuple[bool, bool]) -> GemmPlan:
    """One device holding everything: tiles twice as wide when the model says so. Wider
    tiles make wider copy rows (a B piece's rows are a tile wide), which 2-D copies need
    to reach the link's rate; the price is a longer wait for the first pieces."""
    if plan.est_seconds is None:
        return plan
    tm, tn = min(2 * plan.tile_m, plan.m), min(2 * plan.tile_n, plan.n)
    if (tm, tn) == (plan.tile_m, plan.tile_n):
        return plan
    wide = whole_k(plan, tm, tn, rates, layout)
    return wide if better(wide, plan, _margin(plan)) else plan


def _margin(plan: GemmPlan) -> float:
    """How much faster the model must say a candidate is: 1% where it knows the kernels'
    rates by shape (fp32, measured: 8192^2 tiles 2.5% faster than 4096^2), elsewhere 2%,
    its noise floor."""
    return 0.01 if plan.compute in KERNEL_FIT else 0.02


def flatter(plan: GemmPlan, rates: Rates, layout: tuple[bool, bool]) -> GemmPlan:
    """FLAT_TILES: tiles 2x or 4x wider than tall, or taller than wide, or whole-width
    strips, when the model says so; for a transposed A (TALL_TA) whole-height strips too.
    A flat tile copies wide rows of B and of its C, and the growing order then ends on a
    panel that few tiles need: a shorter tail of C going out after the last copy in."""
    if plan.est_seconds is None:
        return plan
    best = plan

    def consider(tm: int, tn: int, fewest: int | None = None) -> None:
        nonlocal best
        if (tm, tn) != (best.tile_m, best.tile_n):
            cand = whole_k(plan, tm, tn, rates, layout, fewest)
            if better(cand, best):
                best = cand

    heights = set(STRIP_ROWS) | ({SHORT_STRIP} if plan.m <= SHORT_STRIP_MAX_M else set())
    heights = {t for t in heights if t >= MIN_STRIP_ROWS.get(plan.compute, 0)}
    for t in sorted(set(FLAT_SIDES) | heights):
        shapes = [(t, 2 * t), (t, 4 * t), (2 * t, t), (4 * t, t)] if t in FLAT_SIDES else []
        if t in heights:
            # whole-width row strips, whose B pieces are whole rows of a row-major B
            # (contiguous copies; session 13's probe: bf16 at 32768 in 184 ms against 190)
            shapes.append((t, plan.n))
        for tm, tn in shapes:
            consider(min(tm, plan.m), min(tn, plan.n))
    if layout[0] and plan.compute in TALL_TA and plan.m >= TALL_TA_MIN_M:
        # A stored K x M (op(A) = A.T, the weight gradient's shape): C tiles as whole-height
        # column strips make each of A's K pieces whole rows of A, one contiguous copy,
        # where an m-row panel's pieces are 2-D copies of m x 4-byte rows. Few tiles
        # still overlap here: each streams its K pieces, deep in this shape.
        for t in (2048, 4096, 8192, plan.n):
            consider(plan.m, min(t, plan.n), fewest=1)
    return best


def maybe_prologue(plan: GemmPlan, n_devices: int, device_type: str, rates: Rates,
                   piece_fixed: bool = False,
                   layout: tuple[bool, bool] = (False, False),
                   factors: tuple[int, ...] = PIECE_FACTORS) -> GemmPlan:
    """One device holding everything: let the model pick the copy piece size (32..256 MiB:
    bigger pieces, fewer and larger GEMMs; kept when the caller forced it with `tile`) and
    whether to stream the first pieces of K over all tiles first (good when link and
    compute are nearly balanced, e.g. tf32; the accumulators of every tile must fit as
    well)."""
    if n_devices != 1 or device_type != "cuda" or plan.nk != 1:
        return plan
    best, best_t = plan, estimate_seconds(plan, rates, layout=layout)
    factors = (1,) if piece_fixed else factors
    b_rows = plan.compute in B_ROWS and layout[1] and plan.k >= B_ROWS_MIN_K
    by_rows = not piece_fixed and (plan.compute in A_ROWS and not layout[0] or b_rows)
    # at least MIN_PIECES pieces a tile (unless forced): a whole-K piece leaves nothing to
    # overlap a tile's first GEMM with (the training shapes ran slower that way)
    deepest = plan.tile_k if piece_fixed else max(plan.piece_k, plan.tile_k // MIN_PIECES)
    for pk in sorted({min(f * plan.piece_k, deepest) for f in factors}):
        q = cdiv(plan.tile_k, pk)
        # fp32/fp64 are compute-bound on the H200: a prologue never measured faster there
        pro = (0, q // 4, q // 2) if plan.compute in ("tf32", "bf16") else (0,)
        for p in sorted(set(pro)):
            cand = replace(plan, piece_k=pk, prologue=p,
                           n_acc=max(2, plan.n_tiles) if p else 2)
            if (p and q < 4) or cand.device_bytes() > plan.budget or cand == plan:
                continue
            t = estimate_seconds(cand, rates, layout=layout)
            # a prologue must win clearly (its accumulators stay live for every tile); a
            # piece size by wider() margins
            if t < (0.95 if p else 1.0 - _margin(plan)) * best_t:
                best, best_t = cand, t
    if by_rows and best.prologue == 0:
        # A (then a transposed B) by rows on the chosen pieces, not under a prologue (every
        # tile's first piece would wait for its whole panel). Tried last: with A whole, the
        # model ties every B piece (the first tile's start hides in B's copies), and the
        # chosen piece keeps B's copies and GEMMs few.
        for flag, ok in (("a_rows", plan.compute in A_ROWS and not layout[0]),
                         ("b_rows", b_rows)):
            if not ok:
                continue
            cand = replace(best, **{flag: True})
            t = estimate_seconds(cand, rates, layout=layout)
            if t < (1.0 - _margin(plan)) * best_t:
                best, best_t = cand, t
    return replace(best, est_seconds=best_t)
