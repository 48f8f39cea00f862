"""The shared tile queue: every tile once, shares in proportion to speed, locality."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.gemm.schedule import FakeWorker, TileQueue, run_workers, simulate
from outcore.gemm.tiles import band_order, growing_order


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9))
def test_growing_order_covers_grid_and_neighbours_share_a_panel(mt, nt):
    order = growing_order(mt, nt)
    assert sorted(order) == [(i, j) for i in range(mt) for j in range(nt)]
    for (i0, j0), (i1, j1) in zip(order, order[1:]):
        assert i0 == i1 or j0 == j1
    # step s only needs panels A_0..A_s and B_0..B_s
    seen_i = seen_j = -1
    for i, j in order:
        assert i <= seen_i + 1 and j <= seen_j + 1
        seen_i, seen_j = max(seen_i, i), max(seen_j, j)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 10), st.sampled_from("AB"))
def test_band_order_covers_grid_and_neighbours_share_a_panel(mt, nt, band, resident):
    order = band_order(mt, nt, band, resident)
    assert sorted(order) == [(i, j) for i in range(mt) for j in range(nt)]
    for (i0, j0), (i1, j1) in zip(order, order[1:]):
        assert i0 == i1 or j0 == j1


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 60), st.integers(1, 5), st.lists(st.integers(1, 4), min_size=1,
                                                       max_size=40), st.integers(0, 70))
def test_every_tile_is_handed_out_exactly_once(n_tiles, n_dev, sizes, tail):
    q = TileQueue(list(range(n_tiles)), n_dev, tail=tail)
    got, d = [], 0
    for s in sizes * 30:
        got += q.pull(d % n_dev, s)
        d += 1
    while q.remaining():
        got += q.pull(d % n_dev, 1)
        d += 1
    assert sorted(got) == list(range(n_tiles))
    # the tail (the order's last `tail` tiles) after every other tile
    head = n_tiles - min(tail, n_tiles)
    assert sorted(got[:head]) == list(range(head))
    assert q.pull(0) == []
    assert sum(q.taken) == n_tiles


def test_virtual_clock_speeds_1_to_3_split_tiles_1_to_3():
    took = simulate(TileQueue(list(range(64)), 2), [1.0, 3.0])
    assert abs(len(took[0]) - 16) <= 1 and abs(len(took[1]) - 48) <= 1
    took = simulate(TileQueue(list(range(100)), 3), [1.0, 3.0, 1.0])
    assert [abs(len(t) - e) <= 2 for t, e in zip(took, (20, 60, 20))] == [True] * 3


def test_equal_devices_walk_contiguous_runs():
    """Each device takes long runs of consecutive tiles (shared panels), not every other."""
    took = simulate(TileQueue(list(range(64)), 2), [1.0, 1.0])
    for t in took:
        breaks = sum(1 for a, b in zip(t, t[1:]) if b != a + 1)
        assert breaks <= 2
    assert abs(len(took[0]) - len(took[1])) <= 1


def test_threads_with_sleeping_fake_devices_split_in_proportion():
    # 30 ms units: sleep jitter on a loaded 2-core CI machine stays small beside them
    workers = [FakeWorker(1.0, unit_s=0.03), FakeWorker(3.0, unit_s=0.03)]
    t0 = time.perf_counter()
    run_workers(TileQueue(list(range(60)), 2), workers)
    wall = time.perf_counter() - t0
    n_slow, n_fast = len(workers[0].tiles), len(workers[1].tiles)
    assert n_slow + n_fast == 60
    assert 0.15 <= n_slow / 60 <= 0.35, (n_slow, n_fast)
    # together they are close to the sum of their speeds (4 tiles per unit): 0.45 s;
    # a static half-and-half split would take the slow one's 30 tiles, 0.9 s
    assert wall < 60 / 4 * 0.03 * 1.6


def test_a_failing_worker_stops_the_others_and_raises():
    class Boom:
        def run(self, pull, first=1):
            pull(1)
            raise RuntimeError("device fell over")

    good = FakeWorker(1.0, unit_s=0.001)
    q = TileQueue(list(range(500)), 2)
    try:
        run_workers(q, [good, Boom()])
        raised = False
    except RuntimeError as e:
        raised = "fell over" in str(e)
    assert raised
    assert len(good.tiles) < 499   # the queue was aborted


def test_endgame_stops_claiming_ahead_only_with_several_devices():
    from outcore.gemm.schedule import Pull
    q = TileQueue(list(range(6)), 2)
    p0, p1 = Pull(q, 0), Pull(q, 1)
    assert p0(3) == [0, 1, 2] and not p0.endgame()
    assert p1(1) and p1.endgame()                # 2 left for 2 devices
    solo = TileQueue(list(range(2)), 1)
    assert not Pull(solo, 0).endgame()           # nobody else could take them
