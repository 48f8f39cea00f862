"""What swapping did: tensors and bytes each way, copy time, and how much of it was hidden.

Copy time is measured with device events around every copy on the copy streams; the
exposed part is the time the compute stream sat blocked at a wait for one of our copies
(events before and after each wait). Hidden = copy time - exposed: what ran under compute.
On the CPU copies are synchronous, so all of their time is exposed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from ..units import fmt_bytes


@dataclass
class SwapReport:
    """Counters since the swap began (cumulative); times in seconds."""

    forwards: int = 0
    unhooked_forwards: int = 0      # forwards run without hooks: the last one with the same
                                    # inputs kept everything and it still fits the budget
    saved_tensors: int = 0          # tensors autograd saved inside the model's forward
    host_tensors: int = 0           # already in host memory (a model on the CPU without
                                    # force_copy): nothing to move
    small_tensors: int = 0          # below min_swap_bytes: left on the device
    strided_tensors: int = 0        # views with gaps (a transposed weight), sparse, nested or
                                    # subclass tensors: left in place
    kept_tensors: int = 0           # large enough, but the budget had room: left on device
    kept_bytes: int = 0
    deduplicated: int = 0           # repeated saves of one tensor, served by one copy
    offloaded_tensors: int = 0
    bytes_to_host: int = 0
    fetched_tensors: int = 0
    prefetched_tensors: int = 0     # of the fetched, how many were fetched ahead of use
    bytes_to_device: int = 0
    param_bytes_to_host: int = 0
    param_bytes_to_device: int = 0
    copy_s: float = 0.0             # copy streams busy with our copies
    stall_s: float = 0.0            # compute stream blocked waiting for our copies
    host_wait_s: float = 0.0        # host blocked to bound bytes waiting to be copied out
    host_reserved_bytes: int = 0    # pinned host memory held for swapping
    host_peak_bytes: int = 0
    by_module: dict[str, int] = field(default_factory=dict)   # bytes sent to host, per module
    timed: bool = True              # copies were timed (timing=True): the times mean something

    @property
    def hidden_s(self) -> float:
        """Copy time that overlapped compute."""
        return max(0.0, self.copy_s - self.stall_s)

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_s / self.copy_s if self.copy_s > 0 else 1.0

    def per_forward(self, nbytes: int) -> float:
        return nbytes / max(1, self.forwards)

    def summary(self, top: int = 5) -> str:
        """A short table for logs."""
        lines = [
            f"swap: {self.forwards} forward(s) hooked, {self.unhooked_forwards} unhooked "
            f"(everything fit), {self.saved_tensors} saved tensors "
            f"({self.host_tensors} already in host memory, "
            f"{self.small_tensors} small, {self.strided_tensors} strided or sparse, "
            f"{self.kept_tensors} kept by budget "
            f"{fmt_bytes(self.kept_bytes)}, {self.deduplicated} deduplicated)",
            f"  to host   {self.offloaded_tensors:7d} tensors {fmt_bytes(self.bytes_to_host):>10}"
            f"   params {fmt_bytes(self.param_bytes_to_host)}",
            f"  to device {self.fetched_tensors:7d} tensors {fmt_bytes(self.bytes_to_device):>10}"
            f"   params {fmt_bytes(self.param_bytes_to_device)}"
            f"   ({self.prefetched_tensors} prefetched)",
            (f"  copies {self.copy_s * 1e3:.1f} ms, exposed {self.stall_s * 1e3:.1f} ms, "
             f"hidden {100 * self.hidden_fraction:.0f}%" if self.timed else
             "  copies not timed (timing=False)")
            + f", host waits {self.host_wait_s * 1e3:.1f} ms",
            f"  pinned host {fmt_bytes(self.host_reserved_bytes)} "
            f"(peak in use {fmt_bytes(self.host_peak_bytes)})",
        ]
        for name, nb in sorted(self.by_module.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {fmt_bytes(nb):>10}  {name or '(root)'}")
        return "\n".join(lines)

    def snapshot(self) -> "SwapReport":
        return replace(self, by_module=dict(self.by_module))


class CopyClock:
    """Times copies and stalls. CUDA: event pairs folded into totals once complete."""

    def __init__(self, report: SwapReport, enabled: bool):
        self.report = report
        self.enabled = enabled
        self._pairs: list[tuple[str, object, object]] = []

    def start(self, stream):
        """A start mark on `stream` (None on the CPU: a wall-clock mark)."""
        if not self.enabled:
            return None
        if stream is None:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def stop(self, mark, kind: str, stream) -> None:
        """Close `mark`; kind is 'copy' or 'stall'."""
        if mark is None:
            return
        if stream is None:
            dt = time.perf_counter() - mark
            self._add(kind, dt)
            if kind == "copy":  # CPU copies are synchronous: all of their time is exposed
                self._add("stall", dt)
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        self._pairs.append((kind, mark, ev))

    def _add(self, kind: str, seconds: float) -> None:
        if kind == "copy":
            self.report.copy_s += seconds
        else:
            self.report.stall_s += seconds

    def fold(self, block: bool = False) -> None:
        """Add finished pairs to the totals; block=True waits for all (a host sync)."""
        still = []
        for kind, a, b in self._pairs:
            if block:
                b.synchronize()  # host sync: the report was asked for, so finish timing
            if b.query():
                self._add(kind, a.elapsed_time(b) / 1000.0)
            else:
                still.append((kind, a, b))
        self._pairs = still
