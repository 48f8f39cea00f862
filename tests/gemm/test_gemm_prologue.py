"""The prologue schedule (first pieces of K over all tiles, then each tile to the end) at
its edges, run by the real worker on the CPU and checked against float64: a prologue
longer than K block 0's pieces, K not a multiple of the piece, several K blocks, a single
tile, and the plan the GPU test builds (the planner for GPUs picks the piece size)."""

from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.errors import OutcoreError
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.model import Rates, estimate_seconds
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import GemmJob

F32 = torch.float32


def _run(plan, dtype=F32, alpha=1.0, beta=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(plan.m, plan.k, generator=g).to(dtype)
    B = torch.randn(plan.k, plan.n, generator=g).to(dtype)
    C0 = torch.randn(plan.m, plan.n, generator=g).to(dtype)
    out = C0.clone()
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                  ta=False, tb=False, alpha=alpha, beta=beta)
    st = GemmStats(plan.m, plan.n, plan.k, plan.compute, "", devices=[DeviceStats("cpu")])
    execute(job, [torch.device("cpu")], st)
    tol = "bf16" if torch.bfloat16 in (dtype,) or plan.compute == "bf16" else "fp32"
    check_close(out, *(x.double().numpy() for x in (A, B, C0)), alpha, beta, tol)
    assert st.devices[0].tiles == plan.n_tiles
    return st.devices[0]


def _prologue(plan, pieces):
    return replace(plan, prologue=pieces, n_acc=max(2, plan.n_tiles))


@pytest.mark.parametrize("k,piece,prologue", [
    (40, 16, 5),     # 3 pieces (16, 16, 8): the prologue asks for two that do not exist
    (40, 16, 3),     # exactly every piece: nothing left for the tile-major part
    (40, 7, 9),      # K not a multiple of the piece (6 pieces, the last of 5)
    (40, 40, 2),     # one piece
    (40, 7, 2)])     # the ordinary case: prologue shorter than K
@pytest.mark.parametrize("compute,dtype", [("fp32", F32), ("bf16", F32), ("fp64", torch.bfloat16)])
def test_prologue_over_every_piece_count(k, piece, prologue, compute, dtype):
    plan = make_plan(21, 17, k, host_dtype=dtype, compute=compute, budget=1 << 20,
                     tile=(6, 5, k, piece), device_type="cpu")
    plan = _prologue(plan, prologue)
    dev = _run(plan, dtype, alpha=0.5, beta=-1.0)
    assert dev.block_misses == plan.mt + plan.nt      # each block loaded once


@pytest.mark.parametrize("k,tile_k,piece,prologue", [(50, 16, 5, 7), (50, 16, 16, 3),
                                                     (37, 12, 5, 2)])
def test_prologue_with_several_k_blocks(k, tile_k, piece, prologue):
    """The prologue covers K block 0 only (never more than its pieces); the last K block
    is shorter than the others and its last piece shorter still."""
    plan = make_plan(21, 17, k, host_dtype=F32, compute="fp32", budget=1 << 20,
                     tile=(6, 5, tile_k, piece), device_type="cpu")
    assert plan.nk > 1
    _run(_prologue(plan, prologue), beta=2.0)


def test_prologue_with_a_single_tile():
    plan = make_plan(5, 4, 40, host_dtype=F32, compute="bf16", budget=1 << 20,
                     tile=(8, 8, 40, 7), device_type="cpu")
    assert plan.mt * plan.nt == 1
    _run(_prologue(plan, 9), beta=0.5)


def test_the_gpu_tests_plan_on_the_cpu():
    """test_gemm_gpu's prologue plan, made by the planner for one GPU, run by the worker on
    the CPU (the work is the same; only the streams and events are no-ops)."""
    plan = make_plan(1024, 768, 2048, host_dtype=F32, compute="bf16", budget=1 << 30,
                     tile=(256, 256, 2048, 256))
    assert plan.piece_k == 256               # the forced copy piece depth is kept
    dev = _run(replace(plan, prologue=3, n_acc=plan.n_tiles))
    assert dev.block_misses == plan.mt + plan.nt
    # and with the prologue longer than K (two pieces of 1024)
    _run(replace(plan, piece_k=1024, prologue=3, n_acc=plan.n_tiles))


def test_planner_keeps_a_forced_piece_depth_and_chooses_it_otherwise():
    kw = dict(host_dtype=F32, compute="tf32", budget=120 << 30)
    forced = make_plan(32768, 32768, 32768, tile=(4096, 4096, 32768, 1024), **kw)
    assert forced.piece_k == 1024
    # 8192-wide tiles: in 4096-wide ones C's narrow rows going out (model.D2H_ROW_FACTOR)
    # make the model prefer no prologue (all tiles would finish at the end)
    free = make_plan(32768, 32768, 32768, tile=(8192, 8192, 32768), **kw)
    assert free.prologue > 0 and free.piece_k > 1024
    assert free.prologue <= -(-free.tile_k // free.piece_k)


def test_model_takes_a_prologue_longer_than_k():
    plan = make_plan(1024, 768, 2048, host_dtype=F32, compute="bf16", budget=1 << 30,
                     tile=(256, 256, 2048, 1024))
    long = replace(plan, prologue=5, n_acc=plan.n_tiles)
    whole = replace(plan, prologue=2, n_acc=plan.n_tiles)
    assert estimate_seconds(long, Rates()) == estimate_seconds(whole, Rates())


def test_prologue_needs_an_accumulator_per_tile():
    plan = make_plan(21, 17, 40, host_dtype=F32, compute="fp32", budget=1 << 20,
                     tile=(6, 5, 40, 7), device_type="cpu")
    with pytest.raises(OutcoreError, match="accumulator"):
        replace(plan, prologue=2)
    with pytest.raises(OutcoreError, match="prologue"):
        replace(plan, prologue=-1)
