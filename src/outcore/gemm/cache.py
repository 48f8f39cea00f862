"""Per-device cache of A and B blocks (least recently used goes first).

    slot: a flat device buffer of max(tile_m, tile_n) x tile_k elements (compute dtype),
          allocated on first use and reused for every block after (no allocator churn);
          with `exact` (the plan caches every block: nothing is ever evicted) each slot is
          its block's own size, so a whole-width strip's small A blocks do not take as
          much memory as its large B block
    block ("A", i, kb): op(A) rows of panel i, K block kb; ("B", j, kb) likewise. Its
          device view is in the host's storage order (a transposed operand stays
          transposed, the GEMM takes it as a transposed view). With `split` (compute
          tf32x3, split.py) a slot is twice as long: the block's hi part in its first
          half (`view`), its lo part in the second (`lo`), both of the same shape.

A block is loaded piece by piece (pieces along K, one event each) and only as far as it is
needed so far, so compute on a fresh block starts after its first piece, and a schedule
can bring in piece p of many panels before piece p+1 of any. Nothing here blocks the host:
a slot taken from an evicted block records the event of that block's last GEMM, and the
first copy into the slot waits for it on the device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch


@dataclass
class Block:
    """One cached block; see the module docstring."""
    key: tuple
    slot: int
    view: torch.Tensor                  # storage order: (rows x k) or (k x rows)
    k_on_rows: bool                     # K runs along the view's rows (a transposed layout)
    region: tuple[int, int, int, int]   # the block in the host matrix's storage coordinates
    bounds: list[tuple[int, int]]       # piece spans along K, relative to the block
    events: list = field(default_factory=list)   # per loaded piece: the event it landed with
    etas: list = field(default_factory=list)     # per loaded piece: when it should land (s)
    lo: torch.Tensor | None = None      # split blocks: the lo part, laid out as `view`
    reuse_after: object = None          # event: the previous occupant's last GEMM
    last_use: object = None             # event: this block's last GEMM so far
    pins: int = 0

    @property
    def loaded(self) -> int:
        return len(self.events)

    def piece_view(self, p: int) -> torch.Tensor:
        k0, k1 = self.bounds[p]
        return self.view[k0:k1, :] if self.k_on_rows else self.view[:, k0:k1]

    def piece_region(self, p: int) -> tuple[int, int, int, int]:
        r0, r1, c0, c1 = self.region
        k0, k1 = self.bounds[p]
        return (r0 + k0, r0 + k1, c0, c1) if self.k_on_rows else (r0, r1, c0 + k0, c0 + k1)


class BlockCache:
    """n_slots slots of slot_numel elements; LRU eviction of unpinned blocks.

    alloc(numel, dtype) -> a 1-d device tensor: where a slot's buffer comes from, on its
    first use (the worker's arena, arena.py).
    """

    def __init__(self, n_slots: int, slot_numel: int, dtype: torch.dtype, alloc,
                 exact: bool = False, split: bool = False):
        self.slot_numel, self.dtype, self.alloc = slot_numel, dtype, alloc
        self.exact, self.split = exact, split
        self._bufs: list[torch.Tensor | None] = [None] * n_slots
        self._free = list(range(n_slots - 1, -1, -1))
        self.blocks: OrderedDict[tuple, Block] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def get(self, key: tuple) -> Block | None:
        """The cached block for `key` (pinned until `release`), or None."""
        blk = self.blocks.get(key)
        if blk is None:
            return None
        self.blocks.move_to_end(key)
        blk.pins += 1
        self.hits += 1
        return blk

    def put(self, key: tuple, shape: tuple[int, int], k_on_rows: bool, region,
            bounds) -> Block:
        """A new, empty (no piece loaded) pinned block in a free or evicted slot."""
        self.misses += 1
        reuse_after = None
        if self._free:
            slot = self._free.pop()
        elif self.exact:
            # A plan that caches every block evicts none. It can still meet more blocks
            # than slots: a strip of a panel this device never loaded whole gets a block
            # of its own rows (loads.py). A new slot for it, as no evicted slot may be
            # reused: its buffer, sized for its own block, may be too small for this one,
            # and the arena has no room for a second allocation. Those strips' blocks
            # together are no larger than the panel, so all of op(A) and op(B) still
            # bounds the bytes.
            slot = len(self._bufs)
            self._bufs.append(None)
        else:
            victim = next((b for b in self.blocks.values() if b.pins == 0), None)
            if victim is None:
                raise RuntimeError("gemm block cache: every slot is in use (plan too small)")
            del self.blocks[victim.key]
            slot, reuse_after = victim.slot, victim.last_use
            self.evictions += 1
        if self._bufs[slot] is None:
            # buffer reuse: an evicted slot's buffer is slot_numel long, as every slot of a
            # cache that evicts; an exact slot is never taken over (see above)
            numel = shape[0] * shape[1] if self.exact else self.slot_numel
            self._bufs[slot] = self.alloc(numel * (2 if self.split else 1), self.dtype)
        buf, n = self._bufs[slot], shape[0] * shape[1]
        # a split slot: hi in its first half, lo in its second (half = the slot's numel)
        lo = buf[buf.numel() // 2:][:n].view(shape) if self.split else None
        blk = Block(key, slot, buf[:n].view(shape), k_on_rows, region, bounds, lo=lo,
                    reuse_after=reuse_after, pins=1)
        self.blocks[key] = blk
        return blk

    def release(self, blk: Block, last_use) -> None:
        """Unpin `blk`; `last_use` (an event) is when its GEMMs so far are done."""
        blk.pins -= 1
        blk.last_use = last_use

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs if b is not None)
