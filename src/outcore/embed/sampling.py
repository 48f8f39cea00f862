"""What an epoch trains on, produced on the CPU while the GPU trains the previous epoch.

- LINE-style edge sampling: each epoch is the edge list itself (unweighted; the trainer
  shuffles on the device) or, for weighted graphs, E edges drawn with probability
  proportional to weight.
- DeepWalk / node2vec: walks from every node (vectorised over all walkers at once; node2vec's
  p, q bias exactly, mostly by rejection sampling: node2vec.py), then every pair within
  `window` steps is a positive.
- Negatives: nodes drawn by degree**power from the partition that a side of the bucket
  lives in, by searchsorted into a per-partition cumulative table, on the device.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import torch

from .buckets import BucketedEdges
from .config import EmbedConfig
from .graph import csr
from .node2vec import biased_step


class NegativeSampler:
    """Per-partition cumulative weights (degree**power): cdf[p]: n_p float64 (host)."""

    def __init__(self, degrees: np.ndarray, P: int, power: float):
        self.P, self.power = P, power
        w = np.power(degrees.astype(np.float64), power) if power else None
        self.cdf = None if w is None else [torch.from_numpy(np.cumsum(w[p::P])) for p in range(P)]

    def sample(self, n: int, size: int, cdf: torch.Tensor | None, gen=None) -> torch.Tensor:
        """size local row ids of a partition of n rows (on cdf's device, or CPU)."""
        if cdf is None:
            return torch.randint(0, n, (size,), generator=gen,
                                 device=gen.device if gen is not None else "cpu")
        r = torch.rand(size, generator=gen, device=cdf.device, dtype=torch.float64) * cdf[-1]
        return torch.searchsorted(cdf, r).clamp_(max=n - 1)


def weighted_edges(src, dst, weight, rng: np.random.Generator):
    """LINE edge sampling: E edges drawn with probability proportional to weight."""
    cum = np.cumsum(weight.astype(np.float64))
    pick = np.searchsorted(cum, rng.random(len(src)) * cum[-1], side="right")
    pick = np.minimum(pick, len(src) - 1)
    return src[pick], dst[pick]


def random_walks(indptr, indices, starts, length, rng, p=1.0, q=1.0, keys=None):
    """Walks: len(starts) x length int64 (-1 after a dead end). node2vec when p or q != 1."""
    n = len(starts)
    walks = np.full((n, length), -1, dtype=np.int64)
    walks[:, 0] = starts
    deg = np.diff(indptr)
    cur = starts.astype(np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    alive = deg[cur] > 0
    N = len(indptr) - 1
    biased = (p != 1.0 or q != 1.0)
    if biased and keys is None:
        keys = np.repeat(np.arange(N, dtype=np.int64), deg) * N + indices
    for t in range(1, length):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        c = cur[idx]
        nxt = indices[indptr[c] + (rng.random(idx.size) * deg[c]).astype(np.int64)]
        if biased and t > 1:                      # exact for any p, q: see node2vec.py
            biased_step(indptr, indices, deg, keys, N, prev[idx], c, nxt, p, q, rng)
        prev[idx], cur[idx] = c, nxt
        walks[idx, t] = nxt
        alive[idx] = deg[nxt] > 0
    return walks


def walk_pairs(walks: np.ndarray, window: int):
    """Every (walks[i, t], walks[i, t + k]) for 1 <= k <= window, both ends valid, no loops."""
    srcs, dsts = [], []
    for k in range(1, min(window, walks.shape[1] - 1) + 1):
        a, b = walks[:, :-k].ravel(), walks[:, k:].ravel()
        ok = (a >= 0) & (b >= 0) & (a != b)
        srcs.append(a[ok])
        dsts.append(b[ok])
    return np.concatenate(srcs), np.concatenate(dsts)


class EpochSource:
    """Positives of epoch e as `BucketedEdges`; static edges are bucketed once."""

    def __init__(self, src, dst, num_nodes, weight, cfg: EmbedConfig, P: int):
        self.src, self.dst, self.N, self.weight = src, dst, num_nodes, weight
        self.cfg, self.P = cfg, P
        self.static = cfg.mode == "edges" and weight is None
        self._cached = None
        if cfg.mode != "edges":
            self.indptr, self.indices = csr(num_nodes, src, dst, undirected=not cfg.directed)
            self.keys = None

    def epoch(self, e: int) -> BucketedEdges:
        cfg = self.cfg
        if self.static:
            if self._cached is None:
                self._cached = BucketedEdges.build(self.src, self.dst, self.P, cfg.directed,
                                                   cfg.shuffle, cfg.seed)
            return self._cached
        rng = np.random.default_rng((cfg.seed, e))
        if cfg.mode == "edges":
            s, d = weighted_edges(self.src, self.dst, self.weight, rng)
        else:
            deg = np.diff(self.indptr)
            starts = np.repeat(np.flatnonzero(deg > 0), cfg.walks_per_node)
            rng.shuffle(starts)
            p, q = (cfg.p, cfg.q) if cfg.mode == "node2vec" else (1.0, 1.0)
            if (p != 1.0 or q != 1.0) and self.keys is None:
                self.keys = (np.repeat(np.arange(self.N, dtype=np.int64), deg) * self.N
                             + self.indices)
            walks = random_walks(self.indptr, self.indices, starts, cfg.walk_length, rng,
                                 p, q, self.keys)
            s, d = walk_pairs(walks, cfg.window)
            # pairs come grouped by their distance in the walk (all k=1, then k=2, ...):
            # mixed by blocks, or a bucket longer than edge_chunk trains them in that order
            return BucketedEdges.build(s, d, self.P, cfg.directed, cfg.shuffle, cfg.seed + e)
        return BucketedEdges.build(s, d, self.P, cfg.directed, False, cfg.seed + e)


class Producer:
    """Runs `source.epoch(e)` for e = first.. in a background thread, one epoch ahead."""

    def __init__(self, source: EpochSource, first: int, last: int):
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.source = source

        def run():
            for e in range(first, last):
                try:
                    self.q.put((e, source.epoch(e), None))
                except BaseException as err:          # surfaced in get()
                    self.q.put((e, None, err))
                    return
        self.thread = threading.Thread(target=run, name="embed-producer", daemon=True)
        self.thread.start()

    def get(self) -> BucketedEdges:
        _, edges, err = self.q.get()                  # waits only if the CPU is behind
        if err is not None:
            raise err
        return edges
