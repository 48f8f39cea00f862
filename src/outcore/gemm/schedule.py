"""One shared queue of C tiles; every device pulls its next tile from it.

A faster device simply comes back sooner and so takes more tiles: no speeds are measured
or assumed. Pulls keep locality: the tiles are in an order where neighbours share panels
(tiles.py), each device walks forward through a run of that order, and a device whose run
is used up jumps to the middle of the largest unclaimed run (or its start, when nobody is
walking into it), so devices rarely need the same panels at the same time. The order's
last `tail` tiles (a plan's strips) are handed out only after every other tile: short
tasks at the end, so that devices of unequal speed finish close together.

`FakeWorker` (sleeps instead of computing) and `simulate` (virtual clock) check the
proportional split without a GPU.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Callable, Sequence

from .threadmode import caller_mode


class TileQueue:
    """Tiles in order, claimed by devices under one lock; see the module docstring."""

    def __init__(self, tiles: Sequence, n_devices: int, tail: int = 0):
        self.tiles = list(tiles)
        # tiles [0, _head) first; the tail once they are all claimed
        self._head = len(self.tiles) - max(0, min(tail, len(self.tiles)))
        self._head_left = self._head
        self._claimed = [False] * len(self.tiles)
        self._cursor: list[int | None] = [None] * n_devices
        self._lock = threading.Lock()
        self._left = len(self.tiles)
        self.aborted = False
        self.taken = [0] * n_devices

    def remaining(self) -> int:
        return self._left

    def abort(self) -> None:
        """Stop handing out tiles (a device failed: the others finish what they hold)."""
        with self._lock:
            self.aborted = True

    def pull(self, dev: int, n: int = 1) -> list:
        """Claim up to n consecutive tiles for device `dev`; [] when none are left."""
        with self._lock:
            if self.aborted or self._left == 0:
                return []
            end = self._head if self._head_left else len(self.tiles)
            p = self._cursor[dev]
            if p is None or p >= end or self._claimed[p]:
                p = self._jump(dev, end)
            out = []
            while len(out) < n and p < end and not self._claimed[p]:
                self._claimed[p] = True
                out.append(self.tiles[p])
                if p < self._head:
                    self._head_left -= 1
                p += 1
            self._cursor[dev] = p
            self._left -= len(out)
            self.taken[dev] += len(out)
            return out

    def _jump(self, dev: int, end: int) -> int:
        """Start of a new run for `dev` among tiles [0, end): the largest unclaimed run, its
        middle if another device is about to walk into it."""
        best, s = (0, 0, 0), None
        for p, c in enumerate(self._claimed[:end] + [True]):
            if not c and s is None:
                s = p
            elif c and s is not None:
                best = max(best, (p - s, -s, p))
                s = None
        length, neg_start, end = best
        start = -neg_start
        heading = any(c == start for d, c in enumerate(self._cursor) if d != dev)
        return start + length // 2 if heading else start


LONE_DEPTH = 8


class Pull:
    """What a worker calls for tiles: pull(n) claims up to n for its device; `endgame()`
    says whether so few are left that claiming ahead would take one from a device that
    would start it sooner."""

    def __init__(self, queue: TileQueue, dev: int):
        self.queue, self.dev = queue, dev

    def __call__(self, n: int = 1) -> list:
        return self.queue.pull(self.dev, n)

    def endgame(self) -> bool:
        n_dev = len(self.queue.taken)
        return n_dev > 1 and self.queue.remaining() <= n_dev

    def depth(self) -> int:
        """Tasks a worker may keep queued on its device. Devices sharing the queue: 2, so a
        tile is claimed shortly before its device can start it. A lone device: 8, so the
        loads of the panels later tiles need are enqueued while earlier tiles compute (at
        depth 2 the copy engine idles through runs of tiles whose panels are all cached)."""
        return 2 if len(self.queue.taken) > 1 else LONE_DEPTH


def run_workers(queue: TileQueue, workers: Sequence, first: int = 1) -> None:
    """Run `worker.run(pull)` for every worker, one thread each; re-raise the first error.

    `pull(n)` claims up to n tiles for that worker; `first` is the size of a worker's first
    claim (a worker may ask for its own sizes after that).
    """
    errors: list[BaseException] = []
    mode = caller_mode()

    def body(dev: int, worker) -> None:
        try:
            with mode():
                worker.run(Pull(queue, dev), first)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)
            queue.abort()

    if len(workers) == 1:
        body(0, workers[0])
    else:
        threads = [threading.Thread(target=body, args=(d, w), name=f"outcore-gemm-{d}",
                                    daemon=True) for d, w in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


class FakeWorker:
    """A device that takes `unit_s / speed` seconds per tile (sleeps); records its tiles."""

    def __init__(self, speed: float, unit_s: float = 0.004):
        self.speed, self.unit_s = speed, unit_s
        self.tiles: list = []

    def run(self, pull: Callable, first: int = 1) -> None:
        batch = pull(first)
        while batch:
            for t in batch:
                time.sleep(self.unit_s / self.speed)
                self.tiles.append(t)
            batch = pull(1)


def simulate(queue: TileQueue, speeds: Sequence[float],
             cost: Callable[[int, object], float] | None = None) -> list[list]:
    """Virtual-clock run: device d spends cost(d, tile) (default 1/speed) per tile.

    Returns the tiles each device took. Deterministic: ties go to the lower device index.
    """
    cost = cost or (lambda d, t: 1.0 / speeds[d])
    took: list[list] = [[] for _ in speeds]
    clock = [(0.0, d) for d in range(len(speeds))]
    heapq.heapify(clock)
    while clock:
        now, d = heapq.heappop(clock)
        got = queue.pull(d)
        if not got:
            continue
        took[d] += got
        heapq.heappush(clock, (now + sum(cost(d, t) for t in got), d))
    return took
