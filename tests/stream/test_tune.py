"""UpdateTuner: device-updated groups go back to the CPU one at a time while the measured
step gets shorter, and the first hand-back that does not pay is undone; training stays
equal to plain PyTorch while groups move."""

import pytest

import outcore
from outcore.stream.tune import UpdateTuner

from .test_equivalence import EPS, LR, WD, assert_params_match, model_ref_batches, plain_steps


class FakeUpdater:
    def __init__(self, groups, n=8):
        self.groups, self.n = set(groups), n
        self.enabled = []

    def candidates(self):
        return list(range(self.n))

    def enable(self, gs):
        self.enabled += list(gs)
        self.groups |= set(gs)

    def hand_back(self, g):
        self.groups.discard(g)


def drive(tuner, times, start=1):
    msgs = []
    for i, t in enumerate(times):
        msgs.append(tuner.observe(start + i, t))
    return msgs


def test_hands_back_while_it_pays_then_undoes_the_first_that_does_not():
    u = FakeUpdater({0, 1, 2, 3, 4})
    t = UpdateTuner(u, window=2, skip=1, gain=0.01, start=1)
    # step 1 starts it; base 1.0; trial of group 4 (skip 1, then 0.9, 0.9): kept;
    # trial of group 3: 0.95 is slower than 0.9: undone
    drive(t, [0, 1.0, 1.0, 0.5, 0.9, 0.9, 0.5, 0.95, 0.95])
    assert [r["group"] for r in t.log] == [4, 3]
    assert [r["kept"] for r in t.log] == [True, False]
    assert u.groups == {0, 1, 2, 3} and u.enabled == [3]
    assert t.state == "done" and not t.busy()
    assert drive(t, [2.0] * 5) == [None] * 5      # done: nothing moves any more


def test_never_hands_back_rest_and_stops_at_max_trials():
    u = FakeUpdater({0, 1})
    t = UpdateTuner(u, window=1, skip=0, gain=0.0, start=1, max_trials=5)
    drive(t, [0, 1.0, 0.5, 0.4])    # group 1 kept (0.5 < 1.0); then only rest is left
    assert u.groups == {0} and t.state == "done"
    u = FakeUpdater({0, 1, 2, 3})
    t = UpdateTuner(u, window=1, skip=0, gain=0.0, start=1, max_trials=2)
    drive(t, [0, 1.0, 0.9, 0.8, 0.7, 0.6])
    assert u.groups == {0, 1} and len(t.log) == 2 and t.state == "done"


def test_waits_for_the_planner_then_is_busy_until_done():
    u = FakeUpdater({0, 1, 2})
    t = UpdateTuner(u, window=1, skip=0, start=9)
    assert drive(t, [1.0] * 7, start=2) == [None] * 7 and t.state == "wait"
    t.observe(9, 1.0)
    assert t.busy()


def test_training_matches_plain_pytorch_while_groups_move():
    model, ref, batches = model_ref_batches("decoder", steps=6)
    want = plain_steps(ref, batches, None, None)
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                         device="cpu", gpu_updates=3)
    eng.gpu_updates = "auto"   # the tuner acts with the planner ('auto' runs only on CUDA)
    eng.updater.tuner = UpdateTuner(eng.updater, window=1, skip=0, gain=-1.0, start=1)
    eng.updater.tuner.observe = _slower_each_time(eng.updater.tuner.observe)
    got = [eng.train_step(b) for b in batches]
    assert got == pytest.approx(want, rel=1e-5)
    assert_params_match(eng, ref)
    log = eng.updater.tuner.log
    assert [r["group"] for r in log][:2] == [3, 2]      # groups went back to the CPU
    eng.close()


def _slower_each_time(observe):
    """Feed the tuner step times that fall, so it keeps handing groups back."""
    state = {"t": 10.0}

    def wrapped(step, step_s):
        state["t"] -= 1.0
        return observe(step, state["t"])
    return wrapped
