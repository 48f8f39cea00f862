"""SIGTERM and SIGINT during `outcore train`: the first sets a flag that the loop reads
after each step (it saves a checkpoint and stops); a second stops at once, keeping the
last checkpoint."""

from __future__ import annotations

import signal


class StopSignals:
    """SIGTERM/SIGINT set a flag; the loop saves a checkpoint and stops after the step."""

    def __init__(self, quiet: bool = False):
        self.received: int | None = None
        self.quiet = quiet   # ranks other than 0 save without saying so
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:  # a second signal: stop now, the old checkpoint stays
            raise KeyboardInterrupt
        self.received = signum
        if not self.quiet:
            print(f"\noutcore: {signal.Signals(signum).name}: saving a checkpoint after this "
                  "step", flush=True)

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
