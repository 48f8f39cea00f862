"""gpu_updates="balance": the model of a step's queues, and training equal to plain PyTorch
while groups move to the device and back."""

import pytest

import outcore
from outcore.stream import balance
from outcore.stream.balance import Rates, choose, predict, traffic

from .test_equivalence import EPS, LR, WD, assert_params_match, model_ref_batches, plain_steps

K = 1000   # a block's numel; rest is 2K


def test_traffic_counts_each_queue_by_hand():
    numels = [2 * K] + [K] * 6            # rest + 6 blocks, 3 slots
    # All on the CPU, no copies: rest reloaded (4), every block loaded in forward (4) and
    # in backward but the last 3 of forward (still in their slots); gradients out (4).
    h2d, d2h, cpu = traffic(numels, set(), None, 3)
    assert h2d == 4 * 2 * K + 6 * 4 * K + 3 * 4 * K
    assert d2h == 4 * 8 * K and cpu == 8 * K
    # Rest and block 1 on the device: rest's m, v in (8), no reload; block 1 a forward hit
    # (updated in its slot), loaded in backward, m, v in; both send master, m, v out (12).
    h2d, d2h, cpu = traffic(numels, {0, 1}, None, 3)
    assert h2d == 8 * 2 * K + (5 * 4 * K) + (3 * 4 * K) + 8 * K
    assert d2h == 12 * 3 * K + 4 * 5 * K and cpu == 5 * K


def test_copies_halve_the_loads_they_replace():
    numels = [2 * K] + [K] * 6
    plain = traffic(numels, set(), None, 3)[0]
    copies = traffic(numels, set(), "all", 3)[0]
    # forward 6 blocks and backward 3 blocks at 2 B instead of 4
    assert plain - copies == 2 * (6 + 3) * K


def test_the_choice_follows_the_cpu_rate():
    numels = [2 * K] + [K] * 6
    order = list(range(7))
    fast_cpu = Rates(compute_s=1e-6, cpu_params_per_s=1e12, link_bps=1e9)
    assert choose(numels, order, set(), None, 3, fast_cpu) == set()
    slow_cpu = Rates(compute_s=1e-6, cpu_params_per_s=1.0, link_bps=1e9)
    assert choose(numels, order, set(), None, 3, slow_cpu) == set(order)
    # the chosen prefix predicts the shortest step of all prefixes
    mid = Rates(compute_s=1e-6, cpu_params_per_s=2e8, link_bps=1e9)
    got = choose(numels, order, set(), None, 3, mid)
    best = min(predict(numels, set(order[:j]), None, 3, mid) for j in range(8))
    assert predict(numels, got, None, 3, mid) == pytest.approx(best)


def test_a_small_gain_keeps_the_current_groups():
    numels = [2 * K] + [K] * 6
    order = list(range(7))
    rates = Rates(compute_s=1e-6, cpu_params_per_s=2e8, link_bps=1e9)
    best = choose(numels, order, set(), None, 3, rates)
    near = set(order[:len(best) + 1])   # one group more: a prediction within 3%?
    if predict(numels, near, None, 3, rates) <= predict(numels, best, None, 3, rates) / 0.97:
        assert choose(numels, order, near, None, 3, rates) == near


@pytest.mark.parametrize("link,start,want", [(1e3, "all", "fewer"), (1e15, "none", "all")])
def test_training_equals_plain_pytorch_while_groups_move(monkeypatch, link, start, want):
    """On the CPU ('balance' plans only on CUDA unless forced): groups handed back to the
    CPU after steps on the device (a slow link: all of them with the queues model, the
    default; MODEL = "simulate" keeps rest and block 1, whose updates the next forward
    needs first), or all moved to the device (a fast link, a slow CPU): the same losses
    and weights as plain PyTorch."""
    monkeypatch.setattr(balance, "LINK_BPS", link)
    model, ref, batches = model_ref_batches("decoder", steps=6)
    want_losses = plain_steps(ref, batches, None, None)
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                         device="cpu", gpu_updates=0)
    eng.gpu_updates, eng.updater.policy = "balance", "balance"   # forced on the CPU
    n = len(eng.groups)
    if start == "all":
        eng.updater.enable(list(range(n)))
    got = []
    for b in batches:
        if want == "all":
            eng._cpu_busy_s = 1e3   # a very slow CPU: every update wants the device
        got.append(eng.train_step(b))
    if want == "all":
        assert eng.updater.groups == set(range(n))
    else:
        assert len(eng.updater.groups) < n
        assert any(row["back"] for row in eng.updater.balancer.log)
    assert got == pytest.approx(want_losses, rel=1e-5)
    assert_params_match(eng, ref)
    assert eng.updater.balancer.log
    eng.close()


def test_rest_on_the_cpu_holds_up_the_next_forward_by_its_update():
    numels = [2 * K] + [K] * 6
    rate = 1e6   # params/s: rest's update takes 2 ms
    assert balance.cpu_lateness(numels, set(range(1, 7)), 1.0, rate) == pytest.approx(2e-3)
    assert balance.cpu_lateness(numels, set(range(7)), 1.0, rate) == 0.0


def test_a_cap_on_staged_gradients_stalls_backward():
    """Six CPU blocks of 0.11 s each against gradients every 0.1 s of a 1 s step: the
    worker finishes block 1 17 ms after the forward wants it; with room for one staged
    gradient backward also waits 10 ms at each block after the first."""
    numels = [2 * K] + [K] * 6
    device, rate = {0}, K / 0.11
    free = balance.cpu_lateness(numels, device, 1.0, rate)
    capped = balance.cpu_lateness(numels, device, 1.0, rate, cap=1)
    assert free == pytest.approx(0.76 - (0.7 + 0.3 / 7))
    assert capped == pytest.approx(0.05)
    # with room for every gradient the cap changes nothing
    assert balance.cpu_lateness(numels, device, 1.0, rate, cap=6) == pytest.approx(free)


def test_device_copies_change_only_the_device_blocks():
    numels = [2 * K] + [K] * 6
    # Block 5 on the device: forward loads its copy (2 B, not 4); backward loads its fp32
    # (a tail block whose slot holds the copy: not a hit); its copy goes out too (+2 B).
    plain = traffic(numels, {0, 5}, None, 3)
    copied = traffic(numels, {0, 5}, "device", 3)
    assert copied[0] - plain[0] == -2 * K + 4 * K
    assert copied[1] - plain[1] == 2 * K
    assert copied[2] == plain[2]


def test_the_simulated_model_chooses_the_shortest_simulated_step(monkeypatch):
    """balance.MODEL = "simulate": the planner's choice is the prefix whose step
    stream/simulate.py plays shortest (the queues model is what serves a staged-gradient
    cap it cannot see and the 'device' copy mode)."""
    from outcore.stream.simulate import simulate
    numels = [2 * K] + [K] * 6
    order = list(range(7))
    rates = Rates(compute_s=1e-3, cpu_params_per_s=2e6, link_bps=2e6)
    monkeypatch.setattr(balance, "MODEL", "simulate")
    model = balance.step_model(numels, None, 3, rates, None, 0, 4)
    got = choose(numels, order, set(), None, 3, rates, step=model)
    steps = [simulate(numels, set(order[:j]), 3, rates) for j in range(8)]
    assert simulate(numels, got, 3, rates) == pytest.approx(min(steps))
    assert model(got) == pytest.approx(min(steps))
    # the 'device' copy mode has no simulation: the queues model
    queues = balance.step_model(numels, "device", 3, rates, None, 0, 4)
    assert queues({0, 1}) == pytest.approx(predict(numels, {0, 1}, "device", 3, rates))


@pytest.mark.parametrize("mode,want", [("best", [[], [], []]),
                                       ("last", [[], [0, 1], [0, 1, 2, 3, 4]])])
def test_the_planner_keeps_the_highest_cpu_rate_it_measured(monkeypatch, mode, want):
    """CPU_RATE = "best": a lower rate measured later (on the H200, under the copies of the
    groups already moved) moves no more groups; "last" follows it."""
    monkeypatch.setattr(balance, "LINK_BPS", 1e9)
    monkeypatch.setattr(balance, "CPU_RATE", mode)
    model, _, _ = model_ref_batches("decoder", steps=1)
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                         device="cpu", gpu_updates=0)
    planner = balance.Balancer(eng.updater)
    n = sum(g.numel for g in eng.groups)
    got = []
    for busy_s in (1e-4, 1e-3, 1e-2):   # the CPU's measured rate falls 10x each time
        planner.plan(1e-4, busy_s, n)
        got.append(sorted(eng.updater.groups))
    assert got == want
    assert planner.cpu_rate == pytest.approx(n / (1e-4 if mode == "best" else 1e-2))
    eng.close()
