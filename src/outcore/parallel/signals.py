"""SIGINT/SIGTERM agreed over ranks: the program's handler runs at the end of the same step
on every rank.

A signal reaches the ranks at slightly different moments (a launcher forwarding it rank by
rank, a scheduler, `kill` of one rank). Handled where it lands, it lets one rank stop and
checkpoint (collectives) while another starts the next step (other collectives): the job
hangs until the collective timeout. So while a sharded engine trains, the handler set for
SIGINT/SIGTERM (a callable one: `outcore train`'s, Python's KeyboardInterrupt) is wrapped:
a first signal is only noted; the all-reduce that closes train_step carries every rank's
notes, and then every rank calls the handler for each signal that any rank noted. A second
signal before that (the user insists: "stop now") goes to the handler at once, after the
first, as it would without the wrapper.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Deferred:
    """A handler that notes a first signal and hands on a second at once."""

    def __init__(self, inner):
        self.inner = inner
        self.pending = False

    def __call__(self, signum, frame):
        if not self.pending:
            self.pending = True   # for the end of the step (Agreement.deliver)
            return
        self.pending = False      # the user insists: both, now
        self.inner(signum, frame)
        self.inner(signum, frame)


class Agreement:
    """wrap() at the start of a step; notes() into the closing all-reduce; deliver() after."""

    def wrap(self) -> None:
        """Wrap the current handlers (again if the program replaced them since)."""
        if threading.current_thread() is not threading.main_thread():
            return   # handlers can only be set from the main thread: left as they are
        for s in SIGNALS:
            h = signal.getsignal(s)
            if callable(h) and not isinstance(h, _Deferred):
                signal.signal(s, _Deferred(h))

    def notes(self) -> list[float]:
        """1.0 per signal noted on this rank and not handed on yet, else 0.0."""
        return [float(isinstance(h, _Deferred) and h.pending)
                for h in map(signal.getsignal, SIGNALS)]

    def deliver(self, agreed: list[float]) -> None:
        """agreed: per signal, the max over ranks of notes(): call its handler if set."""
        for s, flag in zip(SIGNALS, agreed):
            h = signal.getsignal(s)
            if flag and isinstance(h, _Deferred):
                h.pending = False   # the same signal, also if it landed here only just now
                h.inner(s, None)

    def unwrap(self) -> None:
        """Put the wrapped handlers back (engine.close), handing on any noted signal."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in SIGNALS:
            h = signal.getsignal(s)
            if isinstance(h, _Deferred):
                signal.signal(s, h.inner)
                if h.pending:
                    h.inner(s, None)
