"""One device's training loop: take units from the scheduler, keep their partitions
resident (prefetching the next unit's while this one trains), stream each bucket's edges
in chunks, and run the sparse steps."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import OutcoreError
from ..memory import pin_, unpin_
from ..transfer import Lanes, host_wait
from .buckets import WAIT, BucketedEdges
from .checked import host_tensor
from .config import EmbedConfig
from .device import PartitionCache
from .optim import RowOptimizer
from .sampling import NegativeSampler
from .step import LossSpec, batch_grads, num_chunks
from .table import EmbeddingTable


@dataclass
class _EdgeBuf:
    src: torch.Tensor
    dst: torch.Tensor
    loaded: object = None      # h2d event of the current contents
    busy: object = None        # compute event after the last batch that read it


class Worker:
    """Trains on `device` as worker `rank` of `world`; `sched` hands out units."""

    def __init__(self, cfg: EmbedConfig, table: EmbeddingTable, sampler: NegativeSampler,
                 device: torch.device, capacity: int, sched, rank: int = 0, world: int = 1):
        self.cfg, self.table, self.sampler = cfg, table, sampler
        self.device, self.rank, self.world, self.sched = device, rank, world, sched
        self.lanes = Lanes(device)
        swaps = capacity < table.P or world > 1
        self.cache = PartitionCache(table, device, self.lanes, capacity, sampler.cdf, pin=swaps)
        self.opt = RowOptimizer(cfg.optimizer, cfg.lr, cfg.eps, *cfg.betas)
        self.spec = LossSpec(cfg.score, cfg.loss, cfg.margin, cfg.chunk_size,
                             cfg.batch_negatives)
        self.gen = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + rank)
        if cfg.kernel == "fused":
            try:
                import triton  # noqa: F401
            except ImportError:
                raise OutcoreError("kernel='fused' needs the triton package: install it or "
                                   "use kernel='torch'") from None
            if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                raise OutcoreError("kernel='fused' runs on CUDA devices (TRITON_INTERPRET=1 "
                                   "emulates it on the CPU, slowly); use kernel='torch'")
        self.keep = world == 1          # alone: released partitions may stay resident
        self.bufs: list[_EdgeBuf] = []
        # edges get their own copy stream: on the h2d stream a chunk would queue behind the
        # next unit's partition prefetch and the compute stream would wait for both
        self.edge_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.record = None              # test hook: f(a, b, u, v, nu, nv), local row ids
        self.edges_done = 0
        self.wait_s = 0.0
        self.pending: list[tuple[tuple[int, ...], list]] = []   # released, write-back queued
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32

    # ---- one epoch -------------------------------------------------------------------
    def epoch(self, edges: BucketedEdges, bar=None) -> torch.Tensor:
        """Train every unit this worker gets; returns the summed loss (a device tensor)."""
        self._pin(edges)
        biggest = int(np.diff(edges.offsets).max()) if len(edges.offsets) > 1 else 0
        for k in (0, 1):                 # sized once for the epoch: no regrowth mid-epoch
            self._buf(k, min(self.cfg.edge_chunk, max(biggest, 1)))
        loss = torch.zeros((), device=self.device)
        cur = self._acquire_blocking(self._held(()))
        while cur is not None:
            self._fetch(cur, set(cur))
            nxt = self.sched.acquire(self.rank, self._held(cur))
            nxt = None if nxt == WAIT else nxt
            if nxt is not None:
                self._fetch(nxt, set(cur) | set(nxt))      # prefetch on the copy stream
            for a, b in edges.unit_buckets(cur, self.cfg.directed):
                loss += self._bucket(a, b, edges, bar)
            for p in set(cur):
                self.cache.touch(p)
            self._release(set(cur) - set(nxt or ()))
            if nxt is None:
                nxt = self._acquire_blocking(self._held(cur))
            cur = nxt
        self._flush_releases()
        return loss

    def _held(self, cur) -> tuple[int, ...]:
        return tuple(self.cache.resident() | set(cur)) if self.keep else tuple(cur)

    def _acquire_blocking(self, held):
        self._flush_releases()           # never wait for units while sitting on locks
        t0 = time.perf_counter()
        while True:
            unit = self.sched.acquire(self.rank, held)
            if unit != WAIT:
                self.wait_s += time.perf_counter() - t0
                return unit
            time.sleep(0.001)        # every remaining unit is locked by another worker

    def _fetch(self, unit, protect: set[int]) -> None:
        free = sum(1 for s in self.cache.slots if s.part < 0)
        evictable = [q for q in self.cache.resident() if q not in protect]
        for p in sorted(set(unit)):
            if p in self.cache.resident():
                continue
            if free == 0 and not evictable:
                return                   # no room to prefetch now; loaded when it is cur
            self.cache.fetch(p, protect)
            if free:
                free -= 1
            else:
                evictable.pop(0)

    def _release(self, parts: set[int]) -> None:
        """Alone: release at once (partitions stay resident). Shared: queue the write-back
        now; the lock goes only once it has landed (see _flush_releases)."""
        if not parts:
            return
        if self.keep:
            self.sched.release(self.rank, tuple(parts))
            return
        slots = [self.cache.writeback(p, drop=True) for p in parts]
        self.pending.append((tuple(parts), [s.written for s in slots]))

    def _flush_releases(self) -> None:
        """Called once the next unit's first chunk is queued, so the GPU has work while
        the host waits here."""
        for parts, events in self.pending:
            # host sync: another worker may load these partitions as soon as the lock is
            # released, so their write-back must have landed in the host table first
            for ev in events:
                host_wait(ev)
            self.sched.release(self.rank, parts)
        self.pending = []

    def _pin(self, edges: BucketedEdges) -> None:
        # Edges cross once per epoch: pin them (0.5 s/GiB, once) when they are small enough
        # that this pays back; larger edge sets are copied from pageable memory.
        small = edges.src.nbytes + edges.dst.nbytes <= (4 << 30)
        if self.device.type == "cuda" and small and getattr(edges, "_pinned", None) is None:
            edges._pinned = []
            for arr in (edges.src, edges.dst):
                t = host_tensor(arr)
                try:
                    if pin_(t) is t:  # registered in place (small arrays stay pageable)
                        edges._pinned.append(t)
                except RuntimeError:
                    pass                 # pageable: the copies then run synchronously

    def close(self, edges_seen=()) -> None:
        """Flush nothing; unregister what this worker pinned (see PartitionCache.close)."""
        for edges in edges_seen:
            for t in getattr(edges, "_pinned", None) or ():
                unpin_(t)
            edges._pinned = None
        self.cache.close()

    # ---- one bucket ------------------------------------------------------------------
    def _buf(self, k: int, n: int) -> _EdgeBuf:
        while len(self.bufs) < 2:
            self.bufs.append(None)
        b = self.bufs[k]
        if b is None or b.src.numel() < n:
            size = min(self.cfg.edge_chunk, max(n, 1))
            b = _EdgeBuf(torch.empty(size, dtype=torch.int32, device=self.device),
                         torch.empty(size, dtype=torch.int32, device=self.device))
            if self.bufs[k] is not None:
                # buffer reuse: a replaced buffer may still be read by queued batches
                host_wait(self.bufs[k].busy)
            self.bufs[k] = b
        return b

    def _load(self, k: int, edges: BucketedEdges, s: int, e: int) -> None:
        L, buf = self.lanes, self._buf(k, e - s)
        # buffer reuse: overwrite only after the batches that read the old chunk are done
        L.wait(self.edge_stream, buf.busy)
        with L.on(self.edge_stream):
            nb = L.cuda
            buf.src[:e - s].copy_(host_tensor(edges.src[s:e]), non_blocking=nb)
            buf.dst[:e - s].copy_(host_tensor(edges.dst[s:e]), non_blocking=nb)
        buf.loaded = L.event(self.edge_stream)

    def _bucket(self, a: int, b: int, edges: BucketedEdges, bar) -> torch.Tensor:
        lo, hi = edges.range(a, b)
        EC, B, L = self.cfg.edge_chunk, self.cfg.batch_size, self.lanes
        chunks = [(s, min(s + EC, hi)) for s in range(lo, hi, EC)]
        loss = torch.zeros((), device=self.device)
        self._load(0, edges, *chunks[0])
        for k, (s, e) in enumerate(chunks):
            if k + 1 < len(chunks):
                self._load((k + 1) % 2, edges, *chunks[k + 1])   # next chunk underneath
            buf = self.bufs[k % 2]
            # stream wait: the batches below read the chunk the h2d stream just copied
            L.wait(L.compute, buf.loaded)
            m = e - s
            perm = torch.randperm(m, generator=self.gen, device=self.device)
            u = buf.src[:m].index_select(0, perm).long()
            v = buf.dst[:m].index_select(0, perm).long()
            buf.busy = L.event()
            for i in range(0, m, B):
                loss += self._step(a, b, u[i:i + B], v[i:i + B])
            if self.pending:
                self._flush_releases()     # the previous unit's locks, now work is queued
            self.edges_done += m
            if bar is not None:
                bar.update(m)
        return loss

    # ---- one step --------------------------------------------------------------------
    def _step(self, a: int, b: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, d, sides = self.cfg, self.cfg.dim, self.cfg.sides
        rows_a, state_a, cdf_a = self.cache.view(a)
        rows_b, state_b, cdf_b = self.cache.view(b)
        k = self.table.state_cols // sides
        ta = 0                                  # side of the source vectors
        tb = sides - 1                          # side of the target vectors
        Ra = rows_a[:, ta * d:(ta + 1) * d]
        Rb = rows_b[:, tb * d:(tb + 1) * d]
        n_a, n_b = self.table.sizes[a], self.table.sizes[b]
        K = num_chunks(u.numel(), cfg.chunk_size)
        M = cfg.num_negatives
        nu = self.sampler.sample(n_a, K * M, cdf_a, self.gen)
        nv = self.sampler.sample(n_b, K * M, cdf_b, self.gen)
        if cfg.kernel == "fused":
            from .fused import fused_step
            lossbuf = torch.zeros(1, device=self.device)
            fused_step(rows_a, state_a, rows_b, state_b, u, v, nu, nv, cfg, ta, tb, lossbuf)
            if self.record is not None:
                self.record(a, b, u, v, nu, nv)
            return lossbuf[0]
        U, V = Ra.index_select(0, u), Rb.index_select(0, v)
        NU = Ra.index_select(0, nu).view(K, M, d)
        NV = Rb.index_select(0, nv).view(K, M, d)
        loss, dU, dV, dNU, dNV = batch_grads(U, V, NU, NV, self.spec)
        fa = [(u, dU), (nu, dNU.reshape(-1, d))]          # rows of a, source side
        fb = [(v, dV), (nv, dNV.reshape(-1, d))]          # rows of b, target side
        if a == b and sides == 1:
            groups = [(rows_a, state_a, 0, fa + fb)]
        else:
            groups = [(rows_a, state_a, ta, fa), (rows_b, state_b, tb, fb)]
        for rows, state, side, parts in groups:
            self.opt.update_parts(rows[:, side * d:(side + 1) * d],
                                  state[:, side * k:(side + 1) * k], parts, cfg.exact_sparse)
        if self.record is not None:
            self.record(a, b, u, v, nu, nv)
        return loss
