"""parallel/watchdog.py: heartbeats through a store; a silent rank is named; stop() leaves
no thread inside a store call (the store is destroyed right after it)."""

import threading
import time

from outcore.parallel.watchdog import Watchdog


class SlowStore:
    """A store whose reads take `delay` s and record whether one is in progress."""

    def __init__(self, delay: float = 0.0):
        self.data, self.delay, self.inside = {}, delay, 0
        self.lock = threading.Lock()

    def set(self, k, v):
        self.data[k] = v

    def check(self, keys):
        return all(k in self.data for k in keys)

    def get(self, k):
        with self.lock:
            self.inside += 1
        time.sleep(self.delay)
        with self.lock:
            self.inside -= 1
        return self.data[k]


def test_stop_waits_for_the_thread_to_leave_the_store():
    store = SlowStore(delay=0.3)
    store.set("hb/1", repr(time.time() + 3600))     # a peer that stays alive
    w = Watchdog(store, rank=0, world=2, timeout=60, interval=0.05, exit_process=False)
    deadline = time.time() + 5
    while store.inside == 0 and time.time() < deadline:   # the thread is inside a read
        time.sleep(0.01)
    assert store.inside == 1
    w.stop()
    assert not w._thread.is_alive() and store.inside == 0


def test_a_silent_rank_is_named():
    store = SlowStore()
    store.set("hb/1", repr(time.time() - 100))      # last heard from 100 s ago
    w = Watchdog(store, rank=0, world=2, timeout=1, interval=0.05, exit_process=False)
    deadline = time.time() + 5
    while not w.dead() and time.time() < deadline:
        time.sleep(0.01)
    assert w.dead() == [1]
    w.stop()
