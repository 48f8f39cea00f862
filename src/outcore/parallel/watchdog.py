"""Heartbeats through the rendezvous store: a dead rank makes the others exit, naming it.

Every rank writes `hb/{rank}` = its wall time every `interval` s from a daemon thread and
reads everybody else's. A rank whose heartbeat has not changed for `timeout` s (timed on
this host's clock: the machines' clocks may differ), or a store that stops answering (its
host, rank 0, torchrun's agent or `--nproc`'s launcher, is gone), ends this process with a
one-line message, instead of hanging in a collective forever.
"""

from __future__ import annotations

import os
import sys
import threading
import time


class Watchdog:
    """Daemon thread; `dead()` lists ranks seen dead so far (used to name them in errors)."""

    def __init__(self, store, rank: int, world: int, timeout: float = 20.0,
                 interval: float = 1.0, exit_process: bool = True):
        self.store, self.rank, self.world = store, rank, world
        self.timeout, self.interval = timeout, interval
        self.exit_process = exit_process
        self._dead: list[int] = []
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="outcore-watchdog",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.store.set(f"hb/{self.rank}", repr(time.time()))

    def dead(self) -> list[int]:
        return list(self._dead)

    def _fail(self, msg: str) -> None:
        print(f"outcore: rank {self.rank}: {msg}; exiting", file=sys.stderr, flush=True)
        if self.exit_process:
            os._exit(3)  # no clean shutdown is possible: a collective may be blocked forever

    def _run(self) -> None:
        # Per peer: its last heartbeat value and when (on this host's monotonic clock) it
        # last changed. The values are the writers' wall times, but ranks on other machines
        # have other clocks: a peer is judged by whether its heartbeat still changes, never
        # by comparing its clock with this one.
        start = time.monotonic()
        last: dict[int, tuple[str | None, float]] = {}
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                now = time.monotonic()
                for r in range(self.world):
                    if r == self.rank:
                        continue
                    value, since = last.get(r, (None, start))
                    try:
                        seen = self.store.get(f"hb/{r}") if self.store.check(
                            [f"hb/{r}"]) else None
                    except RuntimeError:   # one failed read: no news, not a death
                        seen = value
                    if seen is not None and seen != value:
                        value, since = seen, now
                    last[r] = (value, since)
                    if now - since > self.timeout and r not in self._dead:
                        self._dead.append(r)
                if self._dead:
                    self._fail(f"rank {', '.join(map(str, self._dead))} stopped (no heartbeat "
                               f"for {self.timeout:.0f} s): it died or hangs")
                    return
            except Exception as e:  # the store is gone: its host process (rank 0 or the
                # launcher: torchrun's agent, relaunch) ended
                if self._stop.is_set():
                    return
                self._dead.append(0)
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                self._fail(f"rank 0 or the launcher is gone (the job's rendezvous store "
                           f"stopped answering: {why})")
                return

    def stop(self) -> None:
        self._stop.set()
        # Wait until the thread has left any store call it is in: the process group and
        # its store (hosted by rank 0) are destroyed next. A rank 0 that exited with this
        # thread possibly inside one aborted once in CI (SIGABRT, "terminate called
        # without an active exception", session 9); the wait is at most one interval.
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5.0)
