"""Edges cut into P x P buckets, and the scheduler that hands buckets to workers.

A unit of work is an unordered partition pair {i, j} (i <= j): whoever holds both
partitions trains the buckets (i, j) and, for directed graphs, (j, i). Undirected edges
are flipped so that part(src) <= part(dst): the score is symmetric and both ends get
negatives, so the orientation carries nothing.

The scheduler (as PyTorch-BigGraph's lock server) is separate from training and from
storage: `acquire(worker, held)` returns a unit none of whose partitions another worker
holds, preferring units that reuse the partitions the worker already has (so one
partition stays resident and only the other is swapped); `release` frees partitions. It
is pure state; `StoreScheduler` keeps that state in a torch.distributed store under a lock,
so the ranks of a multi-process (or multi-machine) run share it.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass

import numpy as np

WAIT = "wait"


def snake_units(P: int) -> list[tuple[int, int]]:
    """All pairs i <= j, row by row with every other row reversed (neighbours share one)."""
    out = []
    for i in range(P):
        row = [(i, j) for j in range(i, P)]
        out.extend(row if i % 2 == 0 else row[::-1])
    return out


class BucketScheduler:
    """Units {i, j} of one epoch; partition locks; reuse-first choice."""

    def __init__(self, P: int, skip_empty: list[tuple[int, int]] | None = None):
        self.P = P
        self.order = snake_units(P)
        self.pos = {u: k for k, u in enumerate(self.order)}
        self.skip = set(skip_empty or ())
        self.reset()

    def reset(self) -> None:
        # unit -> None in schedule order: removal in O(1), not O(units)
        self.remaining = dict.fromkeys(u for u in self.order if u not in self.skip)
        self.by_part: dict[int, set] = {p: set() for p in range(self.P)}   # p -> its units
        for u in self.remaining:
            for p in u:
                self.by_part[p].add(u)
        self.owner: dict[int, int] = {}          # partition -> worker holding it

    def acquire(self, worker: int, held: tuple[int, ...] = ()):
        """A unit (i, j) now locked for `worker`; None when the epoch has no units left;
        WAIT when every remaining unit needs a partition another worker holds.

        The first unit in schedule order with the most partitions in `held` (stopping at
        one wholly held). Only units that touch `held` can score, so when few partitions
        are held only those are scored: scanning every remaining unit for every acquire
        cost O(P**4) an epoch (341 s of scheduling alone at P=256; 4 s this way)."""
        if not self.remaining:
            return None
        held = set(held) & self.by_part.keys()
        units = self.remaining
        if sum(len(self.by_part[h]) for h in held) < len(units):
            units = sorted(set().union(*(self.by_part[h] for h in held)),
                           key=self.pos.__getitem__)
        best, best_score, own = None, -1, self.owner
        for u in units:
            i, j = u
            if own.get(i, worker) != worker or own.get(j, worker) != worker:
                continue
            score = (i in held) + (j != i and j in held)
            if score > best_score:
                best, best_score = u, score
                if score == 1 + (j != i):
                    break
        if best is None:         # nothing held is free: the first free unit in order
            best = next((u for u in self.remaining
                         if all(self.owner.get(p, worker) == worker for p in u)), None)
        if best is None:
            return WAIT
        del self.remaining[best]
        for p in best:
            self.by_part[p].discard(best)
            self.owner[p] = worker
        return best

    def release(self, worker: int, parts) -> None:
        for p in parts:
            if self.owner.get(p) == worker:
                del self.owner[p]

    def held_by(self, worker: int) -> set[int]:
        return {p for p, w in self.owner.items() if w == worker}


class StoreScheduler:
    """A `BucketScheduler` shared through a torch.distributed Store (TCPStore, FileStore).

    Each call takes a spin lock (compare_set), loads the pickled state, acts and stores it
    back: a few store round trips per bucket, negligible next to training one.
    """

    def __init__(self, store, P: int, rank: int, skip_empty=None, prefix: str = "embed"):
        self.store, self.rank = store, rank
        self.lock_key, self.state_key = f"{prefix}/lock", f"{prefix}/sched"
        if rank == 0:
            self.store.set(self.state_key, pickle.dumps(BucketScheduler(P, skip_empty)))

    def _call(self, fn):
        me = str(self.rank + 1).encode()
        while self.store.compare_set(self.lock_key, "", me.decode()) != me:
            time.sleep(0.0005)                   # another rank is inside; retry shortly
        try:
            sched = pickle.loads(self.store.get(self.state_key))
            out = fn(sched)
            self.store.set(self.state_key, pickle.dumps(sched))
            return out
        finally:
            self.store.set(self.lock_key, "")

    def acquire(self, worker: int, held=()):
        return self._call(lambda s: s.acquire(worker, held))

    def release(self, worker: int, parts) -> None:
        self._call(lambda s: s.release(worker, parts))

    def reset(self) -> None:
        self._call(lambda s: s.reset())


SHUFFLE_BLOCK = 4096


def block_shuffle(rng: np.random.Generator, *cols: np.ndarray) -> tuple:
    """cols with their blocks of SHUFFLE_BLOCK edges in a random order (the same for all).

    Copies of whole blocks run at memory speed, where a full permutation gathers at random
    (about 1 s per 20M edges). The worker then permutes every chunk it copies to the device
    (worker.py), so an edge's place is random within its chunk, and a chunk holds blocks
    from all over the list: a sorted file trains in mixed order.
    """
    n = len(cols[0])
    nb = -(-n // SHUFFLE_BLOCK)
    if nb <= 1:
        return cols
    order = rng.permutation(nb)
    return tuple(np.concatenate([c[i * SHUFFLE_BLOCK:(i + 1) * SHUFFLE_BLOCK] for i in order])
                 for c in cols)


@dataclass
class BucketedEdges:
    """Edges sorted by bucket (a, b) = (part(src), part(dst)), with local row ids.

    src, dst: E int32 rows within their partitions; offsets: P*P + 1 int64 so that bucket
    (a, b) is [offsets[a*P+b], offsets[a*P+b+1]).
    """

    P: int
    src: np.ndarray
    dst: np.ndarray
    offsets: np.ndarray

    @classmethod
    def build(cls, src: np.ndarray, dst: np.ndarray, P: int, directed: bool = False,
              shuffle: bool = True, seed: int = 0) -> "BucketedEdges":
        src = np.asarray(src)
        dst = np.asarray(dst)
        if shuffle:
            src, dst = block_shuffle(np.random.default_rng(seed), src, dst)
        big = len(src) and max(int(src.max()), int(dst.max())) // P >= 2**31
        idt = np.int64 if big else np.int32
        if P == 1:       # one bucket: no keys, and no copy when the ids are int32 already
            return cls(1, src.astype(idt, copy=False), dst.astype(idt, copy=False),
                       np.array([0, len(src)], np.int64))
        pa, pb = src % P, dst % P
        if not directed:
            flip = pa > pb                       # canonical orientation part(src) <= part(dst)
            src, dst = np.where(flip, dst, src), np.where(flip, src, dst)
            pa, pb = np.minimum(pa, pb), np.maximum(pa, pb)
        # in the key's own type: narrow ids (int8, int16) would overflow pa * P
        kt = np.int16 if P * P < 2**15 else np.int32 if P * P < 2**31 else np.int64
        key = pa.astype(kt) * P + pb.astype(kt)
        order = np.argsort(key, kind="stable")   # radix sort for 16-bit keys: O(E)
        counts = np.bincount(key, minlength=P * P)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return cls(P, (src[order] // P).astype(idt), (dst[order] // P).astype(idt), offsets)

    def range(self, a: int, b: int) -> tuple[int, int]:
        k = a * self.P + b
        return int(self.offsets[k]), int(self.offsets[k + 1])

    def count(self, a: int, b: int) -> int:
        lo, hi = self.range(a, b)
        return hi - lo

    def unit_buckets(self, unit: tuple[int, int], directed: bool) -> list[tuple[int, int]]:
        """Ordered buckets a unit trains: (i, j), and (j, i) for directed graphs."""
        i, j = unit
        out = [(i, j)]
        if directed and i != j:
            out.append((j, i))
        return [b for b in out if self.count(*b) > 0]

    def empty_units(self, directed: bool) -> list[tuple[int, int]]:
        return [u for u in snake_units(self.P) if not self.unit_buckets(u, directed)]

    def save(self, path: str) -> None:
        np.savez(path, P=self.P, src=self.src, dst=self.dst, offsets=self.offsets)

    @classmethod
    def load(cls, path: str) -> "BucketedEdges":
        z = np.load(path)
        return cls(int(z["P"]), z["src"], z["dst"], z["offsets"])
