"""stream/simulate.py: a step played block by block on compute, both links and the CPU."""

import pytest

from outcore.stream.balance import BACKWARD_SHARE, Rates
from outcore.stream.simulate import simulate

NUMELS = [200] + [100] * 12          # rest + 12 blocks
FREE = 1e18                          # a link or CPU that takes no time


def test_with_nothing_to_wait_for_the_step_is_its_compute():
    compute = 1.2
    step = simulate(NUMELS, set(), 3, Rates(compute, FREE, FREE))
    rest_backward = BACKWARD_SHARE * compute * NUMELS[0] / sum(NUMELS[1:])
    assert step == pytest.approx(compute + rest_backward)


def test_a_slower_link_or_cpu_never_shortens_the_step():
    last = 0.0
    for link in (1e6, 5e3, 2e3, 1e3):
        s = simulate(NUMELS, {0, 1, 2, 3, 4}, 3, Rates(1.0, 1e4, link))
        assert s >= last
        last = s
    assert simulate(NUMELS, set(), 3, Rates(1.0, 500, FREE)) > \
        simulate(NUMELS, set(), 3, Rates(1.0, 5000, FREE))


def test_link_bound_forward_gains_from_kept_blocks():
    # loads of 400 bytes per block at 1e3 B/s take 0.4 s against 0.3 / 12 s of compute
    device = set(range(9))
    slow = Rates(1.0, FREE, 1e3)
    assert simulate(NUMELS, device, 3, slow, kept=5) < simulate(NUMELS, device, 3, slow)
    # blocks in the slots or at the end of forward are never kept: no difference from them
    assert simulate(NUMELS, {0, 1, 2}, 3, slow, kept=5) == simulate(NUMELS, {0, 1, 2}, 3, slow)


def test_the_cpu_bounds_a_step_that_updates_everything_on_it():
    # 1400 params at 100 params/s: 14 s of AdamW a step, against 1 s of compute
    step = simulate(NUMELS, set(), 3, Rates(1.0, 100, FREE))
    assert step == pytest.approx(14.0, rel=0.1)


def test_16_bit_loads_shorten_a_link_bound_step():
    slow = Rates(1.0, FREE, 1e3)
    assert simulate(NUMELS, set(), 3, slow, cpu_load_bytes=2) < \
        simulate(NUMELS, set(), 3, slow)
