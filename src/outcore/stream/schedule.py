"""When each group's optimizer update runs, relative to the device's work.

Gradients arrive in backward order (last block first, `rest` last). While backward runs,
the worker takes the oldest (`order` "arrival", the default) or the landed gradient the
next forward needs first ("need", opt-in); once backward has ended, whatever is still
waiting runs in forward order (rest, block 1, block 2, ...). cpu_order.py says why. The
next forward of group g waits only for g's own update (`wait(g)`).
With clipping, no update can start before the global norm is known: `hold()` queues them
until `release(scale)`.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Callable

from .cpu_order import check_order, pick


class UpdateSchedule:
    """A single worker thread running `fn(g, payload, scale)` for each submitted group."""

    def __init__(self, fn: Callable[[int, object, float], None],
                 landed: Callable[[object], bool] | None = None, order: str = "arrival"):
        """fn(g, payload, scale) runs an update; landed(payload): whether its gradient has
        reached the host (no wait; None: always)."""
        self._fn = fn
        self._landed = landed or (lambda payload: True)
        self.order = order   # checked by the setter
        self._cv = threading.Condition()
        self._queue: list[tuple[int, object]] = []
        self._done: set[int] = set()
        self._pending: set[int] = set()
        self._held = False
        self._forward_order = False
        self._scale = 1.0
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="outcore-optim", daemon=True)
        self._thread.start()
        # A script that ends without engine.close() while an update runs (held updates
        # run after backward) would have the interpreter tear torch down under the worker:
        # the process aborted ("terminate called without an active exception", exit 134).
        # At exit, finish the queued updates and stop the thread first; a weak reference,
        # so an engine dropped earlier is still collected.
        ref = weakref.ref(self)

        def at_exit() -> None:
            sched = ref()
            if sched is not None:
                sched._drain_at_exit()
        self._at_exit = at_exit
        atexit.register(at_exit)

    @property
    def order(self) -> str:
        """Which staged gradient the worker takes next: "arrival" or "need" (cpu_order.py)."""
        return self._order

    @order.setter
    def order(self, value: str) -> None:
        self._order = check_order(value)

    def begin_backward(self, hold: bool) -> None:
        """A new backward starts; with `hold`, updates wait for `release()`."""
        with self._cv:
            self._held = hold
            self._forward_order = False

    def submit(self, g: int, payload) -> None:
        with self._cv:
            self._pending.add(g)
            self._done.discard(g)
            self._queue.append((g, payload))
            self._cv.notify_all()

    def end_backward(self, scale: float = 1.0) -> None:
        """Backward is over: run what is left in forward order, gradients scaled by `scale`."""
        with self._cv:
            self._scale = scale
            self._held = False
            self._forward_order = True
            self._cv.notify_all()

    def drop_pending(self) -> list:
        """Forget queued (not started) updates: the step is skipped. Returns their
        payloads, so the caller can give back the buffers they hold."""
        with self._cv:
            dropped = [payload for _, payload in self._queue]
            for g, _ in self._queue:
                self._pending.discard(g)
                self._done.add(g)
            self._queue.clear()
            self._cv.notify_all()
        return dropped

    def wait(self, g: int) -> None:
        """Block until group g has no update pending (a deliberate host wait)."""
        with self._cv:
            while g in self._pending and self._error is None:
                self._cv.wait()
            self._raise()

    def pending(self, g: int) -> bool:
        """Whether group g has an update queued or running (no wait)."""
        with self._cv:
            return g in self._pending

    def wait_below(self, n: int) -> None:
        """Block until fewer than n updates are pending (a deliberate host wait)."""
        with self._cv:
            while len(self._pending) >= n and self._error is None:
                self._cv.wait()
            self._raise()

    def wait_all(self) -> None:
        with self._cv:
            while self._pending and self._error is None:
                self._cv.wait()
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (self._held or not self._queue):
                    self._cv.wait()
                if self._stop:
                    return
                q = self._queue
                i = 0
                if len(q) > 1:
                    # only the need order during backward asks which copies have landed
                    # (an event query each): the default order takes the oldest
                    ask = self.order == "need" and not self._forward_order
                    landed = [self._landed(p) if ask else True for _, p in q]
                    i = pick([g for g, _ in q], landed, self.order, self._forward_order)
                g, payload = q.pop(i)
                scale = self._scale
            try:
                self._fn(g, payload, scale)
            except BaseException as e:  # surfaced to the main thread at its next wait
                with self._cv:
                    self._error = e
            with self._cv:
                self._pending.discard(g)
                self._done.add(g)
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
        atexit.unregister(self._at_exit)

    def _drain_at_exit(self) -> None:
        with self._cv:   # a Condition's lock is re-entrant: drop_pending may take it too
            if self._held:   # the script ended inside a backward: no scale ever came
                self.drop_pending()
            while self._pending and self._error is None and self._thread.is_alive():
                self._cv.wait(timeout=1.0)
        self.close()
