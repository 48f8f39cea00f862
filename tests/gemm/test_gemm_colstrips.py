"""The last tile of a TN plan in column strips (lone.by_columns), each loading its own
columns of B, packed by a host thread (pack.py): where the planner takes them, and the
real worker on the CPU against float64."""

import time
from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.gemm import lone, pack, worker
from outcore.gemm.copies import Copier
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.tiles import Tile, col_strips
from outcore.gemm.worker import GemmJob
from outcore.memory import PinnedPool

KW = dict(host_dtype=torch.float32, budget=120 << 30, device_type="cuda")


def test_col_strips_cover_the_tile_on_its_panels():
    t = Tile(2, 3, 40, 90, 100, 203)
    strips = col_strips(t, 4)
    assert [(s.i, s.j, s.r0, s.r1) for s in strips] == [(2, 3, 40, 90)] * 4
    assert strips[0].c0 == 100 and strips[-1].c1 == 203
    assert all(a.c1 == b.c0 for a, b in zip(strips, strips[1:]))
    assert col_strips(t, 1) == [t]


def test_planner_cuts_a_tn_plans_new_last_panel_into_column_strips(monkeypatch):
    """bf16 TN at 16384 tokens and features (1 x 2 whole-height tiles: the last tile's B
    panel is new): 4 column strips of 2048. Not for NT, fp32, a 2 x 2 grid whose last
    tile reuses its B panel, a prologue plan, nor with COL_STRIPS emptied."""
    tn = make_plan(16384, 16384, 16384, compute="bf16", layout=(True, False), **KW)
    assert (tn.mt, tn.nt, tn.strips, tn.strip_cols) == (1, 2, 4, True)
    assert "last tile in 4 column strips" in tn.describe()
    assert [(t.c0, t.c1) for t in tn.tiles()[1:]] == [(8192 + 2048 * q, 10240 + 2048 * q)
                                                      for q in range(4)]
    assert not make_plan(16384, 16384, 16384, compute="bf16", layout=(False, True),
                         **KW).strip_cols
    assert not make_plan(16384, 16384, 16384, compute="fp32", layout=(True, False),
                         **KW).strip_cols
    assert not make_plan(8192, 8192, 16384, compute="bf16", layout=(True, False),
                         **KW).strip_cols   # 2 x 2 tiles: the last one's B panel is cached
    assert not make_plan(16384, 16384, 65536, compute="bf16", layout=(True, False),
                         **KW).strip_cols   # a prologue
    monkeypatch.setattr(lone, "COL_STRIPS", ())
    rows = make_plan(16384, 16384, 16384, compute="bf16", layout=(True, False), **KW)
    assert rows.strips == 4 and not rows.strip_cols


def _run(plan, monkeypatch, pool, compute="bf16"):
    """TN on one CPU worker, exact to the compute's tolerance; returns the stats and the
    (host name, region) of every B copy."""
    monkeypatch.setattr(worker, "staging_pool", lambda: pool)
    g = torch.Generator().manual_seed(1)
    A = torch.randn(plan.m, plan.k, generator=g)
    B = torch.randn(plan.k, plan.n, generator=g)
    out = torch.full((plan.m, plan.n), float("nan"))
    copies = []
    real = Copier.h2d

    def h2d(self, dst, host, region):
        copies.append((host.name, region))
        return real(self, dst, host, region)
    monkeypatch.setattr(Copier, "h2d", h2d)
    job = GemmJob(plan, HostMatrix(A.t().contiguous(), "A"), HostMatrix(B, "B"),
                  HostMatrix(out, "out"), ta=True, tb=False, alpha=1.0, beta=0.0)
    st = GemmStats(plan.m, plan.n, plan.k, plan.compute, "", devices=[DeviceStats("cpu")])
    execute(job, [torch.device("cpu")], st)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, compute,
                transa=False)
    return st.devices[0], [(name, r) for name, r in copies if name.startswith("B")]


def _plan(compute="bf16"):
    base = make_plan(32, 40, 48, host_dtype=torch.float32, compute=compute, budget=1 << 30,
                     tile=(32, 20, 48, 8), device_type="cpu")
    assert (base.mt, base.nt, base.strips, base.nk) == (1, 2, 4, 1)
    return base, replace(base, strip_cols=True)


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_column_strips_load_their_own_columns_packed(monkeypatch, compute):
    """With a buffer in the pool: the first tile loads B's panel 0 in K pieces from B, each
    strip its 5 columns from the packed copy (regions at the packed strip's origin), the
    same bytes as row strips, exact; the buffer goes back to the pool."""
    base, cols = _plan(compute)
    pool = PinnedPool(pin=False)
    pool.put(pool.get(48 * 20, torch.float32))   # the last panel's 20 columns, all K
    st_c, cp_c = _run(cols, monkeypatch, pool, compute)
    st_r, _ = _run(base, monkeypatch, PinnedPool(pin=False), compute)
    assert st_c.packed_bytes == 48 * 20 * 4
    plain = [r for name, r in cp_c if name == "B"]
    packed = [r for name, r in cp_c if name == "B (packed)"]
    assert all((c0, c1) == (0, 20) for _, _, c0, c1 in plain)
    assert sorted({(c0, c1) for _, _, c0, c1 in packed}) == [(0, 5)]
    assert len(packed) == 4 * 6 and sum(r1 - r0 for r0, r1, _, _ in packed) == 4 * 48
    assert st_c.h2d_bytes == st_r.h2d_bytes
    assert st_c.block_misses == st_r.block_misses + 4 - 1   # 4 strip blocks for one panel
    assert pool.take(48 * 20, torch.float32) is not None


def test_without_a_pooled_buffer_strips_load_from_b_and_one_is_pinned(monkeypatch):
    """An empty pool: the product reads each strip's columns from B as they lie (exact) and
    a thread puts a buffer for the next product in the pool; PACK_STRIPS off: no buffer
    is taken even where the pool has one."""
    _, cols = _plan()
    pool = PinnedPool(pin=False)
    st, cp = _run(cols, monkeypatch, pool)
    assert st.packed_bytes == 0 and {name for name, _ in cp} == {"B"}
    assert sorted({(c0, c1) for _, (_, _, c0, c1) in cp})[-1] == (35, 40)
    deadline = time.monotonic() + 10
    buf = None
    while buf is None and time.monotonic() < deadline:
        buf = pool.take(48 * 20, torch.float32)
        time.sleep(0.01)
    assert buf is not None and buf.numel() == 48 * 20
    pool.put(buf)
    monkeypatch.setattr(pack, "PACK_STRIPS", False)
    st, cp = _run(cols, monkeypatch, pool)
    assert st.packed_bytes == 0 and {name for name, _ in cp} == {"B"}
    assert pool.take(48 * 20, torch.float32) is not None


def test_packer_packs_each_strip_contiguously_and_reports_errors():
    """Each packed strip equals B's columns, contiguous; a failing pack raises from
    source() and close(), not silently."""
    b = torch.arange(6 * 10, dtype=torch.float32).view(6, 10)
    pool = PinnedPool(pin=False)
    pool.put(pool.get(6 * 7, torch.float32))
    p = pack.StripPacker(HostMatrix(b, "B"), [(3, 5), (5, 10)], pool)
    for c0, c1 in [(3, 5), (5, 10)]:
        host, origin = p.source((c0, c1))
        assert origin == (0, c0) and host.t.is_contiguous()
        assert torch.equal(host.t, b[:, c0:c1])
    assert p.source((0, 3)) is None
    p.close()
    assert p.packed_bytes == 6 * 7 * 4
    pool.put(pool.get(6 * 7, torch.float32))
    narrow = HostMatrix(b, "B")
    narrow.t = b[:, :4]                           # columns 5..9 are missing: the pack fails
    bad = pack.StripPacker(narrow, [(3, 5), (5, 10)], pool)
    bad.thread.join()
    with pytest.raises(RuntimeError):
        bad.source((5, 10))
    with pytest.raises(RuntimeError):
        bad.close()
