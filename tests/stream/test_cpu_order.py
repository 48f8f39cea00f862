"""The order in which the CPU AdamW takes staged gradients (stream/cpu_order.py)."""

import threading
import time

import pytest
import torch

import outcore
from outcore.errors import OutcoreError
from outcore.stream import balance
from outcore.stream.cpu_order import cpu_lateness, pick
from outcore.stream.schedule import UpdateSchedule

from .models import batch_for

K = 1000


def test_pick_takes_the_lowest_landed_group_in_need_order():
    groups, landed = [6, 5, 4, 3], [True, True, True, False]
    assert pick(groups, landed, "need", False) == 2          # group 4: 3 has not landed
    assert pick(groups, landed, "arrival", False) == 0       # the oldest
    assert pick(groups, [False] * 4, "need", False) == 0     # none landed: the oldest
    for order in ("need", "arrival"):                        # backward over: forward order
        assert pick(groups, landed, order, True) == 3


def test_need_order_leaves_the_backlog_the_next_forward_needs_last():
    """Six CPU blocks of 0.25 s against a gradient every 0.1 s of backward's 0.7 s (a 1 s
    step, rest on the device). In need order the worker runs 6, 4, 2, then (backward over)
    1, 3, 5: block 5, the next forward's fifth, ends at 1.6 s. The "arrival" model (the
    planner's default) runs 6, 5, ..., 1: block 1, the first, ends at 1.6 s."""
    numels = [K] * 7
    rate = K / 0.25
    need = lambda g: 0.7 + 0.3 * g / 7   # noqa: E731 (the next forward's need of block g)
    arrival = cpu_lateness(numels, {0}, 1.0, rate, order="arrival")
    got = cpu_lateness(numels, {0}, 1.0, rate, order="need")
    assert cpu_lateness(numels, {0}, 1.0, rate) == arrival   # the default
    assert arrival == pytest.approx(1.6 - need(1))
    assert got == pytest.approx(1.6 - need(5))
    # and the queues model the balance planner predicts with sees the difference
    rates = balance.Rates(compute_s=1.0, cpu_params_per_s=rate, link_bps=1e12)
    diff = (balance.predict(numels, {0}, None, 3, rates, cpu_order="arrival")
            - balance.predict(numels, {0}, None, 3, rates, cpu_order="need"))
    assert diff > 0.05


def test_a_cap_counts_any_finished_update_in_need_order():
    """With room for one staged gradient, backward waits for each update whatever the
    order: both orders then run in arrival order and agree."""
    numels = [K] * 7
    rate = K / 0.11
    assert cpu_lateness(numels, {0}, 1.0, rate, cap=1, order="need") == pytest.approx(
        cpu_lateness(numels, {0}, 1.0, rate, cap=1, order="arrival"))


def _run_order(order: str, end_backward: bool) -> list[int]:
    """UpdateSchedule's worker, held in group 6's update while 5, 4 and 3 (3 not landed yet)
    are staged: the groups in the order it ran them."""
    ran, started, go = [], threading.Event(), threading.Event()
    landed = {6: True, 5: True, 4: True, 3: False}

    def fn(g, payload, scale):
        ran.append(g)
        if g == 6:
            started.set()
            go.wait(5)
    sched = UpdateSchedule(fn, landed=lambda g: landed[g], order=order)
    sched.submit(6, 6)
    assert started.wait(5)
    for g in (5, 4, 3):
        sched.submit(g, g)
    if end_backward:
        sched.end_backward()
    go.set()
    sched.wait_all()
    sched.close()
    return ran


def test_the_worker_runs_what_the_forward_needs_first():
    assert _run_order("need", False) == [6, 4, 5, 3]
    assert _run_order("arrival", False) == [6, 5, 4, 3]
    assert _run_order("need", True) == [6, 3, 4, 5]
    assert _run_order("arrival", True) == [6, 3, 4, 5]


def test_an_unknown_order_is_refused():
    with pytest.raises(OutcoreError, match="not one of need, arrival"):
        UpdateSchedule(lambda *a: None, order="fifo")
    sched = UpdateSchedule(lambda *a: None)
    with pytest.raises(OutcoreError, match="not one of need, arrival"):
        sched.order = "lifo"
    sched.close()


def test_training_is_the_same_in_either_order():
    """The order changes when each group is updated, never what: a CPU AdamW slower than
    backward (a backlog to reorder), two steps, the same losses and weights bit for bit."""
    gen = torch.Generator().manual_seed(0)
    b = batch_for("decoder", gen, rows=4)
    runs, weights, orders = [], [], []
    for order in ("arrival", "need"):
        torch.manual_seed(0)
        eng = outcore.Engine(outcore.models.decoder("tiny", layers=6, vocab=96, max_seq=64),
                             device="cpu")
        assert eng.schedule.order == "arrival"   # the default
        eng.schedule.order = order
        step, ran = eng.opt.step, []

        def slow(g, *args, **kw):
            ran.append(g)
            time.sleep(0.01)
            step(g, *args, **kw)
        eng.opt.step = slow
        runs.append([eng.train_step(b) for _ in range(2)])
        eng.synchronize()
        weights.append([m.clone() for m in eng.host.master])
        orders.append(ran)
        eng.close()
    assert runs[0] == runs[1]
    assert all(torch.equal(x, y) for x, y in zip(*weights))
    assert sorted(orders[0]) == sorted(orders[1])
