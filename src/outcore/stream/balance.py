"""Which groups' AdamW runs on the device, chosen from a model of the step's three queues.

The `auto` planner (device_choice.backlog_groups) moves groups to the device while the
step waits for the CPU, and never back. Each moved group costs PCIe time: its m and v
cross to the device and back (8 B/param each way) and its master comes back (12 B/param
out instead of a 4 B/param gradient). On the H200 at 3b-16k that planner moved 22 blocks
and rest after the first, compile-slowed steps (stream-h200-session7.json): the step
became h2d-bound (about 44 GB in at ~50 GB/s against 0.67 s of compute), 1.038 s.

The `balance` policy (the default since session 8: 0.885 s there with 7 groups,
stream-h200.json) instead predicts a step for every prefix of the candidate order and
keeps the shortest, moving groups either way. Its model (MODEL) is `predict` here, the
step's queues (compute, overlapped with the longest of h2d bytes / link rate, d2h bytes /
link rate and CPU-updated params / the CPU's measured AdamW rate) plus what the CPU
AdamW holds it up (cpu_lateness); stream/simulate.py's step played block by block is the
opt-in alternative. Two rules sit on top of the model (session 17): the head (HEAD: rest
and blocks 1-2 stay on the device unless the model puts that FLOOR_SLACK slower) and, where
the model puts the step at its compute, the fewest groups (COMPUTE_BOUND). The rates only
steer: a wrong one costs speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cpu_order import cpu_lateness   # the queues model's CPU term

# Bytes per second each way while both directions run and the CPU AdamW shares host DRAM:
# ../shared/DESIGN.md measured 88 GB/s both ways together under AdamW on the H200. At 42.5
# the copies alone of the two copy-bound 3b-16k runs take their measured steps (23 groups:
# 1.039 s, 1.038 measured at c2b5c7c; 19 groups: 0.955 s, 0.948 at 3b97cc1).
LINK_BPS = 42.5e9
# The CPU AdamW's rate before a step has measured one (every group on the device measures
# none): DESIGN.md's 2.5 G params/s on the H200's 16 cores while copies run both ways.
CPU_PRIOR = 2.5e9
HYSTERESIS = 0.97   # a new choice must predict a step at least 3% shorter
# The head: rest and blocks 1-2, the last gradients of backward and the first groups the
# next forward needs, update on the device (where the budget holds them: affordable) unless
# the model predicts that at least FLOOR_SLACK slower than its best. On the CPU their
# updates are the step's tail: at 3b-64k on the H200, with no group on the device, the next
# forward waited 0.35-0.37 s for them (sessions 11 and 16, stream-h200.json and
# -s16-64k.json), where cpu_lateness predicts 0.07; with the head on the device the wait
# was 0.06-0.08 s and the step 3.170 s against 3.266-3.278 (-s16-64k-dev2.json). Session
# 17's A/B at 7790d58: with the head 3.135 s (422 TFLOP/s, -s17-64k.json), without it no
# group and 3.239 s (409, -s17-64k-head0.json). Blocks 1-2 are still in their slots when
# the next forward starts (no load) and rest stays resident.
HEAD = 3
FLOOR_SLACK = 1.05
# Where the best prediction is within COMPUTE_BOUND of the compute alone (the copies and
# the CPU hidden under it), the fewest groups predicted within that bound: each more group
# only adds copies the model counts as hidden. At 3b-64k the model put 2-16 groups within
# 1% of one another (2.98-3.00 s); 14 groups measured 3.262 s (session 16), the head alone
# 3.170. At 3b-16k and 1b-16k the best predictions sit 10% above the compute: no change.
COMPUTE_BOUND = 1.01
# The planner's model of a step: "queues" (predict below; the default) or "simulate"
# (stream/simulate.py, block by block; opt-in). With the fused host copies at 3b-16k on
# the H200 the queues model picked 13-15 device groups where it measured a CPU rate near
# 3.2 G params/s, predicting 0.76 s; those steps took 0.896-0.937 s (stream-h200-s11.json,
# -s12-omp12/14.json), against 0.854-0.869 s where it stopped at 11 (-s10*.json,
# -s12-omp16.json). The simulation fits those rows better (4.0% rms over the 8 fused-copy
# rows, against 14.6% for the queues model, bench/balance_fit.py; it puts 11 groups at
# 0.86 s), but as the planner's model (session 12, stream-h200-s12-sim.json) it chose 8
# and then 10 groups, predicted 0.874 s and measured 0.913 s (0.933 by the mean), against
# in-memory PyTorch's 0.799 in the same run: no better, so it stays opt-in. Session 33, at
# the one-pass AdamW+cast kernel: it led the default in two rounds (0.873 and 0.849 s, 9-10
# groups, predicted within 2%; the default 0.884 and 0.892 at 12 groups, predicted 0.75)
# and ran 0.899 beside PyTorch's 0.799 (stream-h200-ab-s33*.json, -s33-3b16k-sim.json);
# session 34: ahead at 1b-16k in two rounds (0.267 and 0.263 s against 0.277 and 0.275)
# but behind in 3b-16k's third (0.929 against 0.902; over the three 0.884 against 0.893,
# inside the spread between runs), so still opt-in (bench/NOTES.md, sessions 33-34).
MODEL = "queues"
# Which measured CPU AdamW rate the planner uses: "last" (the default) or "best" (the
# highest so far; opt-in, written in session 12 when no device time was left to run it).
# A rate measured after groups moved to the device is lower (by 6-26% in the runs below:
# the device groups' copies share host DRAM with the CPU AdamW), and the models charge
# those copies to the link already. On that lower rate the planner moved more groups in
# eight of twelve 3b-16k runs on the H200 (sessions 8-12), which took 0.865-0.939 s a
# step (means 0.889-0.961), against 0.854-0.885 s (means 0.878-0.902) in the four that
# kept their first choice; the runs differ in more than that (copies, threads, kept
# weights). bench/balance_replay.py replays those later plans: with "best" none adds a
# group with the engine's staging cap of sessions 6-29. Measured in session 22 (two rounds,
# `stream-h200-ab-s22{a,b}-*.json`): 0.924 and 0.954 s against 0.923 and 0.939, no faster.
CPU_RATE = "last"
# Compute and copies overlap imperfectly: a step is (compute^K + copies^K)^(1/K), not the
# larger of the two. K = 4 fit the 26 outcore rows of bench/results/stream-h200*.json
# without host copies or held updates (sessions 1-8, eager and compiled, 1-23 device
# groups; the CPU counted where a row logged its AdamW rate) with an rms error of 7.8%
# against their mean steps (the larger alone: 11.8%). It is optimistic where it chose:
# 0.835 s predicted at 3b-16k for 7 groups, 0.902 s measured (session 8); with session 9's
# rows (its planner's own choices, 7-25% slower than predicted) the rms is 9.4% over 31
# rows (K = 3: 8.4%; the larger alone: 13.4%). stream/simulate.py, which plays the step
# block by block, fits them within 7.3% with no fitted parameter; it agrees with this
# planner's choices at 3b-16k and 1b-16k. bench/balance_fit.py prints both.
OVERLAP_K = 4
BACKWARD_SHARE = 0.7   # of a step: the recompute and the gradients against the forward


@dataclass(frozen=True)
class Rates:
    """compute_s: the step's GPU compute; cpu_params_per_s: the CPU AdamW's rate as the
    last steps measured it (under copy traffic); link_bps: each PCIe direction."""
    compute_s: float
    cpu_params_per_s: float
    link_bps: float = LINK_BPS


def kept_blocks(n: int, device: set[int], n_slots: int, kept: int) -> set[int]:
    """The device blocks of a model of n groups whose next forward keep.py serves: those
    between the slots' two ends (KeptWeights.keepable), at most `kept` of them, the first
    updated in backward (the highest) first."""
    return set(sorted((g for g in device if n_slots < g <= n - 1 - n_slots),
                      reverse=True)[:max(0, kept)])


def traffic(numels: list[int], device: set[int], copy_mode: str | None,
            n_slots: int, kept: int = 0, grad_bytes: int = 4,
            lazy: bool = False) -> tuple[int, int, int]:
    """(h2d bytes, d2h bytes, CPU-updated params) of one step whose `device` groups update
    on the device. numels[0] is rest (resident: reloaded after a CPU update of it);
    blocks 1..n-1 are loaded in forward and again in backward, except cache hits: the
    first n_slots blocks of forward when their update was made in their slot, the last
    n_slots of forward in backward (their fp32 still there, unless forward loaded a copy
    and backward needs fp32), and in forward the device blocks between those two that
    keep.py keeps on the device (`kept` of them, the first updated: the highest).
    grad_bytes: per param of a CPU-updated block's gradient (2 where flow.half_grad).
    lazy: DeviceUpdater.lazy_copies, counted as if no device update sent a copy out and
    every device block that forward does not find on the device loaded its fp32 master
    (the form session 14 measured first; since then only the blocks kept or left in a
    slot skip their copy, so this undercounts d2h and overcounts forward h2d a little)."""
    n = len(numels)
    h2d = d2h = cpu = 0
    held = kept_blocks(n, device, n_slots, kept)
    for g, k in enumerate(numels):
        dev = g in device
        copy_fwd = copy_mode == "all" or (copy_mode == "device" and dev)
        if g == 0:
            h2d += 0 if dev else 4 * k   # resident; reloaded after a CPU update of it
        else:
            if not (dev and g <= n_slots) and g not in held:
                h2d += (2 if copy_fwd and not (dev and lazy) else 4) * k
            tail = g > n - 1 - n_slots
            if not (tail and not (dev and copy_fwd)):
                h2d += (4 if dev or copy_mode != "all" else 2) * k
        if dev:
            h2d += 8 * k                                  # m, v in
            d2h += 12 * k + (2 * k if copy_mode and g and not lazy else 0)   # (and copy)
        else:
            d2h += (grad_bytes if g else 4) * k           # the gradient
            cpu += k
    return h2d, d2h, cpu


def predict(numels, device, copy_mode, n_slots, rates: Rates,
            cap: int | None = None, k: float = OVERLAP_K, kept: int = 0,
            grad_bytes: int = 4, lazy: bool = False, cpu_order: str = "arrival") -> float:
    """The step's predicted seconds: compute and the longest other queue, overlapped as
    `k` says (OVERLAP_K; inf: the larger), plus what the CPU AdamW holds it up
    (cpu_lateness; `cap`: Engine.max_staged_grads; `cpu_order`: the worker's, see
    cpu_order.py). cpu_params_per_s <= 0: the CPU is not counted. kept, grad_bytes,
    lazy: as in traffic."""
    h2d, d2h, cpu = traffic(numels, device, copy_mode, n_slots, kept, grad_bytes, lazy)
    rate = rates.cpu_params_per_s
    other = max(h2d / rates.link_bps, d2h / rates.link_bps, cpu / rate if rate > 0 else 0.0)
    c = rates.compute_s
    t = max(c, other) if math.isinf(k) else (c ** k + other ** k) ** (1 / k)
    return t + cpu_lateness(numels, device, t, rate, cap, cpu_order, BACKWARD_SHARE)


def choose(numels, order: list[int], current: set[int], copy_mode, n_slots,
           rates: Rates, cap: int | None = None, kept: int = 0,
           grad_bytes: int = 4, step=None, lazy: bool = False, floor: int = 0,
           cpu_order: str = "arrival") -> set[int]:
    """The prefix of `order` with the shortest predicted step (the fewest groups among
    equals, and the fewest within COMPUTE_BOUND of the compute where the best is); at
    least `floor` groups long unless that predicts FLOOR_SLACK slower (see HEAD); `current`
    (with the floor) unless the choice predicts at least 1 - HYSTERESIS shorter. step: the
    model, device groups -> seconds (default: predict with these arguments)."""
    if step is None:
        def step(d: set[int]) -> float:
            return predict(numels, d, copy_mode, n_slots, rates, cap, kept=kept,
                           grad_bytes=grad_bytes, lazy=lazy, cpu_order=cpu_order)
    preds = [step(set(order[:j])) for j in range(len(order) + 1)]
    lo, best_any = min(floor, len(order)), _shortest(preds, 0)
    j = _shortest(preds, lo)
    if preds[j] > FLOOR_SLACK * preds[best_any]:
        lo, j = 0, best_any
    bound = COMPUTE_BOUND * rates.compute_s
    if preds[j] <= bound:
        j = next(i for i in range(lo, len(preds)) if preds[i] <= bound)
    best, best_s = set(order[:j]), preds[j]
    held = set(current) | set(order[:lo])
    return best if best_s < HYSTERESIS * step(held) else held


def _shortest(preds: list[float], lo: int) -> int:
    """The index >= lo of the shortest prediction, the first of equals (to 1e-9)."""
    j = lo
    for i in range(lo + 1, len(preds)):
        if preds[i] < preds[j] * (1 - 1e-9):
            j = i
    return j


def step_model(numels, copy_mode, n_slots, rates: Rates, cap: int | None, kept: int,
               grad_bytes: int, lazy: bool = False, cpu_order: str = "arrival"):
    """MODEL's step of a set of device groups (-> seconds). The simulation has no cap on
    staged gradients and no "device" copy mode: the queues model serves those."""
    if MODEL == "simulate" and copy_mode in (None, "all"):
        from .simulate import simulate   # imports this module
        return lambda d: simulate(numels, d, n_slots, rates, kept=kept,
                                  cpu_load_bytes=2 if copy_mode else 4,
                                  cpu_grad_bytes=grad_bytes, copies=copy_mode == "all",
                                  prefetch=n_slots - 1)
    return lambda d: predict(numels, d, copy_mode, n_slots, rates, cap, kept=kept,
                             grad_bytes=grad_bytes, lazy=lazy, cpu_order=cpu_order)


class Balancer:
    """DeviceUpdater.policy = "balance": re-chooses the device groups after each planned
    step from that step's compute time and the CPU's AdamW rate (CPU_RATE: the highest
    measured, or the last; CPU_PRIOR until one is measured: a step with no CPU-updated
    group measures none)."""

    def __init__(self, updater):
        self.u = updater
        self.cpu_rate = CPU_PRIOR
        self.measured = 0.0   # the highest CPU rate measured so far
        self.floor = HEAD     # groups of the candidate order kept on the device (HEAD)
        self.log: list[dict] = []

    def plan(self, compute_s: float, cpu_busy_s: float, cpu_params: int) -> list[int]:
        """The groups moved to the device (those handed back are in `log`)."""
        if cpu_busy_s > 0 and cpu_params > 0:
            rate = cpu_params / cpu_busy_s
            self.measured = max(self.measured, rate)
            self.cpu_rate = self.measured if CPU_RATE == "best" else rate
        if self.cpu_rate <= 0 or compute_s <= 0:
            return []
        e = self.u.e
        numels = [g.numel for g in e.groups]
        rates = Rates(compute_s, self.cpu_rate, LINK_BPS)
        cap = None if e.hold_updates else e.max_staged_grads
        order = self.u.candidates()
        kept = e.keep.capacity_blocks() if e.keep.enabled else 0
        model = step_model(numels, e.copy_mode, len(e.cache.slots), rates, cap, kept,
                           e.stats.cpu_grad_bytes, self.u.lazy_copies, e.schedule.order)
        want = choose(numels, order, self.u.groups, e.copy_mode, len(e.cache.slots), rates,
                      step=model, floor=self.floor)
        added = self.u.affordable([g for g in order if g in want and g not in self.u.groups])
        back = sorted(self.u.groups - want)
        self.u.enable(added)
        for g in back:
            # Its next gradient goes to the CPU worker. The CPU then reads g's host m, v:
            # the device wrote them back on the d2h stream before that gradient's copy.
            self.u.hand_back(g)
        if added or back:
            s = model(set(self.u.groups))
            self.log.append({"step": e.step_count, "added": added, "back": back,
                             "predicted_s": s, "cpu_params_per_s": self.cpu_rate,
                             "compute_s": compute_s, "kept_capacity": kept})
            if back and e.verbose:
                print(f"outcore: AdamW of groups {back} back to the CPU (balance: step "
                      f"predicted {s:.2f} s)", flush=True)
        return added
