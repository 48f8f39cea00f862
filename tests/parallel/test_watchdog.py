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


def beating(store, behind: float = 0.0):
    """(stop event, thread): rank 1 alive, its heartbeat every 50 ms, its clock `behind` s
    behind this one's."""
    stop = threading.Event()

    def peer():
        while not stop.is_set():
            store.set("hb/1", repr(time.time() - behind))
            time.sleep(0.05)
    t = threading.Thread(target=peer, daemon=True)
    t.start()
    return stop, t


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


def test_a_live_rank_on_a_host_with_another_clock_is_not_called_dead():
    """Heartbeats carry the writer's wall time; ranks on other machines have other clocks
    (here 100 s behind). A rank whose heartbeat keeps changing is alive, whatever its
    clock says: only a heartbeat that stops changing for `timeout` s is a dead rank."""
    store = SlowStore()
    stop, t = beating(store, behind=100)   # rank 1, alive, its clock 100 s behind
    w = Watchdog(store, rank=0, world=2, timeout=1, interval=0.05, exit_process=False)
    try:
        time.sleep(2.0)
        assert w.dead() == []
        stop.set()            # the peer stops beating: named within about the timeout
        t.join()
        deadline = time.time() + 5
        while not w.dead() and time.time() < deadline:
            time.sleep(0.01)
        assert w.dead() == [1]
    finally:
        stop.set()
        w.stop()


def test_a_failed_read_of_one_heartbeat_is_not_a_death():
    """A read of a peer's heartbeat that fails once (a store hiccup) leaves the peer as last
    seen: it used to count the peer as silent since this watchdog's start, i.e. dead at once
    past `timeout`."""
    store = SlowStore()
    fails = {"n": 0}
    real_get = store.get

    def flaky_get(k):
        fails["n"] += 1
        if fails["n"] == 25:
            raise RuntimeError("store hiccup")
        return real_get(k)
    store.get = flaky_get
    stop, t = beating(store)
    w = Watchdog(store, rank=0, world=2, timeout=1, interval=0.05, exit_process=False)
    try:
        time.sleep(2.0)
        assert fails["n"] > 25 and w.dead() == []
    finally:
        stop.set()
        w.stop()
