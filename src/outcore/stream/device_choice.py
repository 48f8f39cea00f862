"""Which groups update on the device (device_update.py): the engine's `gpu_updates`
option, the order groups move in, and the backlog rule of the 'auto' planner (balance.py
has the 'balance' one).
"""

from __future__ import annotations

from ..errors import OutcoreError


def check_option(v, hold_updates: bool, cuda: bool):
    """Engine(gpu_updates=...): 'balance' (the default, balance.py: the groups a model of
    the step's queues picks, moved either way; CUDA only), 'auto' (groups added while the
    step waits for CPU updates, never moved back; CUDA only), 0 (off) or a number of
    blocks, with rest, to update on the device."""
    if v in (None, 0, "off"):
        return 0
    if v in ("auto", "balance"):
        # Device-side updates cannot wait for a global norm without holding gradients
        # on the device, so clipping keeps every update on the CPU (see deferred.py).
        return v if cuda and not hold_updates else 0
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        if hold_updates and v > 0:
            raise OutcoreError("gpu_updates > 0 cannot be combined with max_grad_norm or "
                               "skip_nonfinite: they need every gradient before any update")
        return v
    raise OutcoreError(f"gpu_updates={v!r}: use 'auto', 'balance', 0 or the number of "
                       "blocks to update on the device")


HEAD_BLOCKS = 3   # 'interleave' order: blocks 1..3 first, whole (the next forward's first)


def candidate_order(n: int, order: str) -> list[int]:
    """n groups (rest, blocks 1..n-1) in the order they move to the device (see
    DeviceUpdater's `order`)."""
    if order == "tail":
        return list(range(n))
    if order != "interleave":
        raise OutcoreError(f"device update order {order!r}: use 'tail' or 'interleave'")
    head = list(range(min(n, HEAD_BLOCKS + 1)))
    return head + list(range(HEAD_BLOCKS + 2, n, 2)) + list(range(HEAD_BLOCKS + 1, n, 2))


def backlog_groups(groups, taken, order, step_s: float, opt_wait_s: float,
                   cpu_busy_s: float, cpu_params: int) -> list[int]:
    """Groups (taken in `order`, not in `taken`) holding about the parameters the CPU could
    not update in time this step: the optimizer wait times the CPU's update rate seen this
    step, plus one group of margin. None when the wait was under 2% of the step."""
    if opt_wait_s <= 0.02 * step_s or cpu_busy_s <= 0 or cpu_params <= 0:
        return []
    backlog = opt_wait_s * cpu_params / cpu_busy_s
    added, moved = [], 0
    for g in order:
        if g in taken or not groups[g].numel:
            continue
        added.append(g)
        moved += groups[g].numel
        if moved > backlog and len(added) >= 2:
            break
    return added
