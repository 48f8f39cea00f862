"""The budget policy: swap only what the device budget cannot hold, keep the tensors that
backward needs first, and fall back to greedy decisions when the sizes change."""

import torch

import outcore
from outcore.swap import SwapConfig
from outcore.swap.policy import MIN_WINDOW, BudgetPolicy
from swap_testlib import assert_same_grads, batch, loss_of, tiny_cnn, twin


def _policy(**kw) -> BudgetPolicy:
    return BudgetPolicy(SwapConfig.build(**kw))


def _decide(policy, sizes, allocated=0, pending=0):
    plan = policy.begin(allocated, pending)
    out = [policy.offload(plan, n) for n in sizes]
    policy.end(plan)
    return plan, out


def test_no_budget_swaps_everything():
    _, out = _decide(_policy(), [10, 20, 30])
    assert out == [True, True, True]


def test_greedy_first_then_suffix_plan():
    p = _policy(gpu_memory=950, reserve_bytes=0, prefetch_bytes=50)
    sizes = [300, 200, 100, 250, 150]            # total 1000; limit = 950 - 2 * 50 = 850
    plan, out = _decide(p, sizes)
    assert plan.mode == "greedy" and out == [False, False, False, False, True]
    plan, out = _decide(p, sizes)                # same sizes: keep the longest fitting suffix
    assert plan.mode == "plan" and plan.m == 1
    assert out == [True, False, False, False, False]


def test_plan_keeps_everything_when_it_fits():
    p = _policy(gpu_memory=1000, reserve_bytes=0, prefetch_bytes=400)
    _decide(p, [300, 300, 300])                  # greedy: 1000 - 800 = 200 -> all swapped
    plan, out = _decide(p, [300, 300, 300])      # plan: 900 <= 1000, no window needed
    assert out == [False, False, False] and plan.m == 0


def test_allocated_and_pending_grads_shrink_the_room():
    p = _policy(gpu_memory=1000, prefetch_bytes=50)   # auto reserve: 50 + 4 x largest
    _decide(p, [100, 100])
    plan, out = _decide(p, [100, 100], allocated=300, pending=200)
    # room = 1000 - 300 - 200 - (50 + 400) = 50 < 200; limit = 50 - 100 < 100: swap both
    assert out == [True, True]
    plan, out = _decide(p, [100, 100], allocated=0, pending=0)
    assert out == [False, False]                 # room = 1000 - 450 = 550 >= 200


def test_changed_sizes_fall_back_to_greedy():
    p = _policy(gpu_memory=1000, reserve_bytes=0, prefetch_bytes=50)
    _decide(p, [300, 300])
    plan, out = _decide(p, [300, 700, 100])
    assert plan.mode == "greedy" and out == [False, True, False]
    assert p.profile == [300, 700, 100]


def test_auto_window():
    p = _policy(gpu_memory="1GiB")
    assert p.window(10) == MIN_WINDOW and p.window(MIN_WINDOW) == 2 * MIN_WINDOW


def _pack_events(trace, gen):
    return [e[0] for e in trace if e[1] == gen and e[0] in ("keep", "offload")]


def test_budget_on_cpu_keeps_what_fits_and_grads_stay_exact():
    plain = tiny_cnn()
    swapped = twin(plain)
    x, y = batch(8)
    with outcore.swap(twin(plain), min_swap_bytes=1, force_copy=True) as probe:
        loss_of(probe.model, x, y).backward()
    total = probe.report().bytes_to_host        # every candidate's bytes (all swapped)
    window = 64
    budget = total // 2 + 2 * window
    with outcore.swap(swapped, gpu_memory=budget, reserve_bytes=0, prefetch_bytes=window,
                      min_swap_bytes=1, force_copy=True, trace=True) as s:
        for step in range(2):
            for m in (plain, swapped):
                m.zero_grad()
                loss_of(m, x, y).backward()
            assert_same_grads(plain, swapped)
    first, second = _pack_events(s.trace, 1), _pack_events(s.trace, 2)
    assert first[0] == "keep" and "offload" in first            # greedy: early ones kept
    n_off = second.count("offload")
    assert 0 < n_off < len(second)
    assert second == ["offload"] * n_off + ["keep"] * (len(second) - n_off)  # a suffix kept
    kept = [e[3] for e in s.trace if e[1] == 2 and e[0] == "keep"]
    offloaded = [e[3] for e in s.trace if e[1] == 2 and e[0] == "offload"]
    assert sum(kept) <= total // 2 < sum(kept) + offloaded[-1]  # the longest suffix that fits
    r = s.report()
    assert r.kept_tensors > 0 and r.offloaded_tensors > 0


def test_big_budget_swaps_nothing():
    model = tiny_cnn()
    x, y = batch(4)
    with outcore.swap(model, gpu_memory="1GiB", min_swap_bytes=1, force_copy=True) as s:
        for _ in range(2):
            loss_of(model, x, y).backward()
    r = s.report()
    assert r.offloaded_tensors == 0 and r.kept_tensors > 0 and r.bytes_to_device == 0
    assert r.host_reserved_bytes == 0                     # nothing pinned when nothing moves
    assert torch.isfinite(next(model.parameters()).grad).all()
