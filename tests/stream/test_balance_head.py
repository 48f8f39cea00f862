"""The balance planner's head (rest and blocks 1-2 on the device) and its compute-bound
rule (the fewest groups where the model puts the step at the compute alone)."""

import pytest

from outcore.stream import balance
from outcore.stream.balance import Rates, choose, predict

# the reference decoder at 3B (models/decoder.py): rest (embedding, head, norm), 28 blocks
BLOCK_3B = 4 * 3072 * 3072 + 3 * 3072 * 8192 + 2 * 3072
NUMELS_3B = [2 * 32000 * 3072 + 3072] + [BLOCK_3B] * 28
ORDER_3B = list(range(len(NUMELS_3B)))


def test_3b_64k_takes_the_head_alone():
    """The rates the planner logged at 3b-64k on the H200 (session 16: compute 2.963 s,
    CPU 2.58 G params/s, 26 blocks of kept capacity): without the rules the model's best
    is 14 groups (3.262 s measured); with them rest and blocks 1-2 (3.170 s measured)."""
    rates = Rates(2.963, 2.58e9)
    kw = dict(cap=8, kept=26)
    preds = [predict(NUMELS_3B, set(ORDER_3B[:j]), "all", 3, rates, **kw)
             for j in range(len(ORDER_3B) + 1)]
    assert preds.index(min(preds)) > balance.HEAD   # the model's shortest: more groups
    # without the head, no group: every choice predicts under 3% less than none
    assert choose(NUMELS_3B, ORDER_3B, set(), "all", 3, rates, **kw) == set()
    assert choose(NUMELS_3B, ORDER_3B, set(), "all", 3, rates, floor=balance.HEAD,
                  **kw) == {0, 1, 2}


@pytest.mark.parametrize("compute_s,rate,kept", [(0.7006, 3.78e9, 33), (0.6973, 3.36e9, 15)])
def test_3b_16k_choice_is_unchanged(compute_s, rate, kept):
    """The two plans of session 15's 3b-16k record: the best predictions sit ~10% above
    the compute, so neither rule applies and the choice is the plain model's."""
    rates = Rates(compute_s, rate)
    kw = dict(cap=8, kept=kept)
    plain = choose(NUMELS_3B, ORDER_3B, set(), "all", 3, rates, **kw)
    assert len(plain) > balance.HEAD
    assert choose(NUMELS_3B, ORDER_3B, set(), "all", 3, rates, floor=balance.HEAD,
                  **kw) == plain


def test_the_head_is_dropped_where_the_model_predicts_it_much_slower():
    """A link so slow that every device group costs more than the step: no floor."""
    rates = Rates(compute_s=1e-3, cpu_params_per_s=1e12, link_bps=1e3)
    numels = [2000] + [1000] * 6
    order = list(range(7))
    assert choose(numels, order, set(), None, 3, rates) == set()
    assert choose(numels, order, set(), None, 3, rates, floor=3) == set()


def test_the_head_is_kept_where_it_costs_little():
    """A fast CPU (no group needed) and a link that hides a few groups' copies under the
    compute: the plain model keeps none, the head rule rest and blocks 1-2."""
    numels = [2000] + [1000] * 6
    order = list(range(7))
    rates = Rates(compute_s=1.0, cpu_params_per_s=1e12, link_bps=1e6)
    assert choose(numels, order, set(), None, 3, rates) == set()
    head = choose(numels, order, set(), None, 3, rates, floor=3)
    assert head == {0, 1, 2}
    assert predict(numels, head, None, 3, rates) <= balance.FLOOR_SLACK * \
        predict(numels, set(), None, 3, rates)


def test_compute_bound_takes_the_fewest_groups_within_the_bound():
    """A slow CPU whose work hides under a long compute once a few groups move: the plain
    best has more groups than the fewest that predict within COMPUTE_BOUND."""
    numels = [2000] + [1000] * 12
    order = list(range(13))
    rates = Rates(compute_s=1.0, cpu_params_per_s=1e4, link_bps=1e9)
    preds = [predict(numels, set(order[:j]), None, 3, rates) for j in range(14)]
    bound = balance.COMPUTE_BOUND * rates.compute_s
    fewest = next(j for j, p in enumerate(preds) if p <= bound)
    got = choose(numels, order, set(), None, 3, rates)
    assert got == set(order[:fewest])
    assert min(preds) < preds[fewest]   # the plain shortest had more groups


def test_the_current_groups_stay_when_the_choice_gains_little():
    """Hysteresis counts the head as held: from the head alone, a choice predicting under
    3% less keeps it."""
    rates = Rates(2.963, 2.58e9)
    held = {0, 1, 2}
    assert choose(NUMELS_3B, ORDER_3B, held, "all", 3, rates, cap=8, kept=26,
                  floor=balance.HEAD) == held
