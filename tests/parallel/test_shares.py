"""parallel/shares.py in one process: given shares checked in one line, measured shares
(ShareMeter over a fake communicator) converge on the ranks' speeds, stay in (0, 1] under
noisy timings and ignore a rank whose compute time is not known yet."""

import math
import random

import pytest
import torch

from outcore.errors import OutcoreError
from outcore.parallel.shares import ShareMeter, check_shares, split_rows


class FakeComm:
    """What ShareMeter needs of Comm: world, and gather_rows returning every rank's row
    (here the table the test sets: all fake ranks live in this one meter)."""

    def __init__(self, world: int):
        self.world = world
        self.table: list[list[float]] = []
        self.gathers = 0

    def gather_rows(self, values):
        self.gathers += 1
        return torch.tensor(self.table, dtype=torch.float64)


def simulate(speeds, steps=60, batch=64, every=5, noise=0.0, overhead=0.0, seed=0):
    """Fake ranks: busy seconds = overhead + rows / speed, times a uniform noise factor.
    -> (rows per step, the meter)."""
    rnd = random.Random(seed)
    comm = FakeComm(len(speeds))
    meter = ShareMeter(comm, "measured", every=every)
    seen = []
    for _ in range(steps):
        rows = meter.rows(batch)
        comm.table = [[r, (overhead + r / s) * (1 + rnd.uniform(-noise, noise))]
                      for r, s in zip(rows, speeds)]
        meter.observe(rows[0], comm.table[0][1])
        seen.append(rows)
    return seen, meter


@pytest.mark.parametrize("bad", [
    [float("inf"), 1.0], [float("nan"), 1.0], [-0.5, 1.5], [0.7, 0.0], [0.7, 0.3, 0.1],
    [0.7], ["a", 1], 5, "equal", [None, 1]])
def test_bad_shares_are_one_line_outcore_errors(bad):
    with pytest.raises(OutcoreError) as e:
        shares = check_shares(bad, 2)
        split_rows(10, shares)   # the numbers given must split a batch, not crash later
    assert "\n" not in str(e.value) and "shares=" in str(e.value)


def test_huge_or_tiny_weights_split_like_their_ratio():
    """Any positive finite weights: [1e308, 1e308] (whose sum overflows) splits evenly."""
    assert split_rows(10, check_shares([1e308, 1e308], 2)) == [5, 5]
    assert split_rows(10, check_shares([3e307, 7e307], 2)) == [3, 7]
    assert split_rows(10, check_shares([1e-320, 1e-320], 2)) == [5, 5]
    assert check_shares((0.7, 0.3), 2) == pytest.approx([0.7, 0.3])   # a tuple too


def test_shares_need_not_sum_to_one_and_rows_follow_them():
    assert split_rows(10, check_shares([7, 3], 2)) == [7, 3]
    assert split_rows(7, check_shares([0.7, 0.3], 2)) == [5, 2]
    assert split_rows(3, check_shares([0.98, 0.01, 0.01], 3)) == [1, 1, 1]   # never 0 rows


@pytest.mark.parametrize("every", [0, -1, 2.5, "x"])
def test_measure_every_must_be_a_positive_int(every):
    with pytest.raises(OutcoreError, match="measure_every"):
        ShareMeter(FakeComm(2), "measured", every=every)


def test_measured_shares_converge_on_a_1_to_3_speed_ratio():
    seen, meter = simulate([1.0, 3.0])
    assert seen[0] == [32, 32]                  # equal until measured
    assert seen[-1] == [16, 48]
    assert meter.shares == pytest.approx([0.25, 0.75])
    # with a fixed cost per step as well, the busy times still end up equal
    seen, meter = simulate([1.0, 3.0], overhead=4.0)
    r = seen[-1]
    assert abs((4 + r[0] / 1) - (4 + r[1] / 3)) <= 1.0, r


def test_measured_shares_are_stable_under_noisy_timings():
    """+-20% noise on every timing: the shares stay near 1/4, 3/4, each in (0, 1), and the
    re-measurements (steps 1..3, then every `every`) do not drift away."""
    for seed in range(5):
        seen, meter = simulate([1.0, 3.0], steps=200, noise=0.2, seed=seed)
        for shares in meter.history:
            assert all(0 < s < 1 for s in shares) and math.isclose(sum(shares), 1.0)
            assert abs(shares[0] - 0.25) < 0.1, meter.history
        assert all(sum(r) == 64 and min(r) >= 1 for r in seen)


def test_a_rank_not_timed_yet_does_not_get_the_whole_batch():
    """On a GPU a step's compute time is read once its events have run, usually a step
    later: a rank that has none yet reports 0 s. 0 s must not read as infinite speed (all
    rows to that rank, one to every other): the measurement is skipped."""
    comm = FakeComm(2)
    meter = ShareMeter(comm, "measured")
    comm.table = [[32.0, 1.0], [32.0, 0.0]]
    meter.observe(32, 1.0)
    assert meter.shares == pytest.approx([0.5, 0.5])
    assert meter.rows(64) == [32, 32]
    comm.table = [[32.0, float("nan")], [32.0, 1.0]]   # nor a NaN: no crash, no change
    meter.observe(32, float("nan"))
    assert meter.rows(64) == [32, 32]
    comm.table = [[32.0, 3.0], [32.0, 1.0]]            # a real measurement is taken
    meter.observe(32, 3.0)
    assert meter.rows(64) == [16, 48]


def test_given_and_equal_shares_never_gather():
    for shares in (None, [0.7, 0.3]):
        comm = FakeComm(2)
        meter = ShareMeter(comm, shares)
        for _ in range(30):
            meter.observe(1, 1.0)
        assert comm.gathers == 0
    assert ShareMeter(FakeComm(2), [0.7, 0.3]).rows(10) == [7, 3]
