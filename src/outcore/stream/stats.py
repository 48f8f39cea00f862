"""Per-step accounting: where the time went and how many bytes moved."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass
class StepStats:
    """Times in seconds for the last step; byte counters cumulative over the run."""

    step_s: float = 0.0
    compute_s: float = 0.0          # device busy on block/rest compute (events)
    copy_wait_s: float = 0.0        # compute stream idle: waiting on copies or launch gaps
    optimizer_wait_s: float = 0.0   # host blocked on a pending optimizer update
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    max_blocks_in_flight: int = 0
    peak_device_bytes: int = 0
    skipped_steps: int = 0
    alloc_retries: int = 0          # caching-allocator retries (each one a device sync)
    # The last steps' records (bounded: a long run must not grow memory with its length).
    history: deque = field(default_factory=lambda: deque(maxlen=1000))


class ComputeTimer:
    """Brackets compute regions with device events; totals them after the step's sync."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[tuple[object, object]] = []
        self._t0 = None
        self._cpu = 0.0

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, start) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((start, ev))
        else:
            self._cpu += time.perf_counter() - start

    def total_s(self) -> float:
        """Sum of the bracketed regions; call after the device has synchronized."""
        if not self.cuda:
            t, self._cpu = self._cpu, 0.0
            return t
        t = sum(a.elapsed_time(b) for a, b in self.marks) / 1000.0
        self.marks.clear()
        return t
