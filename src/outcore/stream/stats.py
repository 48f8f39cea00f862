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
    # From device events, read once they have run: on a GPU usually the step before the last.
    compute_s: float = 0.0          # device busy on block compute
    copy_wait_s: float = 0.0        # compute stream idle: waiting on copies or launch gaps
    # The same step's compute stream from the step's start to backward's start, and from
    # there to backward's end (compute, waits and gaps): which half the copies hold up.
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_wait_s: float = 0.0   # host blocked on a pending optimizer update
    # The same, summed over every step so far (synchronize() settles the last ones).
    total_compute_s: float = 0.0
    total_copy_wait_s: float = 0.0
    total_optimizer_wait_s: float = 0.0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    max_blocks_in_flight: int = 0
    kept_blocks: int = 0            # last step's forward loads saved by kept weights (keep.py)
    cpu_grad_bytes: int = 4         # per param of the last CPU-updated block's gradient
                                    # out: 2 where it crossed in bf16 (flow.half_grad)
    peak_device_bytes: int = 0      # allocated by tensors, over the whole run
    peak_reserved_bytes: int = 0    # held by the caching allocator (what the budget caps)
    skipped_steps: int = 0
    alloc_retries: int = 0          # caching-allocator retries (each one a device sync)
    # The last steps' records (bounded: a long run must not grow memory with its length).
    history: deque = field(default_factory=lambda: deque(maxlen=1000))


class ComputeTimer:
    """Brackets compute regions with device events and totals them once they have run.

    On a GPU the totals of a step are read only when its events have completed (a query,
    no host sync), so `settled()` usually reports the step before the last: reading them
    at once would make the host wait for the device at every step's end.
    """

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[tuple[object, object]] = []   # this step's compute regions
        self.bounds: list = []   # this step's phase boundaries: start, backward, end
        self._steps: list = []   # closed steps: (marks, waits, bounds); CPU: seconds
        self._cpu = 0.0
        self.last_phases: tuple[float, float] = (0.0, 0.0)   # (forward_s, backward_s)

    @property
    def pending(self) -> int:
        """Closed steps whose times are not read yet (on a GPU usually the last one)."""
        return len(self._steps)

    def phase(self, first: bool = False) -> None:
        """A phase boundary on the current (compute) stream: the step's start (first=True:
        forgets what a failed step left), backward's start, backward's end."""
        if first:
            self.bounds = []
        self.bounds.append(self.start())

    def _spans(self, bounds) -> tuple[float, float] | None:
        if len(bounds) != 3:
            return None
        if self.cuda:
            return (bounds[0].elapsed_time(bounds[1]) / 1000.0,
                    bounds[1].elapsed_time(bounds[2]) / 1000.0)
        return (bounds[1] - bounds[0], bounds[2] - bounds[1])

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

    def end_step(self, waits: list) -> None:
        """Close the step: its compute regions and its (before, after) copy-wait pairs."""
        bounds, self.bounds = self.bounds, []
        if self.cuda:
            self._steps.append((self.marks, [w for w in waits if w is not None], bounds))
            self.marks = []
        else:
            self._steps.append(self._cpu)
            self.last_phases = self._spans(bounds) or self.last_phases
            self._cpu = 0.0

    def settled(self, block: bool = False) -> list[tuple[float, float]]:
        """(compute_s, copy_wait_s) of every closed step whose events have all run, oldest
        first, each handed out once; block=True waits for all of them."""
        if not self.cuda:
            out = [(t, 0.0) for t in self._steps]
            self._steps.clear()
            return out
        out = []
        while self._steps:
            marks, waits, bounds = self._steps[0]
            ends = [b for _, b in marks + waits] + bounds[-1:]
            if not block and not all(b.query() for b in ends):
                break   # the device has not reached this step's end yet: later steps neither
            if block:
                for b in ends:
                    b.synchronize()   # host sync, asked for: the step's regions must end
            self._steps.pop(0)
            # elapsed_time raises on an event that has not run (it does not wait): every
            # end event has run here, and each start precedes its end on the same stream
            out.append((sum(a.elapsed_time(b) for a, b in marks) / 1000.0,
                        sum(a.elapsed_time(b) for a, b in waits) / 1000.0))
            self.last_phases = self._spans(bounds) or self.last_phases
        return out
