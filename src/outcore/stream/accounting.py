"""After each step: what the step cost and what the next one may keep on the device.

`StepAccounting` is mixed into Engine. `_record` fills `engine.stats` (peak memory, the
time split, bytes moved, the history) and runs the feedback that moves AdamW work to the
device; `_stash_limit` is the room the next step's checkpoints get under the budget.
"""

from __future__ import annotations

import sys
import time

import torch

from ..memory import host_peak_rss_bytes


class StepAccounting:
    """Mixin of Engine; uses its stats, timer, cache, stash, updater and deferred."""

    _compiles: int | None = None   # compile_count() after the last step

    def _record(self, t0: float, loss: float) -> None:
        self.peaks.mark()   # the step's tail: rest's backward and update
        if self.lanes.cuda:
            self.stats.peak_device_bytes = max(self.stats.peak_device_bytes,
                                               self.peaks.peak_allocated)
            self.stats.peak_reserved_bytes = max(self.stats.peak_reserved_bytes,
                                                 self.peaks.peak_reserved)
            self.stats.alloc_retries = torch.cuda.memory_stats(self.device).get(
                "num_alloc_retries", 0)
        else:
            # No device allocator to ask: the engine's own count of what it keeps on the
            # "device" (slots, gradient buffers, checkpoints; not transient activations).
            own = self.cache.bytes() + self.grad_ring.bytes() + self.stash.peak_device_bytes
            self.stats.peak_device_bytes = max(self.stats.peak_device_bytes, own)
        self.stats.total_optimizer_wait_s += self.stats.optimizer_wait_s
        self.timer.end_step(self.cache.waits)
        self.cache.waits = []
        self._settle_times()
        self.stats.step_s = time.perf_counter() - t0
        self.stats.max_blocks_in_flight = self.cache.max_in_flight
        self.stats.bytes_h2d = self.cache.bytes_h2d
        self.stats.kept_blocks, self.keep.used = self.keep.used, 0
        self.step_count += 1
        if self.peaks.active:
            # Everything but the checkpoints, at its worst block (peaks.py); the next step
            # gives its checkpoints what the budget leaves beside it.
            self._other_peak = self.peaks.step_other
        self.stash.peak_device_bytes = 0
        due = self.step_count >= 2 and (self.step_count <= 8 or self.step_count % 10 == 0)
        # A step in which torch.compile built kernels (a compiled model's first steps) is
        # no measure of the CPU's capacity: its cores also served the compiler. Opt-in
        # (DeviceUpdater.settle_compiles) until measured.
        compiles, self._compiles = self._compiles, compile_count()
        compiled = compiles is not None and compiles != self._compiles
        # Feedback (after steps 2..8, then every 10th): the optimizer wait of this step
        # moves AdamW work to the device; `what` says which path for the verbose line.
        tuner = self.updater.tuner   # opt-in (tune.py): hands groups back while it pays
        for mode, planner, what in ((self.gpu_updates, self.updater, "AdamW of groups"),
                                    (self.held_gpu_updates, self.deferred,
                                     "held AdamW (at the next load) of blocks")):
            paused = planner is self.updater and (
                (tuner is not None and tuner.busy())
                or (compiled and self.updater.settle_compiles))
            if mode in ("auto", "balance") and due and not paused:
                added = planner.plan(self.stats.step_s, self.stats.optimizer_wait_s,
                                     self._cpu_busy_s, self._cpu_params)
                if added and self.verbose:
                    # the counts run from the last step's end: updates of the step before
                    # it that finished in this one are in them
                    rate = self._cpu_params / self._cpu_busy_s if self._cpu_busy_s else 0.0
                    print(f"outcore: {what} {added} moves to the device (CPU AdamW "
                          f"{rate / 1e9:.2f} G params/s: {self._cpu_params / 1e6:.0f}M "
                          f"updated in {self._cpu_busy_s:.2f} s since the last step; step "
                          f"{self.stats.step_s:.2f} s)")
        if self.gpu_updates == "auto" and tuner is not None:
            msg = tuner.observe(self.step_count, self.stats.step_s)
            if msg and self.verbose:
                print(msg)
        self._cpu_busy_s, self._cpu_params = 0.0, 0
        self.stats.history.append({"step": self.step_count, "loss": loss,
                                   "step_s": self.stats.step_s,
                                   "host_peak_bytes": host_peak_rss_bytes()})

    def _usable_device_bytes(self) -> int:
        """The share of the budget the engine plans to fill (8% is left to the allocator's
        rounding and fragmentation)."""
        return int(self.gpu_memory * 0.92)

    def _device_room(self) -> int | None:
        """Budget left beside the last step's measured peak without its checkpoints (which
        go to the host when room is short); None without a budget or a measured step."""
        if self.gpu_memory is None or self._other_peak is None:
            return None
        return self._usable_device_bytes() - self._other_peak

    def _stash_limit(self) -> int | None:
        if self.gpu_memory is None:
            return None
        from .plan import fixed_device_bytes
        usable = self._usable_device_bytes()
        # Before the first measurement: the fixed buffers, the deferred updates' chunk ring
        # (allocated at construction with held_gpu_updates=k), half of what is left.
        fixed = fixed_device_bytes(self) + self.deferred.bytes()
        other = self._other_peak if self._other_peak is not None else \
            fixed + (self.gpu_memory - fixed) // 2
        return max(0, usable - other)

    def _settle_times(self, block: bool = False) -> None:
        """stats.compute_s / copy_wait_s from the newest step whose events have run."""
        st = self.stats
        for compute, wait in self.timer.settled(block):
            st.compute_s, st.copy_wait_s = compute, wait
            st.total_compute_s += compute
            st.total_copy_wait_s += wait
        st.forward_s, st.backward_s = self.timer.last_phases


def compile_count() -> int:
    """Graphs torch.compile has built in this process so far, by dynamo's counters (0 when
    dynamo was never imported: then nothing was compiled)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return sum(sum(c.values()) for c in counters.values())
