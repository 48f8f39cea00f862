"""Panels stored rows x K copied whole, in contiguous chunks of rows (GemmPlan.a_rows for A,
b_rows for a transposed B), run by the real worker on the CPU against float64, and where
the planner chooses them."""

from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.gemm import lone
from outcore.gemm.copies import Copier
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.model import Rates, estimate_seconds
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import GemmJob


def _run(plan, monkeypatch, ta=False, compute="fp32", tb=False):
    """The product on one CPU worker, exact to the compute's tolerance; returns the
    worker's stats and the host regions each copy in read, by operand (in each operand's
    storage coordinates)."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(plan.m, plan.k, generator=g)
    B = torch.randn(plan.k, plan.n, generator=g)
    out = torch.full((plan.m, plan.n), float("nan"))
    copies = []
    real = Copier.h2d

    def h2d(self, dst, host, region):
        copies.append((host.name, region))
        return real(self, dst, host, region)
    monkeypatch.setattr(Copier, "h2d", h2d)
    a_host = A.t().contiguous() if ta else A      # op(A) = a_host.T when transposed
    b_host = B.t().contiguous() if tb else B
    job = GemmJob(plan, HostMatrix(a_host, "A"), HostMatrix(b_host, "B"),
                  HostMatrix(out, "out"), ta=ta, tb=tb, alpha=1.0, beta=0.0)
    st = GemmStats(plan.m, plan.n, plan.k, plan.compute, "", devices=[DeviceStats("cpu")])
    execute(job, [torch.device("cpu")], st)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, compute)
    return st.devices[0], {op: [r for o, r in copies if o == op] for op in ("A", "B")}


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_a_rows_copies_each_a_block_whole_by_rows(monkeypatch, compute):
    """Every A copy spans all of K in at most row_chunk rows (a contiguous host region);
    B keeps its K pieces; the bytes are those of the piecewise plan and the result is
    exact. bf16 goes through the landing buffers (fp32 host, converted on the device);
    the last tile's strips load blocks of their own rows."""
    plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute=compute, budget=1 << 30,
                     tile=(16, 40, 48, 8), device_type="cpu")
    assert (plan.mt, plan.nt, plan.strips, plan.a_rows) == (4, 1, 4, False)
    rows = replace(plan, a_rows=True)
    assert "A's panels whole, by rows" in rows.describe()
    st_p, cp_p = _run(plan, monkeypatch, compute=compute)
    st_r, cp_r = _run(rows, monkeypatch, compute=compute)
    chunk = rows.row_chunk(48)
    assert chunk == 40 * 8 // 48 == 6
    assert all(c0 == 0 and c1 == 48 and 0 < r1 - r0 <= chunk for r0, r1, c0, c1 in cp_r["A"])
    assert all(c1 - c0 == 8 for _, _, c0, c1 in cp_p["A"])          # K pieces before
    assert cp_r["B"] == cp_p["B"]
    assert st_r.h2d_bytes == st_p.h2d_bytes == (64 * 48 + 48 * 40) * 4
    # 3 whole panels and 4 strips' own blocks, each covered by its chunks exactly once
    covered = sorted((r0, r1) for r0, r1, _, _ in cp_r["A"])
    assert covered[0][0] == 0 and covered[-1][1] == 64
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert st_r.block_misses == st_p.block_misses == 3 + 4 + 1


def test_b_rows_copies_a_transposed_b_whole_by_rows(monkeypatch):
    """op(B) = B.T: B is stored N x K, so its blocks are rows x K as A's are: with b_rows
    each B copy spans all of K (contiguous), A's too with a_rows, and the result is exact;
    a B that is not transposed (K x N) keeps its K pieces under b_rows."""
    plan = make_plan(64, 40, 48, host_dtype=torch.float32, compute="bf16", budget=1 << 30,
                     tile=(16, 20, 48, 8), device_type="cpu")
    both = replace(plan, a_rows=True, b_rows=True)
    assert "B's panels whole, by rows" in both.describe()
    _, cp = _run(both, monkeypatch, compute="bf16", tb=True)
    assert cp["B"] and all(c0 == 0 and c1 == 48 for _, _, c0, c1 in cp["B"])
    assert all(c0 == 0 and c1 == 48 for _, _, c0, c1 in cp["A"])
    assert sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in cp["B"]) == 40 * 48
    _, cp = _run(both, monkeypatch, compute="bf16")
    assert all(r1 - r0 == 8 for r0, r1, _, _ in cp["B"])   # K x N storage: K pieces


def test_a_rows_leaves_a_transposed_a_and_wide_rows_in_pieces(monkeypatch):
    """op(A) = A.T keeps K along its storage rows: its blocks load in K pieces as before;
    so does a block whose one row is larger than a copy piece. Both exact."""
    plan = replace(make_plan(64, 40, 48, host_dtype=torch.float32, compute="fp32",
                             budget=1 << 30, tile=(16, 40, 48, 8), device_type="cpu"),
                   a_rows=True)
    _, cp = _run(plan, monkeypatch, ta=True)
    assert all(r1 - r0 == 8 for r0, r1, _, _ in cp["A"])   # (K rows, M cols) storage
    narrow = replace(make_plan(32, 4, 96, host_dtype=torch.float32, compute="fp32",
                               budget=1 << 30, tile=(8, 4, 96, 8), device_type="cpu"),
                     a_rows=True)
    assert narrow.piece_numel < 96
    _, cp = _run(narrow, monkeypatch)
    assert all(c1 - c0 == 8 for _, _, c0, c1 in cp["A"])


def test_planner_takes_a_by_rows_for_bf16_whole_width_tiles(monkeypatch):
    """bf16 at 32768 (whole-width row tiles, no prologue): A by rows, on B's 8192-deep
    pieces, because the model prices K pieces of A as 2-D copies of 32 KiB rows; tf32
    (a prologue), fp32, a transposed A, and A_ROWS emptied: not. A transposed B by rows
    where lone.B_ROWS asks for it (bf16 by default since session 18) and K is at least
    lone.B_ROWS_MIN_K (16384; at 8192 it measured slower)."""
    kw = dict(host_dtype=torch.float32, budget=120 << 30, device_type="cuda")
    bf16 = make_plan(32768, 32768, 32768, compute="bf16", **kw)
    assert bf16.a_rows and bf16.prologue == 0 and bf16.tile_n == 32768
    assert bf16.piece_k == 8192
    pieces = replace(bf16, a_rows=False)
    assert estimate_seconds(bf16, Rates()) < 0.98 * estimate_seconds(pieces, Rates())
    assert not make_plan(32768, 32768, 32768, compute="tf32", **kw).a_rows
    assert not make_plan(16384, 16384, 16384, compute="fp32", **kw).a_rows
    assert not make_plan(32768, 16384, 16384, compute="bf16", layout=(True, False), **kw).a_rows
    nt = make_plan(32768, 16384, 16384, compute="bf16", layout=(False, True), **kw)
    assert nt.a_rows and nt.b_rows      # the NT training shape: both panels by rows
    shallow = make_plan(32768, 8192, 8192, compute="bf16", layout=(False, True), **kw)
    assert shallow.a_rows and not shallow.b_rows   # K = 8192: B in K pieces
    monkeypatch.setattr(lone, "B_ROWS_MIN_K", 8192)
    assert make_plan(32768, 8192, 8192, compute="bf16", layout=(False, True), **kw).b_rows
    monkeypatch.setattr(lone, "B_ROWS", ())
    assert not make_plan(32768, 16384, 16384, compute="bf16", layout=(False, True),
                         **kw).b_rows   # emptied: opt-out, planned apart
    monkeypatch.setattr(lone, "B_ROWS", ("bf16",))
    assert not make_plan(32768, 32768, 32768, compute="bf16", **kw).b_rows   # B is K x N
    monkeypatch.setattr(lone, "A_ROWS", ())
    monkeypatch.setattr(lone, "B_ROWS", ())
    assert not make_plan(32768, 32768, 32768, compute="bf16", **kw).a_rows
    assert not make_plan(32768, 16384, 16384, compute="bf16", layout=(False, True), **kw).b_rows
