"""Which staged gradient the CPU AdamW takes next, and the wait that order leaves the step.

Gradients reach the host in backward order (the last block first, `rest` last); the next
forward needs the updates in the other order (rest, block 1, block 2, ...). Where the CPU
AdamW cannot keep up with backward, a backlog forms, and which of it the worker takes
first decides what is left when backward ends:

  "arrival"  (the default) the oldest staged gradient first. The backlog left at
             backward's end is the lowest blocks, the first the next forward needs: its
             first CPU-updated block waits for all of it.
  "need"     (opt-in) the landed gradient the next forward needs first: the lowest group.
             The backlog left is the highest blocks, needed last, so the forward's own
             time before them covers part of it.

Either way, once backward has ended the worker takes what is left in forward order. The
amount of CPU work is the same; only where its lateness falls differs.

Measured in session 31 on the H200 at 3b-16k (outcore alone, three rounds in both orders,
bench/results/stream-h200-ab-s31{a,b,c}-*.json): "need" 0.888, 0.930, 0.882 s a step,
"arrival" 0.906, 0.910, 0.858: no faster. It shortened the CPU's wait (0.06-0.07 s against
0.12-0.13 at the same device groups) but not the step, which follows the device groups the
planner chose (1.33-1.56B params) and the host memory the CPU AdamW shares with the copies.
So "arrival" stays the default.
"""

from __future__ import annotations

from ..errors import OutcoreError

ORDERS = ("need", "arrival")


def check_order(order: str) -> str:
    if order not in ORDERS:
        raise OutcoreError(f"cpu update order {order!r} is not one of {', '.join(ORDERS)}")
    return order


def pick(groups: list[int], landed: list[bool], order: str, backward_over: bool) -> int:
    """The index in `groups` (staged gradients in arrival order; landed[i]: whether the
    i-th has reached the host) of the update the worker runs next."""
    if backward_over:
        # every gradient is staged: the forward's order, landed or not (the lowest is the
        # one the forward waits for first)
        return min(range(len(groups)), key=groups.__getitem__)
    if order == "need":
        ready = [i for i in range(len(groups)) if landed[i]]
        if ready:
            return min(ready, key=groups.__getitem__)
    return 0   # "arrival", or nothing landed yet: the oldest lands first


def cpu_lateness(numels, device, step_s: float, rate: float, cap: int | None = None,
                 order: str = "arrival", backward_share: float = 0.7) -> float:
    """Seconds by which the CPU AdamW holds up the step (a backward waiting to stage a
    gradient, the next forward waiting for an update) in a step of `step_s`.

    numels[g]: group g's params (0: rest); device: the groups updated on the device.
    Time 0 is backward's start; backward takes `backward_share` of the step and gives block
    g's gradient at its place in n-1..1, rest's at its end. The worker runs one update at a
    time, chosen by `pick` in "need" order ("arrival": the planner's model since session
    8, arrival order throughout; see _arrival_lateness). With `cap`
    (Engine.max_staged_grads) the i-th CPU gradient waits until i - cap + 1 updates are
    done, and backward with it. The next forward needs block g at its place in 1..n-1 and
    rest at once (so rest on the CPU is always late by its update)."""
    if order == "arrival":
        return _arrival_lateness(numels, device, step_s, rate, cap, backward_share)
    n, b = len(numels), backward_share
    cpu = [g for g in list(range(n - 1, 0, -1)) + [0] if g not in device]
    if rate <= 0 or not cpu:
        return 0.0
    arrived: list[float] = []    # the i-th CPU gradient's time on the host
    done: list[float] = []       # update end times, in the order they ran
    finish: dict[int, float] = {}
    shift = free = 0.0           # backward's stall so far; when the worker is free
    while len(finish) < len(cpu):
        while len(arrived) < len(cpu):
            i = len(arrived)
            g = cpu[i]
            t = b * step_s * ((n - g) / n if g else 1.0) + shift
            if cap and i >= cap:
                if len(done) <= i - cap:
                    break        # staged only after an update not yet run
                if done[i - cap] > t:
                    shift += done[i - cap] - t   # backward stalls until one is done
                    t = done[i - cap]
            arrived.append(t)
        waiting = [i for i in range(len(arrived)) if cpu[i] not in finish]
        now = max(free, min(arrived[i] for i in waiting))
        landed = [arrived[i] <= now for i in waiting]
        over = len(arrived) == len(cpu) and now >= b * step_s + shift
        i = waiting[pick([cpu[i] for i in waiting], landed, order, over)]
        free = max(now, arrived[i]) + numels[cpu[i]] / rate
        finish[cpu[i]] = free
        done.append(free)
    start = b * step_s + shift   # the next forward's start
    late = max(finish[g] - (start + (1 - b) * step_s * g / n) for g in cpu)
    return shift + max(0.0, late)


def _arrival_lateness(numels, device, step_s: float, rate: float, cap: int | None,
                      b: float) -> float:
    """cpu_lateness in the "arrival" order, the planner's model since session 8 (which
    bench/balance_replay.py replays): every update in arrival order, also those left when
    backward ends (which the engine runs in forward order: a little pessimistic), and each
    block's need shifted by backward's stall up to its update."""
    n = len(numels)
    t = late = shift = 0.0
    done: list[float] = []
    for g in list(range(n - 1, 0, -1)) + [0]:
        if g in device or rate <= 0:
            continue
        ready = b * step_s * ((n - g) / n if g else 1.0) + shift
        if cap and len(done) >= cap and done[-cap] > ready:
            shift += done[-cap] - ready      # backward stalls until a staged one is done
            ready = done[-cap]
        t = max(t, ready) + numels[g] / rate
        done.append(t)
        late = max(late, t - (b * step_s + shift + (1 - b) * step_s * g / n))
    return shift + late
