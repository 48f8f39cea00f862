"""The worker's loads: which cached block a tile reads, and its pieces' copies in.

A mixin of DeviceWorker (worker.py), which owns the state it reads: the plan and job, the
block cache, the copier, the lanes and the conversion stream, the device clock, and the
landing buffers (host-dtype pieces converted on the device when the compute dtype
differs from the host's; under compute="tf32x3" each piece is also split into its hi and
lo parts there, split.py). Nothing here blocks the host. `Landings` is a tile's pieces'
landing times, its copies enqueued as the worker's GEMM cuts read them.
"""

from __future__ import annotations

import torch

from .cache import Block
from .hostmat import HostMatrix
from .split import lo_part, split_
from .tiles import Tile


class BlockLoads:
    """DeviceWorker's blocks and pieces; see the module docstring."""

    def _a_block(self, t: Tile, kb: int) -> tuple[Block, int]:
        """The A block tile `t` reads in K block kb, and the first row of op(A) it holds.

        A row strip of the last tile (plan.strips) whose panel no earlier tile loaded gets
        a block of its own rows: each strip then computes as soon as its rows have landed,
        so what runs after the product's last copy in is one strip's GEMM and copy out, not
        every strip's (the whole panel had to land before the first strip). Row-major A
        only: a transposed A's strip would be copied in rows of a strip's width. Not under
        a prologue: every tile is live there, and the strips' blocks would evict panels
        whose later pieces are still to run (session 13: tf32 at 32768 moved 11.8 GB
        instead of 8.6). Not with K in several blocks either: each strip would then hold
        one block per K block, and in a tight cache evict the B blocks the next strip
        needs."""
        p, p0 = self.plan, t.i * self.plan.tile_m
        whole = (t.r0, t.r1) == (p0, min(p0 + p.tile_m, p.m))
        shared = whole or self.job.ta or p.prologue or p.nk > 1
        if shared or ("A", t.i, kb) in self.cache.blocks:
            return self._block("A", t.i, kb), p0
        return self._block("A", t.i, kb, (t.r0, t.r1)), t.r0

    def _block(self, op: str, x: int, kb: int, rows: tuple[int, int] | None = None) -> Block:
        """Block (op, x, kb) from the cache, or a new one; `rows`: only those rows of A's
        panel x (a strip's block, keyed apart from the panel's)."""
        key = (op, x, kb) if rows is None else (op, x, kb, rows)
        blk = self.cache.get(key)
        if blk is not None:
            self.stats.block_hits += 1
            return blk
        self.stats.block_misses += 1
        p, (k0, k1) = self.plan, self.kspans[kb]
        if op == "A":
            r0, r1 = rows or (x * p.tile_m, min((x + 1) * p.tile_m, p.m))
            if self.job.ta:
                region, shape, k_on_rows = (k0, k1, r0, r1), (k1 - k0, r1 - r0), True
            else:
                region, shape, k_on_rows = (r0, r1, k0, k1), (r1 - r0, k1 - k0), False
        else:
            c0, c1 = x * p.tile_n, min((x + 1) * p.tile_n, p.n)
            if self.job.tb:
                region, shape, k_on_rows = (c0, c1, k0, k1), (c1 - c0, k1 - k0), False
            else:
                region, shape, k_on_rows = (k0, k1, c0, c1), (k1 - k0, c1 - c0), True
        return self.cache.put(key, shape, k_on_rows, region, self.pspans[kb])

    def _ensure(self, blk: Block, p: int) -> None:
        """Load blk's pieces up to p (in order); a block of an `a_rows` / `b_rows` plan
        stored rows x K whole, at its first need (_load_rows)."""
        if blk.loaded <= p and self._by_rows(blk):
            self._load_rows(blk)
        while blk.loaded <= p:
            self._load_piece(blk, blk.loaded)

    def _by_rows(self, blk: Block) -> bool:
        """An empty block stored rows x K (A's, or a transposed B's) of a plan that copies
        its operand by rows, whose rows fit a copy piece (the landing buffers' size)."""
        _, _, c0, c1 = blk.region
        p = self.plan
        return ((p.a_rows if blk.key[0] == "A" else p.b_rows) and not blk.k_on_rows
                and blk.loaded == 0 and c1 - c0 <= p.piece_numel)

    def _load_rows(self, blk: Block) -> None:
        """All of block `blk` in chunks of whole rows: in a row-major matrix whose block
        spans K each chunk is one contiguous copy at the link's full rate, where a K piece
        of it is a 2-D copy of short rows (8-16 KiB in bf16's training shapes: 34-49 GB/s
        alone on the H200 against 55). Every piece's event is then the last chunk's: the
        block's GEMMs wait for all of it."""
        host = self.job.a if blk.key[0] == "A" else self.job.b
        r0, r1, c0, c1 = blk.region
        step = self.plan.row_chunk(c1 - c0)
        eta = ev = None
        for j in range(0, r1 - r0, step):
            j1 = min(j + step, r1 - r0)
            eta = self._eta(host, j1 - j, c1 - c0)
            ev = self._copy_in(blk, blk.view[j:j1], host, (r0 + j, r0 + j1, c0, c1), j == 0)
        blk.events = [ev] * len(blk.bounds)
        blk.etas = [eta] * len(blk.bounds)

    def _load_piece(self, blk: Block, p: int) -> None:
        host: HostMatrix = self.job.a if blk.key[0] == "A" else self.job.b
        dst, region = blk.piece_view(p), blk.piece_region(p)
        r0, r1, c0, c1 = region
        blk.etas.append(self._eta(host, r1 - r0, c1 - c0))
        blk.events.append(self._copy_in(blk, dst, host, region, p == 0))

    def _eta(self, host: HostMatrix, rows: int, cols: int) -> float:
        """The device clock's landing time of a rows x cols copy from `host` (a contiguous
        one when the rows are whole rows of it)."""
        item = host.dtype.itemsize
        return self.clock.load(rows * cols * item, cols * item, cols == host.shape[1])

    def _copy_in(self, blk: Block, dst: torch.Tensor, host: HostMatrix, region,
                 first: bool):
        """dst (part of blk's view) <- host[region] in the compute dtype; returns the event
        after which dst holds it. first: blk's first copy (its slot may still be read)."""
        L = self.lanes
        if not self.plan.needs_landing:
            if first:
                L.wait(L.h2d, blk.reuse_after)   # buffer reuse: the slot's last GEMM is done
            self.copier.h2d(dst, host, region)
            landed = L.event(L.h2d)
            return landed if blk.lo is None else self._split(blk, dst, landed)
        q = self.n_land % 2
        self.n_land += 1
        land = self._buf(self.landing, q, self.plan.piece_numel, host.dtype, tuple(dst.shape))
        L.wait(L.h2d, self.land_free[q])   # buffer reuse: the conversion that read it is done
        self.copier.h2d(land, host, region)
        landed = L.event(L.h2d)
        with L.on(self.conv):
            L.wait(self.conv, landed)      # stream wait: convert only what has landed
            if first:
                L.wait(self.conv, blk.reuse_after)   # buffer reuse: the slot's last GEMM is done
            dst.copy_(land)
            if blk.lo is not None:
                split_(dst, lo_part(blk.view, blk.lo, dst))
        self.land_free[q] = L.event(self.conv)
        return self.land_free[q]

    def _split(self, blk: Block, dst: torch.Tensor, landed):
        """dst (part of blk's view, landed on h2d at event `landed`) split into its hi
        and lo parts (split.py) on the conversion stream; the event after which both
        hold it. The slot's last GEMM was waited for before the copy in."""
        L = self.lanes
        with L.on(self.conv):
            L.wait(self.conv, landed)      # stream wait: split only what has landed
            split_(dst, lo_part(blk.view, blk.lo, dst))
        return L.event(self.conv)


# Whether a tile's pieces are enqueued as its GEMMs need them (Landings) rather than all
# before its first GEMM (the rule until session 23; False: that rule, for bench A/Bs).
LAZY_PIECES = True


class Landings:
    """Landing times (the device clock's) of pieces p0..p1 of a tile's A and B blocks,
    each piece's copies enqueued when its time is first read. `merged_end` reads one piece
    past the GEMM it cuts, so a tile's first GEMM is enqueued after two pieces' copies, not
    after all of them. At fp32-16384 the first GEMM had started 2.45 ms after the first
    copy, 1 ms after its pieces had landed, behind the host's enqueueing of the tile's 16
    copies (session 23's trace, gemm-probe-h200-s23-fp32-16384-auto.trace.json.gz); with
    this it starts as they land (1.47 ms). End to end: fp32 the same (its first tile is
    bound by its copies), the bf16 shapes at 16384 tokens 0.98-1.05x (gemm-h200-s23-
    {lazy,eager}-*.json)."""

    def __init__(self, worker: "BlockLoads", a, b, p0: int, p1: int):
        self.w, self.a, self.b, self.p0, self.n = worker, a, b, p0, p1 - p0
        self.times: list[float] = []
        if not LAZY_PIECES and self.n:
            self[self.n - 1]   # every piece's copies enqueued before the first GEMM

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        while len(self.times) <= i:
            p = self.p0 + len(self.times)
            self.w._ensure(self.a, p)
            self.w._ensure(self.b, p)
            self.times.append(max(self.a.etas[p], self.b.etas[p]))
        return self.times[i]
