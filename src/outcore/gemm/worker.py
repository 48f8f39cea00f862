"""One device's side of a product: pull C tiles, load blocks, multiply, write tiles back.

Three streams per GPU (plus one for dtype conversion when the compute dtype differs from
the host's): h2d copies pieces of A and B blocks into cache slots; compute waits for just
the pieces it needs and accumulates C tiles; d2h copies finished tiles to the host output.
The host thread only enqueues; it blocks in one place, the flow control in `_loop`.

Per tile: C loaded first when beta != 0; for each K block (direction alternating between
tiles, so the blocks of the last tile are still cached): the GEMMs over the pieces, cut
where the device's clock (clock.py) says a GEMM would otherwise wait for a piece: pieces
already on the device merge into one GEMM, and so do fresh pieces where the link runs
ahead of compute. A strip of a tile (tiles.row_strips) multiplies its rows of the panel.
The blocks a tile reads and their copies in are loads.py's.

A task of several tiles (one device holding everything: `plan.prologue`) first runs the
first `prologue` pieces of K block 0 over all its tiles, piece-major (all of block 0 when it
has fewer pieces), and then each tile to the end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..memory import cuda_index
from ..transfer import Lanes, host_wait
from .arena import Arena
from .cache import BlockCache
from .clock import DeviceClock
from .copies import Copier
from .hostmat import HostMatrix
from .loads import BlockLoads, Landings
from .mmacc import mm_acc
from .model import merged_end
from .split import mm_acc_split, split_calls
from .planned import GemmPlan
from .stats import DeviceStats
from .tiles import Tile, spans


def _rows_by_k(view: torch.Tensor, k_on_rows: bool) -> torch.Tensor:
    """A block of A in storage order as op(A)'s rows x K (a transposed view where K runs
    along the stored rows)."""
    return view.t() if k_on_rows else view


@dataclass
class GemmJob:
    """One product, shared read-only by the device workers.

    a: storage of op(A), M x K (or K x M when `ta`); b: of op(B), K x N (N x K when `tb`);
    c: the output, M x N, row-major storage.
    """
    plan: GemmPlan
    a: HostMatrix
    b: HostMatrix
    c: HostMatrix
    ta: bool
    tb: bool
    alpha: float
    beta: float


@dataclass
class _Run:
    tile: Tile
    slot: int
    acc: torch.Tensor
    beta: float = 0.0
    started: bool = False


# Whether the worker's lanes switch streams by torch.cuda.set_stream (transfer._StreamOn)
# rather than torch.cuda.stream()'s context (False: that, the rule until session 23, for
# bench A/Bs). The worker enters three a tile, and at 16384 tokens the bf16 products'
# 512-row strips were issued at the host's pace: the h2d stream idled 0.37 ms between
# 0.31 ms copies with nothing on the device to wait for (gemm-trace-h200.json), and
# host_setup's profile (under cProfile) had the issuing loop busy 15.8 of 17.2 ms.
# Session 23's A/B (gemm-h200-s23-{light,ctx}-*.json): the six bf16 shapes at 16384
# tokens 1.02-1.06x faster with it, the fp32 ones the same.
LIGHT_STREAM_CTX = True

# Whether a device's copy and conversion streams are made once per process and reused by
# every product on it (False: three new streams a product, the rule until session 27).
# Creating them took 0.05-0.08 ms of a product's host time before its first copy
# (host-setup-h200*.json). Products on one device that overlap in time (two threads) then
# share the streams: their work is ordered by events either way, and the streams keep
# each one's copies in order.
REUSE_STREAMS = True
_STREAMS: dict = {}              # device index -> (h2d, d2h, conversion) streams
_STREAMS_LOCK = threading.Lock()


def _device_streams(device: torch.device) -> tuple:
    """This process's (h2d, d2h, conversion) streams of CUDA `device`."""
    index = cuda_index(device)
    with _STREAMS_LOCK:
        if index not in _STREAMS:
            _STREAMS[index] = tuple(torch.cuda.Stream(index) for _ in range(3))
        return _STREAMS[index]


class DeviceRun:
    """One device's run of a product, for DeviceWorker and StrassenWorker (strassen_worker.py):
    the device current, its stamps in `stats`, and the host sync at the end. Subclasses give
    _setup, _loop(pull, first) and _release (which also fills stats.device_bytes)."""

    def __init__(self, device: torch.device, job: GemmJob, stats: DeviceStats,
                 progress=None):
        self.device, self.job, self.stats = device, job, stats
        self.plan = job.plan
        self.progress = progress or (lambda n: None)

    def run(self, pull, first: int = 1) -> None:
        cuda = self.device.type == "cuda"
        ctx = torch.cuda.device(self.device) if cuda else contextlib.nullcontext()
        with ctx, torch.no_grad():
            self._setup()
            self.stats.t_ready = time.perf_counter()
            try:
                self._loop(pull, first)
                self.stats.t_issued = time.perf_counter()
            finally:
                if cuda:
                    # host sync: every output tile is in host memory (and no buffer is still
                    # in use by a stream) before the buffers are dropped and matmul returns
                    torch.cuda.synchronize(self.device)
                self.stats.t_synced = time.perf_counter()
                self.copier.close()
                self._release()

    def _make_lanes(self) -> Lanes:
        """The device's streams: its kept copy streams (REUSE_STREAMS) or two new ones."""
        reuse = REUSE_STREAMS and self.device.type == "cuda"
        return Lanes(self.device, light=LIGHT_STREAM_CTX,
                     copy_streams=_device_streams(self.device)[:2] if reuse else None)


class DeviceWorker(DeviceRun, BlockLoads):
    """Runs tiles on `device` for `job`; counts into `stats`; `progress(n)` per tile done."""

    def _release(self) -> None:
        """Drop every view of the arena, and the arena: its segment is free for the next
        product as soon as run() returns, even while something still refers to this worker
        (a reference cycle would keep it, and the arena with it, until a garbage collection,
        and the next product's arena would be made beside it)."""
        if getattr(self, "cache", None) is not None:
            self.stats.device_bytes = self.cache.nbytes() + sum(
                t.numel() * t.element_size() for t in self.accs + self.cbufs + self.landing
                if t is not None)
        self.cache = None
        self.accs, self.cbufs, self.landing = [], [], []
        if getattr(self, "arena", None) is not None:
            self.arena.release()
        self.arena = None

    def _setup(self) -> None:
        p, dev = self.plan, self.device
        self.lanes = self._make_lanes()
        self.conv = None
        if dev.type == "cuda" and (p.needs_landing or p.splits):
            self.conv = _device_streams(dev)[2] if REUSE_STREAMS else torch.cuda.Stream(dev)
        # Buffer reuse: every buffer of this product is a view of one allocation (arena.py),
        # sized by the plan; the next product reuses its segment.
        self.arena = Arena.for_plan(dev, p)
        self.cache = BlockCache(p.n_slots, p.slot_numel, p.compute_dtype, self.arena.take,
                                exact=p.caches_all, split=p.splits)
        self.accs: list = [None] * p.n_acc
        self.acc_free: list = [None] * p.n_acc      # event: last reader of the accumulator
        self.cbufs: list = [None] * (2 if p.needs_cbuf else 0)
        self.cbuf_free: list = [None] * 2           # event: last user of the C landing buffer
        self.landing: list = [None] * (2 if p.needs_landing else 0)
        self.land_free: list = [None] * 2           # event: conversion that last read it
        self.n_cbuf = self.n_land = 0
        self.kspans = spans(p.k, p.tile_k)
        self.pspans = [p.pieces(k1 - k0) for k0, k1 in self.kspans]
        self.copier = Copier(self.lanes, self.stats, max(p.piece_numel, p.tile_m * p.tile_n))
        self.clock = DeviceClock(p.compute)

    def _buf(self, bufs: list, i: int, numel: int, dtype, shape) -> torch.Tensor:
        if bufs[i] is None:
            bufs[i] = self.arena.take(numel, dtype)
        return bufs[i][:shape[0] * shape[1]].view(shape)

    def _loop(self, pull, first: int) -> None:
        inflight: deque = deque()
        seq, n = 0, first
        endgame = getattr(pull, "endgame", lambda: False)
        depth = getattr(pull, "depth", lambda: 2)()
        if not all(m.pinned and m.rowmajor for m in (self.job.a, self.job.b)):
            # staged inputs: every queued load holds a pinned staging buffer from the pool
            # (never freed), so queue as little as when devices share the tiles
            depth = min(depth, 2)
        while True:
            if len(inflight) >= depth or (inflight and endgame()):
                # Host sync (flow control): at most `depth` tasks queued on this device (one
                # when the last tiles are handed out), so a tile is claimed only shortly
                # before this device can start it and a faster device finds it unclaimed.
                host_wait(inflight.popleft())
            tiles = pull(n)
            n = 1
            if not tiles:
                return
            inflight.append(self._task(tiles, seq))
            seq += len(tiles)

    # -- one task ------------------------------------------------------------------------
    def _task(self, tiles: list[Tile], seq0: int):
        p = self.plan
        runs = []
        for x, t in enumerate(tiles):
            slot = (seq0 + x) % p.n_acc
            acc = self._buf(self.accs, slot, p.tile_m * p.tile_n, p.acc_dtype, (t.rows, t.cols))
            runs.append(_Run(t, slot, acc))
        # The prologue runs over K block 0's pieces; a plan may ask for more than it has
        # (K shallower than prologue x piece_k): then it covers the whole block.
        pro = min(p.prologue, len(self.pspans[0])) if len(tiles) > 1 else 0
        for piece in range(pro):
            for r in runs:
                self._gemm(r, 0, piece, piece + 1)
        done = None
        for x, r in enumerate(runs):
            kbs = range(len(self.kspans))
            for kb in (kbs if (seq0 + x) % 2 == 0 else reversed(kbs)):
                self._gemm(r, kb, pro if kb == 0 else 0, len(self.pspans[kb]))
            done = self._finish(r)
        return done

    def _start(self, r: _Run) -> None:
        L, job, t = self.lanes, self.job, r.tile
        # Buffer reuse: the accumulator slot was last read by an earlier tile's copy-out.
        L.wait(L.compute, self.acc_free[r.slot])
        r.started = True
        if job.beta == 0:
            return
        region = (t.r0, t.r1, t.c0, t.c1)
        if not self.plan.needs_cbuf:
            L.wait(L.h2d, self.acc_free[r.slot])   # buffer reuse, as above, for the copy in
            self.copier.h2d(r.acc, job.c, region)
            L.wait(L.compute, L.event(L.h2d))      # stream wait: C has landed
        else:
            q = self.n_cbuf % 2
            self.n_cbuf += 1
            cb = self._buf(self.cbufs, q, self.plan.tile_m * self.plan.tile_n, job.c.dtype,
                           (t.rows, t.cols))
            L.wait(L.h2d, self.cbuf_free[q])       # buffer reuse: its last user is done
            self.copier.h2d(cb, job.c, region)
            L.wait(L.compute, L.event(L.h2d))      # stream wait: C has landed
            r.acc.copy_(cb)                        # to the accumulator dtype, on compute
            self.cbuf_free[q] = L.event(L.compute)
        r.beta = job.beta

    def _gemm(self, r: _Run, kb: int, p0: int, p1: int) -> None:
        """r.acc += alpha * op(A)[tile rows, pieces p0..p1 of block kb] @ op(B)[..., cols]."""
        if p0 >= p1:
            return
        if not r.started:
            self._start(r)
        L, job, t = self.lanes, self.job, r.tile
        a, a_row0 = self._a_block(t, kb)
        b = self._block("B", t.j, kb)
        ready = Landings(self, a, b, p0, p1)
        off = t.r0 - a_row0                                # a strip's first row in the block
        a_op = _rows_by_k(a.view, a.k_on_rows)[off:off + t.rows]   # rows x k
        b_op = b.view if b.k_on_rows else b.view.t()       # k x cols
        if a.lo is not None:                               # split blocks (tf32x3)
            a_lo = _rows_by_k(a.lo, a.k_on_rows)[off:off + t.rows]
            b_lo = b.lo if b.k_on_rows else b.lo.t()
        s = 0
        while s < len(ready):
            e = merged_end(ready, s, self.clock.comp)
            s0, s1 = p0 + s, p0 + e
            # Stream waits: the last piece of the run has landed in both blocks (earlier
            # pieces of a block were copied, or converted or split, before it on the same
            # stream).
            L.wait(L.compute, a.events[s1 - 1])
            L.wait(L.compute, b.events[s1 - 1])
            k0, k1 = a.bounds[s0][0], a.bounds[s1 - 1][1]
            if a.lo is None:
                lt = mm_acc(r.acc, a_op[:, k0:k1], b_op[k0:k1, :], job.alpha, r.beta)
            else:
                lt = mm_acc_split(r.acc, a_op[:, k0:k1], a_lo[:, k0:k1], b_op[k0:k1, :],
                                  b_lo[k0:k1, :], job.alpha, r.beta)
            self.clock.gemm(t.rows, t.cols, k1 - k0, max(ready[i] for i in range(s, e)))
            r.beta = 1.0
            self.stats.gemms += 1 if a.lo is None else split_calls(k1 - k0)
            self.stats.lt_gemms += lt
            self.stats.flops += 2.0 * t.rows * t.cols * (k1 - k0)
            s = e
        used = L.event(L.compute)
        self.cache.release(a, used)
        self.cache.release(b, used)

    def _finish(self, r: _Run):
        L, job, t = self.lanes, self.job, r.tile
        if not r.started:
            self._start(r)
        src = r.acc
        q = None
        if self.plan.needs_cbuf:
            q = self.n_cbuf % 2
            self.n_cbuf += 1
            src = self._buf(self.cbufs, q, self.plan.tile_m * self.plan.tile_n, job.c.dtype,
                            (t.rows, t.cols))
            L.wait(L.compute, self.cbuf_free[q])   # buffer reuse: its last user is done
            src.copy_(r.acc)                       # to the output dtype, on compute
        done = L.event(L.compute)
        copied = self.copier.d2h(job.c, (t.r0, t.r1, t.c0, t.c1), src, done)
        if q is None:
            self.acc_free[r.slot] = copied
        else:
            self.acc_free[r.slot] = done
            self.cbuf_free[q] = copied
        self.stats.tiles += 1
        self.progress(1)
        return done
