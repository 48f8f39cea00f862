"""The device's memory peak outside the checkpoints, measured block by block.

The checkpoints kept on the device (stash.py) live from a block's forward to its backward,
so they are most numerous at the end of forward. The rest of what a step holds (weights
and gradients in flight, the recompute's activations, the m and v of device-updated
groups) can peak elsewhere: late in backward, where the device updates' m, v are held.
The step's peak minus the checkpoints' own peak then underestimates the rest whenever the
step's peak falls where fewer checkpoints are held, and the next step, given the
difference as room for checkpoints, overruns its budget (7b-16k in 14.5 GiB on the H200,
session 6: out of memory in the step after 15 blocks' AdamW moved to the device).

So the allocator's peak counters are read and reset at every block boundary; an interval's
peak less the checkpoints held throughout it is the rest's peak there. Kept weights
(keep.py) share the checkpoints' room and count as held like them (stash.held_bytes).
"""

from __future__ import annotations

from typing import Callable

import torch


def _cuda_read(device) -> Callable[[], tuple[int, int]]:
    """(allocated peak, reserved peak) from one read of the allocator's stats: the nested
    dict as the allocator gives it (torch.cuda.max_memory_allocated would flatten all of
    them in Python, twice, at every block)."""
    def read():
        st = torch.cuda.memory.memory_stats_as_nested_dict(device)
        return st["allocated_bytes"]["all"]["peak"], st["reserved_bytes"]["all"]["peak"]
    return read


class PeakWatch:
    """mark() at every block boundary; begin_step() before a step.

    step_other: this step's largest interval peak less the checkpoint bytes held on the
      device throughout that interval (the smaller of its two ends' counts).
    peak_allocated, peak_reserved: running maxima over every interval so far (what
      torch.cuda.max_memory_allocated / max_memory_reserved would report over the run,
      had the engine not reset them).
    read, reset: the counters (injected in CPU tests); None on the CPU: nothing is watched.
    """

    def __init__(self, stash, read: Callable[[], tuple[int, int]] | None,
                 reset: Callable[[], None] | None):
        self.stash = stash
        self.read, self.reset = read, reset
        self.step_other = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self._held = 0   # checkpoint bytes on the device when the interval began

    @classmethod
    def for_device(cls, stash, device, cuda: bool) -> "PeakWatch":
        if not cuda:
            return cls(stash, None, None)
        return cls(stash, _cuda_read(device),
                   lambda: torch.cuda.reset_peak_memory_stats(device))

    @property
    def active(self) -> bool:
        return self.read is not None

    def begin_step(self) -> None:
        self.step_other = 0
        if self.active:
            self.reset()
        self._held = self.stash.held_bytes()

    def mark(self) -> None:
        """Close the interval since the last mark (a host-side read of the allocator's
        counters: no device sync)."""
        if not self.active:
            return
        allocated, reserved = self.read()
        held = min(self._held, self.stash.held_bytes())
        self.step_other = max(self.step_other, allocated - held)
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, reserved)
        self.reset()
        self._held = self.stash.held_bytes()

    def rebase(self) -> None:
        """Count what the stash holds now as held since the interval's start: call right
        after mark() and one allocation of held bytes (keep.py's copy), so that the copy is
        not taken for other work in the interval it was made."""
        self._held = self.stash.held_bytes()
