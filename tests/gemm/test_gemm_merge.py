"""Where GEMMs over fresh pieces are cut (model.merged_end, the worker's DeviceClock) and
the last tile's row strips, run by the real worker on the CPU against float64."""

from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.gemm import worker as worker_mod
from outcore.gemm.clock import DeviceClock
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.model import Rates, estimate_seconds, merged_end
from outcore.gemm.plan import MAX_STRIPS, make_plan, with_strips
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.tiles import Tile, row_strips
from outcore.gemm.worker import GemmJob


def test_merged_end_takes_the_pieces_landed_before_the_gemm_can_start():
    ready = [1.0, 2.0, 3.0, 4.0]
    assert merged_end(ready, 0, comp=0.0) == 1       # compute idle: start on piece 0 alone
    assert merged_end(ready, 0, comp=3.5) == 3       # busy until 3.5: pieces 0-2 are there
    assert merged_end(ready, 1, comp=9.0) == 4       # all landed: one GEMM to the end
    assert merged_end(ready, 3, comp=0.0) == 4


def test_row_strips_cover_the_tile_on_its_panels():
    t = Tile(2, 3, 100, 203, 40, 90)
    strips = row_strips(t, 4)
    assert [(s.i, s.j, s.c0, s.c1) for s in strips] == [(2, 3, 40, 90)] * 4
    assert strips[0].r0 == 100 and strips[-1].r1 == 203
    assert all(a.r1 == b.r0 for a, b in zip(strips, strips[1:]))
    assert row_strips(Tile(0, 0, 0, 2, 0, 5), 4) == row_strips(Tile(0, 0, 0, 2, 0, 5), 2)
    assert row_strips(t, 1) == [t]


def test_planner_strips_a_lone_devices_last_tile():
    kw = dict(host_dtype=torch.float32, compute="fp32", budget=120 << 30, device_type="cuda")
    lone = make_plan(16384, 16384, 16384, **kw)
    assert lone.strips == MAX_STRIPS and len(lone.tiles()) == lone.mt * lone.nt + 3
    last = replace(lone, strips=1).tiles()[-1]
    assert {(s.i, s.j) for s in lone.tiles()[-MAX_STRIPS:]} == {(last.i, last.j)}
    # a prologue keeps every tile live: one accumulator per strip as well
    pro = with_strips(replace(lone, strips=1, prologue=2, n_acc=lone.mt * lone.nt), "cuda")
    assert pro.n_acc == pro.n_tiles == lone.mt * lone.nt + 3


def _run(plan, clock_rates=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(plan.m, plan.k, generator=g), torch.randn(plan.k, plan.n, generator=g)
    out = torch.full((plan.m, plan.n), float("nan"))
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                  ta=False, tb=False, alpha=1.0, beta=0.0)
    st = GemmStats(plan.m, plan.n, plan.k, plan.compute, "", devices=[DeviceStats("cpu")])
    execute(job, [torch.device("cpu")], st)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
    assert st.devices[0].tiles == plan.n_tiles
    return st.devices[0]


@pytest.mark.parametrize("strips", [1, 3])
def test_fresh_pieces_merge_where_the_link_runs_ahead(monkeypatch, strips):
    """A fast link and slow compute: the pieces of a fresh panel land while the GEMM before
    them runs, so they merge (fewer GEMMs); a slow link: one GEMM per fresh piece. Same
    result either way, strips included."""
    plan = make_plan(96, 80, 64, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(32, 40, 64, 8), device_type="cpu")
    plan = replace(plan, strips=strips)
    counts = {}
    for name, rates in (("link-ahead", Rates(flops={"fp32": 1e3}, h2d=1e15)),
                        ("compute-ahead", Rates(flops={"fp32": 1e15}, h2d=1e3))):
        monkeypatch.setattr(worker_mod, "DeviceClock",
                            lambda compute, r=rates: DeviceClock(compute, r))
        counts[name] = _run(plan).gemms
    # 3 x 2 tiles (+ strips), 8 pieces each: per-piece GEMMs for every fresh piece when the
    # link is slow; when it is fast only the first piece of the product waits alone
    assert counts["link-ahead"] < counts["compute-ahead"]
    assert counts["compute-ahead"] >= 8 * (1 + 2 + 1)   # tiles that load a fresh panel


def test_the_model_sees_the_strips_tail():
    """The model charges the copy-out that follows the last GEMM: a strip's, not a tile's."""
    kw = dict(host_dtype=torch.float32, compute="bf16", budget=120 << 30, device_type="cuda")
    plan = make_plan(32768, 32768, 32768, tile=(8192, 8192, 32768, 8192), **kw)
    assert plan.strips == MAX_STRIPS
    whole = replace(plan, strips=1)
    assert estimate_seconds(plan, Rates()) < estimate_seconds(whole, Rates())



def test_strips_of_a_fresh_panel_load_their_own_rows():
    """Whole-width row tiles: the last tile's A panel was never loaded, so each strip loads
    its own rows (a block apiece) and starts when they land; where an earlier tile loaded
    the panel, the strips read it. The result is exact either way."""
    plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(16, 40, 48, 16), device_type="cpu")
    assert (plan.mt, plan.nt, plan.strips) == (4, 1, 4)
    st = _run(plan)
    # A: 3 whole panels + 4 strips, B: 1 panel; nothing is read twice from the host
    assert (st.block_misses, st.h2d_bytes) == (8, (64 * 48 + 48 * 40) * 4)
    # a 2 x 2 grid ends on a tile whose panel A_1 is already cached: 2 + 2 blocks only
    square = make_plan(32, 40, 48, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                       tile=(16, 20, 48, 16), device_type="cpu")
    assert square.strips == 4 and _run(square).block_misses == 4


def test_strips_read_the_panel_under_a_prologue():
    """A prologue keeps every tile live, so strips with blocks of their own would evict
    panels that still have pieces to run and load them again (tf32 at 32768 on the H200
    moved 11.8 GB instead of 8.6 in session 13): there the strips read the whole panel."""
    plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(16, 40, 48, 16), device_type="cpu")
    pro = replace(plan, prologue=2, n_acc=plan.n_tiles)
    st = _run(pro)
    assert st.h2d_bytes == (64 * 48 + 48 * 40) * 4 and st.block_misses == 5


def test_strips_read_the_panel_when_k_is_cut_into_blocks():
    """K in two blocks: the strips read the panel's blocks (one load of each)."""
    plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(16, 40, 24, 8), device_type="cpu")
    assert (plan.nk, plan.strips) == (2, 4)
    st = _run(plan)
    assert st.h2d_bytes == (64 * 48 + 48 * 40) * 4 and st.block_misses == 2 * (4 + 1)


def test_a_shallow_first_piece_keeps_the_rest_and_the_result(monkeypatch):
    """plan.FIRST_PIECE (opt-in): every block's first piece is cut at that depth, the later
    pieces keep their bounds, the plan says so, and the product is exact."""
    import outcore.gemm.plan as plan_mod
    from outcore.gemm.tiles import piece_spans
    assert piece_spans(40, 16, 4) == [(0, 4), (4, 16), (16, 32), (32, 40)]
    assert piece_spans(40, 16, 0) == piece_spans(40, 16, 16) == [(0, 16), (16, 32), (32, 40)]
    kw = dict(host_dtype=torch.float32, compute="fp32", budget=1 << 30,
              tile=(32, 40, 64, 16), device_type="cpu")
    even = make_plan(96, 80, 64, **kw)
    monkeypatch.setattr(plan_mod, "FIRST_PIECE", 4)
    first = make_plan(96, 80, 64, **kw)
    assert first is not even and (even.first_piece, first.first_piece) == (0, 4)
    assert "first piece 4 deep" in first.describe()
    assert first.pieces(64) == [(0, 4), (4, 16), (16, 32), (32, 48), (48, 64)]
    st = _run(first)
    assert st.h2d_bytes == _run(even).h2d_bytes   # the same bytes, one more copy a block


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("lazy", [True, False])
def test_lazy_and_eager_piece_loads_give_the_product(monkeypatch, ta, tb, lazy):
    """loads.LAZY_PIECES either way (a tile's pieces enqueued as its GEMMs read their
    landing times, or all before its first GEMM): the product within fp32's tolerance of
    float64, every piece loaded before a GEMM reads it."""
    from outcore.gemm.matmul import matmul
    from outcore.gemm import loads
    monkeypatch.setattr(loads, "LAZY_PIECES", lazy)
    g = torch.Generator().manual_seed(3)
    m, n, k = 90, 70, 130
    A = torch.randn(*((k, m) if ta else (m, k)), generator=g)
    B = torch.randn(*((n, k) if tb else (k, n)), generator=g)
    C = matmul(A, B, transa=ta, transb=tb, devices="cpu", tile=(32, 24, 130, 16))
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32", ta, tb)
