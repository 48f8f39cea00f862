"""Hand device-updated groups back to the CPU while the measured step gets shorter.

Opt-in: `engine.updater.tuner = UpdateTuner(engine.updater)` (bench/stream.py
--tune-updates); unmeasured on a GPU so far.

The backlog planner (device_update.py) moves groups' AdamW to the device until the CPU's
updates stop delaying the next forward, plus one group of margin. Every device group costs
12 B/param of copies each way at the end of backward, where on the H200 both copy
directions already run at the PCIe limit: at 3b-16k one run's planner chose 12 groups and
stepped in 1.034 s, another's chose 13 and stepped in 1.080 s. So once the planner's
frequent phase is over, the tuner gives the most recently moved group back to the CPU and
keeps that only if the mean step time over `window` steps (after `skip` steps of
transition) fell by more than `gain`; it stops at the first hand-back that does not pay.
While it runs, the planner does not move groups (the engine asks `busy()`).
"""

from __future__ import annotations

START_STEP = 9   # the planner moves groups after steps 2..8, then every 10th


class UpdateTuner:
    """observe(step, step_s) after every step; a line to print when it changed something."""

    def __init__(self, updater, window: int = 4, skip: int = 2, gain: float = 0.005,
                 max_trials: int = 4, start: int = START_STEP):
        self.u = updater
        self.window, self.skip, self.gain = window, skip, gain
        self.max_trials, self.start = max_trials, start
        self.state = "wait"          # wait -> base -> trial -> ... -> done
        self.times: list[float] = []
        self.to_skip = 0
        self.base_s: float | None = None
        self.group: int | None = None
        self.trials = 0
        self.log: list[dict] = []    # one record per hand-back tried

    def busy(self) -> bool:
        return self.state in ("base", "trial")

    def _last_moved(self) -> int | None:
        """The device group that would have moved last (never `rest`, group 0)."""
        order = [g for g in self.u.candidates() if g and g in self.u.groups]
        return order[-1] if order else None

    def _collect(self, step_s: float) -> float | None:
        if self.to_skip:
            self.to_skip -= 1
            return None
        self.times.append(step_s)
        if len(self.times) < self.window:
            return None
        mean, self.times = sum(self.times) / len(self.times), []
        return mean

    def _try_next(self) -> str | None:
        """Start the next trial; what it does, for the verbose line (None: tuning is over)."""
        g = self._last_moved()
        if g is None or self.trials >= self.max_trials:
            self.state = "done"
            return None
        self.group = g
        self.u.hand_back(g)     # its next gradient goes to the CPU worker
        self.trials += 1
        self.state, self.to_skip = "trial", self.skip
        return f"group {g}'s AdamW back to the CPU for a trial"

    def observe(self, step: int, step_s: float) -> str | None:
        said = self._observe(step, step_s)
        return f"outcore: tuning: {said}" if said else None

    def _observe(self, step: int, step_s: float) -> str | None:
        if self.state == "wait":
            if step >= self.start:
                self.state, self.to_skip = "base", 0
            return None
        mean = self._collect(step_s) if self.busy() else None
        if mean is None:
            return None
        if self.state == "base":
            self.base_s = mean
            return self._try_next()
        kept = mean < self.base_s * (1.0 - self.gain)
        self.log.append({"group": self.group, "base_s": self.base_s, "trial_s": mean,
                         "kept": kept})
        if not kept:
            self.u.enable([self.group])  # back to the device: the step was not shorter
            self.state = "done"
            return (f"group {self.group} stays on the device ({mean:.3f} s vs "
                    f"{self.base_s:.3f} s a step)")
        self.base_s = mean
        said = f"group {self.group}'s AdamW stays on the CPU ({mean:.3f} s a step)"
        nxt = self._try_next()
        return said if nxt is None else f"{said}; {nxt}"
