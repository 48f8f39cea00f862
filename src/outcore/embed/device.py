"""Partitions resident on one device: fixed slots, prefetch on the copy stream, write-back.

`capacity` slots are allocated once, each big enough for the largest partition plus one
scratch row (see optim.py) and its optimizer state. A slot
is reused for another partition only after (a) the compute stream has finished with the
old one and (b) the old one's write-back to the host has finished: the h2d copy waits on
both events on the device, so the host never blocks for it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..errors import OutcoreError
from ..memory import pin_, unpin_
from ..transfer import Lanes, host_wait
from .table import EmbeddingTable


@dataclass
class Slot:
    rows: torch.Tensor          # (max_n + 1) x W
    state: torch.Tensor         # (max_n + 1) x S
    part: int = -1
    dirty: bool = False
    busy_until: object = None   # compute event after the last use
    written: object = None      # d2h event of the last write-back
    loaded: object = None       # h2d event of the current load


class PartitionCache:
    """p -> device copy of partition p (rows with scratch row, state)."""

    def __init__(self, table: EmbeddingTable, device: torch.device, lanes: Lanes,
                 capacity: int, cdfs=None, pin: bool = True):
        if capacity < min(2, table.P):
            raise OutcoreError(f"the device holds {capacity} partition(s) but a bucket needs "
                               "2: raise --gpu-memory or --partitions")
        self.table, self.device, self.lanes = table, device, lanes
        n = max(table.sizes)
        # torch.empty launches no kernel, so nothing on the compute stream can race the
        # first h2d copy into a slot (every row a view exposes is written by fetch)
        self.slots = [Slot(torch.empty(n + 1, table.width, device=device),
                           torch.empty(n + 1, table.state_cols, device=device))
                      for _ in range(min(capacity, table.P))]
        # negative-sampling tables of every partition stay on the device: 8 bytes a node
        # against the 4*(W+S) of its row, and no copy on the swap path
        self.cdfs = None if cdfs is None else [c.to(device) for c in cdfs]
        self.where: OrderedDict[int, Slot] = OrderedDict()     # resident, LRU order
        self.pinned = False
        # Pin the host table only if partitions will cross more than once (swaps or several
        # workers): pinning costs about 0.5 s per GiB, a single pageable copy much less.
        if device.type == "cuda" and pin:
            try:
                # Async copies straight from/to the host table; a table too small to
                # register in place stays pageable (pin_ would hand back a copy).
                self.pinned = pin_(table.flat) is table.flat
            except RuntimeError:
                self.pinned = False       # copies then go synchronously (pageable memory)
        self.bytes_in = self.bytes_out = 0
        self.last_written: dict[int, object] = {}   # partition -> its last d2h event

    def resident(self) -> set[int]:
        return set(self.where)

    def view(self, p: int):
        """(rows, state, cdf) views of resident partition p; compute waits for its load."""
        s = self.where[p]
        self.where.move_to_end(p)
        # stream wait: the compute stream must not read the slot before its h2d copy lands
        self.lanes.wait(self.lanes.compute, s.loaded)
        n = self.table.sizes[p]
        return s.rows[:n + 1], s.state[:n + 1], (self.cdfs[p] if self.cdfs is not None else None)

    def touch(self, p: int) -> None:
        """Mark p modified and used by work enqueued so far on the compute stream."""
        s = self.where[p]
        s.dirty = True
        s.busy_until = self.lanes.event()

    def fetch(self, p: int, protect: set[int]) -> None:
        """Start loading p (no-op if resident); evicts the LRU partition not in `protect`."""
        if p in self.where:
            return
        free = [s for s in self.slots if s.part < 0]
        if free:
            slot = free[0]
        else:
            victims = [q for q in self.where if q not in protect]
            if not victims:
                raise OutcoreError("no free partition slot on the device: raise --gpu-memory")
            slot = self.writeback(victims[0], drop=True)
        t, n, L = self.table, self.table.sizes[p], self.lanes
        # buffer reuse: the copy into this slot must follow the last compute that read it
        # and the write-back of its previous partition (device-side waits, no host block)
        L.wait(L.h2d, slot.busy_until)
        L.wait(L.h2d, slot.written)
        # and a partition evicted moments ago must be on the host before it is read back
        L.wait(L.h2d, self.last_written.get(p))
        with L.on(L.h2d):
            if t.is_initialized(p):
                slot.rows[:n].copy_(t.rows(p), non_blocking=self.pinned)
                slot.state[:n].copy_(t.state(p), non_blocking=self.pinned)
                self.bytes_in += t.partition_bytes(p)
            else:
                for a in range(0, n, t.init_chunk):     # bounded temporaries (table.py)
                    b = min(n, a + t.init_chunk)
                    slot.rows[a:b].copy_(t.initial_rows(p, self.device, a, b))
                slot.state[:n].zero_()
            slot.rows[n].zero_()
            slot.state[n].zero_()
        slot.loaded = L.event(L.h2d)
        slot.part, slot.dirty = p, False
        self.where[p] = slot

    def writeback(self, p: int, drop: bool) -> Slot:
        """Copy p back to the host table (if modified) on the d2h stream; frees its slot
        when `drop`. The copy is complete once `slot.written` has fired."""
        slot = self.where[p]
        t, n, L = self.table, self.table.sizes[p], self.lanes
        if slot.dirty:
            # stream wait: write back only after the compute that updated it
            L.wait(L.d2h, slot.busy_until)
            with L.on(L.d2h):
                t.rows(p).copy_(slot.rows[:n], non_blocking=self.pinned)
                t.state(p).copy_(slot.state[:n], non_blocking=self.pinned)
            slot.written = L.event(L.d2h)
            self.last_written[p] = slot.written
            t.mark_initialized(p)
            slot.dirty = False
            self.bytes_out += t.partition_bytes(p)
        if drop:
            del self.where[p]
            slot.part = -1
        return slot

    def close(self) -> None:
        """Unregister the pinned host table: it must not be freed while registered (CUDA
        would keep DMA-ing to the old physical pages of a reused address range)."""
        if self.pinned:
            unpin_(self.table.flat)
            self.pinned = False

    def flush(self, drop: bool = False) -> None:
        """Write every modified partition back and wait for it (a deliberate host sync:
        the host table must be complete before anyone reads it)."""
        slots = [self.writeback(p, drop) for p in list(self.where)]
        for s in slots:
            host_wait(s.written)
