"""Several devices on one queue (shared.py): a lone device's tiles, the order's last tiles
in strips that the queue hands out after every whole tile; results exact either way."""

import itertools
from dataclasses import replace

import pytest
import torch

from gemm_testlib import check_close
from outcore.gemm import plan as plan_mod
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.plan import MAX_STRIPS, make_plan
from outcore.gemm.schedule import TileQueue, simulate
from outcore.gemm.shared import STRIP_TILES, shared
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import DeviceWorker, GemmJob

KW = dict(host_dtype=torch.float32, compute="fp32", budget=120 << 30, device_type="cuda")


def test_two_gpus_take_the_lone_tiles_with_the_end_in_strips():
    lone = make_plan(32768, 32768, 32768, **KW)
    two = make_plan(32768, 32768, 32768, n_devices=2, **KW)
    assert (two.tile_m, two.tile_n, two.piece_k) == (lone.tile_m, lone.tile_n, lone.piece_k)
    assert two.prologue == 0 and two.strips == MAX_STRIPS
    assert two.strip_tiles == STRIP_TILES * 2 and two.tail_tasks == 4 * MAX_STRIPS
    tiles = two.tiles()
    assert len(tiles) == two.n_tiles == two.mt * two.nt - 4 + 4 * MAX_STRIPS
    # the tail: whole tiles' strips, four per tile, the same panels
    whole = replace(two, strips=1, strip_tiles=1).tiles()
    assert tiles[:-two.tail_tasks] == whole[:-4]
    for q, t in enumerate(whole[-4:]):
        part = tiles[len(whole) - 4 + q * MAX_STRIPS:][:MAX_STRIPS]
        assert {(s.i, s.j, s.c0, s.c1) for s in part} == {(t.i, t.j, t.c0, t.c1)}
        assert (part[0].r0, part[-1].r1) == (t.r0, t.r1)
    assert "last 4 tiles in 4 strips each" in two.describe()


def test_the_older_rule_and_too_few_tiles():
    plan_mod.SHARED_LONE_TILES = False
    try:
        old = make_plan(32768, 32768, 32768, n_devices=2, **KW)
    finally:
        plan_mod.SHARED_LONE_TILES = True
    assert (old.tile_m, old.strips) == (2048, 1)
    lone = make_plan(8192, 8192, 8192, tile=(4096, 4096), **KW)   # 2 x 2 tiles
    assert shared(lone, 2) is None and shared(lone, 1) is not None


def test_the_queue_hands_out_the_tail_last():
    q = TileQueue(list(range(12)), 2, tail=5)
    got = [q.pull(d % 2) for d in range(12)]
    flat = [t for g in got for t in g]
    assert sorted(flat) == list(range(12))
    assert sorted(flat[:7]) == list(range(7))    # every head tile before any tail tile
    assert TileQueue(list(range(3)), 2, tail=9).pull(0) == [0]   # tail larger than all


def _ends(speeds, tail):
    """Finish times of devices pulling 12 whole tiles of cost 4, then 16 strips of cost 1."""
    cost = [4.0] * 12 + [1.0] * 16
    took = simulate(TileQueue(list(range(28)), 2, tail=tail), speeds,
                    cost=lambda d, t: cost[t] / speeds[d])
    assert sorted(t for d in took for t in d) == list(range(28))
    return [sum(cost[t] for t in took[d]) / speeds[d] for d in range(2)]


def test_unequal_devices_finish_within_a_strip():
    """With the strips held back, a fast and a slow device (0.43: the H200 under the
    co-running kernel) finish within one strip of the slow one; with the strips in the
    order's middle of the slow device's run, some speeds end on a whole tile."""
    late = []
    for slow in (0.2, 0.3, 0.43, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        a, b = _ends([1.0, slow], tail=16)
        assert abs(a - b) <= 1.0 / slow + 1e-9, slow
        a, b = _ends([1.0, slow], tail=0)
        late.append(abs(a - b) > 1.0 / slow + 1e-9)
    assert any(late)


@pytest.mark.parametrize("a_rows", [False, True])
def test_two_workers_on_a_plan_with_a_striped_tail_are_exact(a_rows):
    """(A's panels by rows, which a shared plan keeps from its lone plan, as well.)"""
    g = torch.Generator().manual_seed(3)
    m, n, k = 96, 80, 64
    A, B = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    plan = make_plan(m, n, k, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(16, 40, 64, 16), device_type="cpu")
    plan = replace(plan, strips=4, strip_tiles=5, a_rows=a_rows)
    assert plan.n_tiles == len(plan.tiles()) == 6 * 2 - 5 + 20
    for n_dev in (1, 2):
        out = torch.full((m, n), float("nan"))
        job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                      ta=False, tb=False, alpha=1.0, beta=0.0)
        st = GemmStats(m, n, k, "fp32", "", devices=[DeviceStats("cpu") for _ in range(n_dev)])
        execute(job, [torch.device("cpu")] * n_dev, st)
        check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
        assert sum(d.tiles for d in st.devices) == plan.n_tiles


def test_a_worker_of_a_plan_that_caches_all_stays_in_its_arena_whatever_it_took():
    """Where the plan caches every block at its own size, a device that reaches the
    striped tail without some of its A panels gives each strip an A block of its own rows:
    more blocks than the plan's slots. None may be evicted then (a small strip's slot taken
    over by a large B block is an allocation the arena has no room for). The two-worker
    test above failed so in two runs of tests/gemm in session 22, depending on which tiles
    each thread took; here every set of the whole tiles a worker may have taken before the
    strips, deterministically."""
    g = torch.Generator().manual_seed(4)
    m, n, k = 96, 80, 64
    A, B = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    plan = make_plan(m, n, k, host_dtype=torch.float32, compute="fp32", budget=1 << 30,
                     tile=(16, 40, 64, 16), device_type="cpu")
    plan = replace(plan, strips=4, strip_tiles=5)
    assert plan.caches_all and plan.n_slots < plan.tail_tasks
    tiles = plan.tiles()
    head, tail = tiles[:-plan.tail_tasks], tiles[-plan.tail_tasks:]
    want = A.double() @ B.double()
    for took in itertools.chain.from_iterable(
            itertools.combinations(head, r) for r in range(len(head) + 1)):
        out = torch.zeros(m, n)
        job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(out, "out"),
                      ta=False, tb=False, alpha=1.0, beta=0.0)
        queue = list(took) + tail
        st = DeviceStats("cpu")
        DeviceWorker(torch.device("cpu"), job, st).run(
            lambda n_tiles: [queue.pop(0) for _ in range(min(n_tiles, len(queue)))])
        assert st.tiles == len(took) + len(tail)
        for t in list(took) + tail:
            assert torch.allclose(out[t.r0:t.r1, t.c0:t.c1].double(),
                                  want[t.r0:t.r1, t.c0:t.c1], rtol=1e-5, atol=1e-4)
