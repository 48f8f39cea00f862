"""The planner: buffers fit the budget, orders by cache size, the prologue choice, and the
worker's paths that only the planner for GPUs turns on (run here on the CPU)."""

from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.errors import OutcoreError
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute, matmul
from outcore.gemm.model import row_factor
from outcore.gemm.plan import Rates, estimate_seconds, make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import GemmJob

F32 = torch.float32


@pytest.mark.parametrize("m,n,k,budget,compute", [
    (32768, 32768, 32768, 120 << 30, "fp32"), (65536, 65536, 16384, 8 << 30, "fp32"),
    (16384, 65536, 65536, 8 << 30, "bf16"), (1000, 3000, 700, 1 << 20, "fp64"),
    (5, 100000, 3, 1 << 16, "fp32")])
def test_plan_fits_budget(m, n, k, budget, compute):
    p = make_plan(m, n, k, host_dtype=F32, compute=compute, budget=budget)
    assert p.device_bytes() <= budget
    assert p.n_slots >= 2 and p.tile_k >= 1
    assert len(p.tiles()) == p.n_tiles == p.mt * p.nt + p.strips - 1


def test_everything_fits_grows_from_a_corner_else_bands():
    p = make_plan(16384, 16384, 16384, host_dtype=F32, compute="fp32", budget=100 << 30)
    assert p.order == "grow" and p.n_slots == p.nk * (p.mt + p.nt)
    # 65536^2 x 16384 fp32 in 8 GiB: A does not fit whole: a band of it stays resident
    p = make_plan(65536, 65536, 16384, host_dtype=F32, compute="fp32", budget=8 << 30)
    assert p.order in ("rows", "cols") and p.n_slots < p.nk * (p.mt + p.nt)
    assert p.band >= 2


def test_k_too_deep_for_whole_panels_is_cut_into_blocks():
    p = make_plan(4096, 4096, 1 << 20, host_dtype=F32, compute="fp32", budget=2 << 30)
    assert p.nk > 1 and p.tile_k % 256 == 0 and p.device_bytes() <= 2 << 30


def test_prologue_only_where_link_and_compute_balance():
    kw = dict(host_dtype=F32, budget=120 << 30)
    tf32 = make_plan(32768, 32768, 32768, compute="tf32", **kw)
    fp32 = make_plan(32768, 32768, 32768, compute="fp32", **kw)
    assert tf32.prologue > 0 and tf32.first_task == tf32.n_tiles
    assert fp32.prologue == 0 and fp32.first_task == 1
    # the model: tf32 with the prologue beats tile-major, and is within 25% of the bound
    # at the rate its 2-D copies of 32 KiB rows reach
    r = Rates()
    bound = max(2 * 32768**3 / r.flops["tf32"], 2 * 32768**2 * 4 / (r.h2d * row_factor(32768)))
    assert estimate_seconds(tf32, r) < estimate_seconds(replace(tf32, prologue=0), r)
    assert estimate_seconds(tf32, r) < 1.25 * bound
    # several devices, or a CPU: never; several devices take the lone tiles, short last ones
    two = make_plan(32768, 32768, 32768, compute="tf32", n_devices=2, **kw)
    assert two.prologue == 0 and two.first_task == 1 and two.tail_tasks > 0
    assert (two.tile_m, two.tile_n) == (tf32.tile_m, tf32.tile_n)
    assert make_plan(32768, 32768, 32768, compute="tf32", device_type="cpu", **kw).prologue == 0


def test_narrow_copy_rows_are_slow_in_the_model_and_widen_the_tiles():
    assert row_factor(8 << 10) < row_factor(16 << 10) < row_factor(32 << 10) < 1.0
    assert row_factor(4 << 10) == row_factor(8 << 10) / 2 and row_factor(100, True) == 1.0
    kw = dict(host_dtype=F32, budget=120 << 30)
    # tf32 and bf16 at 32768 are link-bound: 8192-wide tiles and 8192-deep pieces (32 KiB
    # rows for A's and B's copies) beat 4096 (bench/results/gemm-probe-h200.json)
    for compute in ("tf32", "bf16"):
        p = make_plan(32768, 32768, 32768, compute=compute, **kw)
        assert p.tile_n >= 8192 and p.piece_k >= 8192, p.describe()
    # op(A) stored transposed: A's rows are a tile wide whatever the piece depth, so the
    # tiles are tall (whole-height strips with lone.TALL_TA, 8192 without)
    narrow = make_plan(32768, 32768, 32768, compute="bf16", layout=(True, False), **kw)
    assert narrow.tile_m >= 8192
    # fp32 is compute-bound: the first pieces should come quickly, tiles stay 4096
    assert make_plan(16384, 16384, 16384, compute="fp32", **kw).tile_m == 4096
    # several devices take a lone device's tiles (strips of at most 2048 rows here)
    lone_plan = make_plan(32768, 32768, 32768, compute="bf16", **kw)
    two = make_plan(32768, 32768, 32768, compute="bf16", n_devices=2, **kw)
    assert two.tile_m == lone_plan.tile_m <= 2048


def test_narrow_c_rows_going_out_are_slow_in_the_model(monkeypatch):
    """model.D2H_ROWS: a C tile narrower than C goes out at D2H_ROW_FACTOR of the rate, so
    the NT shape whose C is as large as its A (65536 x 16384, bf16) takes 8192-wide tiles
    (32 KiB rows) instead of 4096-wide ones (16 KiB rows)."""
    from outcore.gemm import lone, model
    # strips as before session 19 (with 1024-row ones this shape takes whole-width strips,
    # whatever C's rows cost)
    monkeypatch.setattr(lone, "STRIP_ROWS", (2048, 4096, 8192))
    assert row_factor(16 << 10, table=model.D2H_ROW_FACTOR) < \
        row_factor(32 << 10, table=model.D2H_ROW_FACTOR) < 1.0
    kw = dict(host_dtype=F32, compute="bf16", budget=120 << 30, layout=(False, True))
    assert make_plan(65536, 16384, 16384, **kw).tile_n == 8192
    monkeypatch.setattr(model, "D2H_ROWS", False)
    narrow = make_plan(65536, 16384, 16384, **kw)   # sessions 11-18's pick
    assert narrow.tile_n == 4096, narrow.describe()
    fast = estimate_seconds(narrow, Rates(), layout=(False, True))
    monkeypatch.setattr(model, "D2H_ROWS", True)
    assert estimate_seconds(narrow, Rates(), layout=(False, True)) > 1.1 * fast


def test_short_strips_only_where_m_is_small(monkeypatch):
    """lone.SHORT_STRIP_MAX_M: the bf16 NT shape at 16384 tokens takes 512-row whole-width
    strips (session 19: faster there), the same shape at 32768 tokens keeps 1024-row ones
    (slower with 512 there), and with the rule off the short shape keeps 1024 too."""
    from outcore.gemm import lone
    kw = dict(host_dtype=F32, compute="bf16", budget=120 << 30, layout=(False, True))
    short = make_plan(16384, 8192, 8192, **kw)
    assert (short.tile_m, short.tile_n) == (lone.SHORT_STRIP, 8192), short.describe()
    tall = make_plan(32768, 8192, 8192, **kw)
    assert (tall.tile_m, tall.tile_n) == (1024, 8192), tall.describe()
    monkeypatch.setattr(lone, "SHORT_STRIP_MAX_M", 0)
    assert make_plan(16384, 8192, 8192, **kw).tile_m == 1024


def test_budget_too_small_for_one_tile():
    with pytest.raises(ValueError, match="too small for one 64x64 tile.*smaller tile"):
        make_plan(1000, 1000, 1000, host_dtype=F32, compute="fp32", budget=10_000, tile=64)
    with pytest.raises(OutcoreError, match="raise gpu_memory"):
        make_plan(1000, 1000, 1000, host_dtype=F32, compute="fp32", budget=1000,
                  device_type="cuda")


def _run_plan(plan, A, B, out, alpha=1.0, beta=0.0, devices=("cpu",)):
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                  ta=False, tb=False, alpha=alpha, beta=beta)
    devs = [torch.device(d) for d in devices]
    st = GemmStats(plan.m, plan.n, plan.k, plan.compute, "",
                   devices=[DeviceStats(f"cpu#{i}") for i in range(len(devs))])
    execute(job, devs, st)
    return st


@pytest.mark.parametrize("compute,dtype", [("fp32", F32), ("bf16", F32), ("fp32", torch.float64),
                                           ("fp64", torch.bfloat16)])
def test_prologue_path_piece_major_then_tile_major(compute, dtype):
    """Pieces of K over all tiles first, then each tile to the end; with conversion and a
    C landing buffer when dtypes differ."""
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(21, 40, generator=g).to(dtype), torch.randn(40, 17, generator=g).to(dtype)
    C0 = torch.randn(21, 17, generator=g).to(dtype)
    out = C0.clone()
    plan = make_plan(21, 17, 40, host_dtype=dtype, compute=compute, budget=1 << 20,
                     tile=(6, 5, 40, 7), device_type="cpu")
    plan = replace(plan, prologue=3, n_acc=plan.n_tiles)
    st = _run_plan(plan, A, B, out, alpha=0.5, beta=-1.0)
    a, b, c = (x.double().numpy() for x in (A, B, C0))
    tol = "bf16" if torch.bfloat16 in (dtype,) or compute == "bf16" else "fp32"
    check_close(out, a, b, c, 0.5, -1.0, tol)
    assert st.devices[0].tiles == plan.n_tiles
    # each block loaded once, piece by piece
    assert st.devices[0].block_misses == plan.mt + plan.nt


def test_cache_smaller_than_the_problem_reloads_but_stays_exact():
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(64, 96, generator=g), torch.randn(96, 64, generator=g)
    out, st = matmul(A, B, devices="cpu", tile=(8, 8, 32), gpu_memory=4 * 8 * 32 * 4 + 2 * 256,
                     return_stats=True)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
    blocks = 3 * (8 + 8)
    assert st.devices[0].block_misses > blocks          # some blocks came twice
    assert st.devices[0].device_bytes <= 4 * 8 * 32 * 4 + 2 * 256


def test_band_plan_moves_fewer_bytes_than_no_reuse():
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(96, 64, generator=g), torch.randn(64, 96, generator=g)
    budget = 2 * 8 * 8 * 4 + 10 * 8 * 64 * 4
    out, st = matmul(A, B, devices="cpu", tile=(8, 8), gpu_memory=budget, return_stats=True)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
    no_reuse = 12 * 12 * (8 * 64 * 2) * 4
    minimum = (96 * 64 * 2) * 4
    assert minimum <= st.devices[0].h2d_bytes < no_reuse / 3


def test_plans_are_remembered_per_shape_and_budget():
    """A repeated product (a training step's shapes) reuses its plan: the search is host
    time before the first copy (~26 ms at 32768 in bf16)."""
    from outcore.gemm.plan import _cached_search
    kw = dict(host_dtype=torch.float32, compute="bf16", budget=100 << 30, n_devices=1,
              device_type="cuda")
    before = _cached_search.cache_info().hits
    first = make_plan(32768, 32768, 32768, **kw)
    assert make_plan(32768, 32768, 32768, tile=None, **kw) is first
    assert _cached_search.cache_info().hits == before + 1
    assert make_plan(32768, 32768, 16384, **kw) is not first   # another shape: searched
    assert make_plan(32768, 32768, 32768, **{**kw, "budget": 50 << 30}) is not first
    # explicit rates are not remembered (a dict inside: unhashable), and give a fresh plan
    assert make_plan(32768, 32768, 32768, rates=Rates(), **kw) == first
    assert make_plan(32768, 32768, 32768, rates=Rates(), **kw) is not first
    with pytest.raises(OutcoreError, match="tile="):
        make_plan(8, 8, 8, tile=[4, 0], **kw)


def test_a_plan_made_under_one_setting_is_not_served_under_another(monkeypatch):
    """Every module setting the search reads is in the cache's key (a bench that changes
    one between products gets a plan made under it)."""
    from outcore.gemm import lone, model, plan as plan_mod, shared
    kw = dict(host_dtype=torch.float32, compute="fp32", budget=1 << 30, n_devices=1,
              device_type="cpu")
    first = make_plan(1000, 1000, 1000, **kw)
    assert make_plan(1000, 1000, 1000, **kw) is first
    monkeypatch.setattr(plan_mod, "DEFAULT_TILE", {**plan_mod.DEFAULT_TILE, "cpu": 128})
    smaller = make_plan(1000, 1000, 1000, **kw)
    assert (smaller.tile_m, smaller.tile_n) == (128, 128) != (first.tile_m, first.tile_n)
    for mod, name, value in ((plan_mod, "PIECE_BYTES", 1 << 20), (plan_mod, "MIN_TILE",
                                                                  {"cpu": 8, "cuda": 64}),
                             (lone, "MIN_PIECES", 8), (lone, "PIECE_FACTORS", (1, 2)),
                             (model, "ROW_FACTOR", ((1 << 20, 1.0),)),
                             (shared, "MIN_TILES", 2)):
        before = make_plan(1000, 1000, 1000, **kw)
        monkeypatch.setattr(mod, name, value)
        assert make_plan(1000, 1000, 1000, **kw) is not before, name


def test_flat_tiles_by_default_and_planned_apart(monkeypatch):
    """lone.FLAT_TILES (on; bench/gemm.py --square-tiles turns it off) lets the planner pick
    tiles wider than tall where its model says so (bf16 at 32768, link-bound); off, plans
    are square, and a plan remembered with one setting is not served for the other."""
    import outcore.gemm.lone as plan_mod
    kw = dict(host_dtype=torch.float32, compute="bf16", budget=100 << 30, n_devices=1,
              device_type="cuda")
    flat = make_plan(32768, 32768, 32768, **kw)
    monkeypatch.setattr(plan_mod, "FLAT_TILES", False)
    square = make_plan(32768, 32768, 32768, **kw)
    assert square.tile_m == square.tile_n
    assert flat.tile_m != flat.tile_n and flat.est_seconds < 0.98 * square.est_seconds
    monkeypatch.setattr(plan_mod, "FLAT_TILES", True)
    assert make_plan(32768, 32768, 32768, **kw) is flat


def test_a_plan_caching_every_block_counts_each_at_its_own_size():
    """plan.caches_all: whole-width strips of bf16 at 32768 hold all of A and B (4 GiB in
    bf16) plus their accumulators, not 33 slots of a B block's 2 GiB; so the planner takes
    them under gpu_memory=8GiB too (before session 20: 4096 x 8192 tiles there)."""
    p = make_plan(32768, 32768, 32768, host_dtype=F32, compute="bf16", budget=8 << 30)
    assert (p.tile_m, p.tile_n) == (1024, 32768) and p.caches_all, p.describe()
    assert (2 * 32768 * 32768) * 2 < p.device_bytes() <= 8 << 30
    assert p.device_bytes() < p.n_slots * p.slot_numel * 2   # the old count: 66 GiB


def test_the_exact_cache_takes_each_blocks_own_size():
    """A product in whole-width strips on the CPU worker: the cache's buffers hold A and B
    once (each block at its size), the product is exact, and nothing outgrows the plan."""
    from outcore.gemm.matmul import matmul
    A, B = torch.randn(64, 48, dtype=torch.float64), torch.randn(48, 96, dtype=torch.float64)
    out, st = matmul(A, B, devices="cpu", tile=(8, 96), return_stats=True)
    assert torch.allclose(out, A @ B)
    plan = make_plan(64, 96, 48, host_dtype=torch.float64, compute="fp64", budget=1 << 30,
                     device_type="cpu", tile=(8, 96))
    assert plan.caches_all
    acc_bytes = plan.n_acc * 8 * 96 * 8
    assert st.devices[0].device_bytes <= (64 + 96) * 48 * 8 + acc_bytes
    assert st.devices[0].device_bytes <= plan.device_bytes()


def test_whole_width_strips_for_link_bound_products(monkeypatch):
    """Session 13: where the link bounds the product (bf16 at 32768) the planner may take
    C tiles as whole-width row strips, so that B's pieces are whole rows of B (contiguous
    copies), with pieces deeper than the usual 8x (8192 rows of B: 1 GiB); a
    compute-bound product (fp32) keeps its square tiles."""
    kw = dict(host_dtype=torch.float32, budget=100 << 30, n_devices=1, device_type="cuda")
    bf16 = make_plan(32768, 32768, 32768, compute="bf16", **kw)
    # (2048-row strips until session 19, 1024 since: lone.STRIP_ROWS)
    assert (bf16.tile_m, bf16.tile_n, bf16.piece_k) == (1024, 32768, 8192)
    assert bf16.device_bytes() <= 100 << 30
    fp32 = make_plan(32768, 32768, 32768, compute="fp32", **kw)
    assert fp32.tile_m == fp32.tile_n
    # the deeper pieces are for whole-width strips only: with the usual factors (up to 8x
    # the 32 MiB piece, 256 rows at this width) the same strips stop at 2048 rows (A in K
    # pieces: with A by rows, lone.A_ROWS, the model ties every piece depth)
    import dataclasses

    import outcore.gemm.lone as lone
    from outcore.gemm.model import Rates
    monkeypatch.setattr(lone, "A_ROWS", ())
    deep = lone.maybe_prologue(dataclasses.replace(bf16, a_rows=False), 1, "cuda", Rates(),
                               factors=lone.WIDE_PIECE_FACTORS)
    usual = lone.maybe_prologue(dataclasses.replace(bf16, piece_k=256, a_rows=False), 1,
                                "cuda", Rates())
    assert deep.piece_k == 8192 and not deep.a_rows
    assert usual.piece_k <= 2048 and usual.est_seconds > deep.est_seconds


def test_lone_accumulators_where_the_budget_holds_them(monkeypatch):
    """plan.LONE_ACCS (4 since session 16): a lone GPU's plan without a prologue gets that
    many accumulators when they fit its budget; a prologue's plan, several devices, and a
    budget without room keep theirs. The product stays exact (slots cycle by tile)."""
    import outcore.gemm.plan as plan_mod
    kw = dict(host_dtype=torch.float32, compute="bf16", device_type="cuda")
    monkeypatch.setattr(plan_mod, "LONE_ACCS", 2)
    assert make_plan(32768, 32768, 32768, budget=120 << 30, **kw).n_acc == 2
    monkeypatch.setattr(plan_mod, "LONE_ACCS", 4)
    four = make_plan(32768, 32768, 32768, budget=120 << 30, **kw)
    assert four.n_acc == 4 and four.device_bytes() <= 120 << 30
    assert make_plan(32768, 32768, 32768, budget=120 << 30, n_devices=2, **kw).n_acc == 2
    tf32 = make_plan(32768, 32768, 32768, budget=120 << 30, host_dtype=torch.float32,
                     compute="tf32", device_type="cuda")
    assert tf32.prologue and tf32.n_acc >= tf32.n_tiles
    tight = make_plan(8192, 8192, 8192, budget=700 << 20, **kw)
    assert tight.n_acc == 2 or tight.device_bytes() <= 700 << 20
    cpu_plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute="fp32",
                         budget=1 << 30, tile=(16, 40, 48, 8), device_type="cpu")
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(64, 48, generator=g), torch.randn(48, 40, generator=g)
    out = torch.full((64, 40), float("nan"))
    plan = replace(cpu_plan, n_acc=4)
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                  ta=False, tb=False, alpha=1.0, beta=0.0)
    execute(job, [torch.device("cpu")], GemmStats(64, 40, 48, "fp32", "",
                                                  devices=[DeviceStats("cpu")]))
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")


def test_few_wide_tiles_for_compute_bound_products_when_asked(monkeypatch):
    """lone.FEW_WIDE (opt-in): fp32 at 16384 keeps 4096-wide tiles by default (8192-wide
    would make only 4 C tiles, under MIN_WIDE_TILES); with fp32 in FEW_WIDE the planner
    weighs them too and its model takes them; the two settings are planned apart, and
    bf16 is not affected."""
    import outcore.gemm.lone as lone
    kw = dict(host_dtype=torch.float32, budget=100 << 30, n_devices=1, device_type="cuda")
    base = make_plan(16384, 16384, 16384, compute="fp32", **kw)
    bf16 = make_plan(32768, 32768, 32768, compute="bf16", **kw)
    assert (base.tile_m, base.tile_n) == (4096, 4096)
    monkeypatch.setattr(lone, "FEW_WIDE", ("fp32",))
    few = make_plan(16384, 16384, 16384, compute="fp32", **kw)
    assert (few.tile_m, few.tile_n) == (8192, 8192) and few.n_tiles >= 4
    assert few.est_seconds < base.est_seconds and few.device_bytes() <= 100 << 30
    assert make_plan(32768, 32768, 32768, compute="bf16", **kw) == bf16
    monkeypatch.setattr(lone, "FEW_WIDE", ())
    assert make_plan(16384, 16384, 16384, compute="fp32", **kw) is base


def test_whole_height_strips_for_a_transposed_a(monkeypatch):
    """lone.TALL_TA (bf16 since session 18): with A stored K x M (the weight gradient's
    TN shape) and M >= TALL_TA_MIN_M the planner may take C tiles as whole-height column
    strips, so that A's K pieces are whole rows of A (contiguous copies), however few
    tiles that makes; not for an A that is not transposed, and not with TALL_TA emptied
    (planned apart). A product in such tiles is exact on the CPU worker."""
    import outcore.gemm.lone as lone
    kw = dict(host_dtype=torch.float32, compute="bf16", budget=100 << 30, device_type="cuda")
    tn = make_plan(16384, 16384, 65536, layout=(True, False), **kw)
    assert tn.tile_m == 16384 and tn.mt == 1
    assert make_plan(16384, 16384, 65536, layout=(False, False), **kw).tile_m < 16384
    # M under lone.TALL_TA_MIN_M (16384): measured slower in one 8192 x 8192 tile
    assert make_plan(8192, 8192, 65536, layout=(True, False), **kw).tile_m < 8192
    monkeypatch.setattr(lone, "TALL_TA_MIN_M", 8192)
    assert make_plan(8192, 8192, 65536, layout=(True, False), **kw).tile_m == 8192
    monkeypatch.setattr(lone, "TALL_TA_MIN_M", 16384)
    monkeypatch.setattr(lone, "TALL_TA", ())
    old = make_plan(16384, 16384, 65536, layout=(True, False), **kw)
    assert old.tile_m < 16384 and old.est_seconds > tn.est_seconds
    g = torch.Generator().manual_seed(6)
    At, B = torch.randn(300, 40, generator=g), torch.randn(300, 50, generator=g)   # A.T: 300 x 40
    out = matmul(At, B, transa=True, compute="bf16", devices="cpu", tile=(40, 16, 300, 64))
    ref = At.to(torch.bfloat16).double().t() @ B.to(torch.bfloat16).double()
    assert (out.double() - ref).abs().max() < 1e-3 * ref.abs().max()
