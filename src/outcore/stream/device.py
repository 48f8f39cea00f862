"""The device side of streaming: a few slots that hold the blocks in flight.

Slots are flat fp32 device buffers of the largest block's size, allocated once and reused
for every block (allocation churn of GB-sized buffers would fragment the caching
allocator); a slot may instead hold a block's 16-bit host copy (storage.py) in the first
half of its bytes.
A block is copied host->device into a free slot on the h2d stream; compute waits on that
copy's event; when compute is done with it the slot records an event that the next copy
into the same slot waits on. Nothing here blocks the host.

`rest` (group 0: embeddings, final norm, head) has its own buffer, loaded once per step.

Engine(block_slots=3) by default: one slot computing, the next block loading, and the
blocks at each end of the step kept from forward to backward and back. More slots
(opt-in) let the runner load `block_slots - 2` blocks ahead (BlockRunner,
prefetch_depth), so loads of the cheap blocks run ahead of a device-updated block's 12
B/param of weights, m and v. stream/simulate.py put 3b-16k at about 0.80 s with 4 slots in
the interleaved order, against 0.85 with 3; the H200 (session 13,
stream-h200-ab-slots-*.json) measured 0.845 s against the default's 0.833 in one A/B:
inside the spread between calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import OutcoreError
from ..transfer import Lanes


def check_slots(v) -> int:
    """Engine(block_slots=...): an int from 3 to 8."""
    if isinstance(v, bool) or not isinstance(v, int) or not 3 <= v <= 8:
        raise OutcoreError(f"block_slots={v!r}: use an int from 3 (the default) to 8")
    return v


@dataclass
class _Slot:
    buf: torch.Tensor           # fp32, max block numel
    group: int = -1             # which group's weights it holds (-1: none)
    version: int = -1           # the group's master version those weights are from
    dtype: torch.dtype = torch.float32   # of the weights it holds (fp32 or a 16-bit copy)
    ready: object = None        # event: the h2d copy into buf finished
    free_after: object = None   # event: the last compute that read buf finished
    read_back: object = None    # event: the last device->host copy that read buf finished
    pinned: bool = False        # in use by compute right now


class DeviceCache:
    """Slots for streamed blocks; see the module docstring.

    numels[g] is group g's size; versions[g] counts updates of group g's master (a slot
    whose version is stale must be reloaded).
    """

    def __init__(self, lanes: Lanes, numels: list[int], n_slots: int = 3):
        self.lanes = lanes
        dev = lanes.device
        block_max = max(numels[1:], default=0)
        self.slots = [_Slot(torch.empty(block_max, dtype=torch.float32, device=dev))
                      for _ in range(n_slots)]
        self.rest = torch.empty(numels[0], dtype=torch.float32, device=dev)
        self.rest_version = -1
        self.numels = numels
        self.versions = [0] * len(numels)
        self._tick = 0
        self._lru: dict[int, int] = {}
        self.max_in_flight = 0
        self.bytes_h2d = 0
        self.waits: list = []   # (before, after) event pairs around each stream wait

    def bytes(self) -> int:
        return sum(s.buf.numel() * 4 for s in self.slots) + self.rest.numel() * 4

    def _find(self, g: int, dtype=torch.float32) -> _Slot | None:
        for s in self.slots:
            if s.group == g and s.version == self.versions[g] and s.dtype == dtype:
                return s
        return None

    def holds(self, g: int, dtype) -> bool:
        """Whether a slot holds group g's current weights in `dtype`."""
        return self._find(g, dtype) is not None

    def _count_in_flight(self) -> None:
        n = sum(1 for s in self.slots if s.group >= 0 and s.version == self.versions[s.group])
        self.max_in_flight = max(self.max_in_flight, n)

    def prefetch(self, g: int, master: torch.Tensor, after=None) -> None:
        """Start copying group g's host weights into a slot (no-op if already there).

        master: the fp32 master or its 16-bit copy; the slot then holds that dtype. The
        caller must have ensured it is final (its pending CPU update done); `after` is the
        event of a pending device->host write of it, if any.
        """
        if g <= 0 or g >= len(self.numels) or self._find(g, master.dtype) is not None:
            return
        free = [s for s in self.slots if not s.pinned]
        if not free:
            return  # every slot is in use: acquire() will load it when one is released
        # Evict the least recently used free slot (buffer reuse: its old block is done).
        s = min(free, key=lambda s: self._lru.get(id(s), -1))
        if len(self.slots) > 3:
            # A slot just filled counts as used now: the runner loads several blocks ahead,
            # and the next prefetch must not evict this one before its block has run. (With
            # 3 slots each prefetched slot is acquired before the next prefetch: the
            # default path is left exactly as measured.)
            self._tick += 1
            self._lru[id(s)] = self._tick
        n = self.numels[g]
        with self.lanes.on(self.lanes.h2d):
            # Stream wait: the copy may not overwrite the slot before the compute that
            # last read it has finished.
            self.lanes.wait(self.lanes.h2d, s.free_after)
            # Stream wait: a device-side update made by the slot's last fill (deferred.py)
            # may still be copying the slot's updated weights to the host: the compute
            # stream's free_after does not cover that d2h read.
            self.lanes.wait(self.lanes.h2d, s.read_back)
            # Stream wait: a device-side update of g may still be writing the host master.
            self.lanes.wait(self.lanes.h2d, after)
            dst = s.buf if master.dtype == torch.float32 else s.buf.view(master.dtype)
            s.read_back = self.fill(g, dst[:n], master)
            s.ready = self.lanes.event(self.lanes.h2d)
        s.group, s.version, s.dtype = g, self.versions[g], master.dtype
        self.bytes_h2d += n * master.element_size()
        self._count_in_flight()

    def fill(self, g: int, dst: torch.Tensor, master: torch.Tensor):
        """Copy group g's host master into its device buffer (current stream: h2d).
        outcore.parallel overrides this: copy this rank's shard, then all-gather.
        Returns the event after which no other stream reads dst any more, if one does
        (deferred.py: the d2h copy of an update made in dst), else None."""
        dst.copy_(master, non_blocking=True)
        return None

    def acquire(self, g: int, master: torch.Tensor, after=None) -> torch.Tensor:
        """Group g's weights on the device (flat, in `master`'s dtype: the fp32 master or
        its 16-bit copy), usable on the compute stream."""
        s = self._find(g, master.dtype)
        if s is None:
            self.prefetch(g, master, after)
            s = self._find(g, master.dtype)
            if s is None:
                raise RuntimeError("outcore: no free device slot (internal error)")
        # Stream wait: compute may not read the slot before its h2d copy has landed.
        self.waits.append(self.lanes.timed_wait(self.lanes.compute, s.ready))
        s.pinned = True
        self._tick += 1
        self._lru[id(s)] = self._tick
        buf = s.buf if s.dtype == torch.float32 else s.buf.view(s.dtype)
        return buf[: self.numels[g]]

    def release(self, g: int, free_after=None) -> None:
        """Compute has enqueued its last use of group g's slot (or `free_after`: the event
        after which nothing reads it any more, e.g. a device->host copy of its update)."""
        for s in self.slots:
            if s.group == g and s.pinned:
                s.pinned = False
                s.free_after = free_after if free_after is not None else self.lanes.event()
                if free_after is not None:
                    # A device-side update's write-back reads the slot on the d2h stream
                    # until `free_after`. The next forward may use the slot again (a cache
                    # hit) and release it with only its compute event, so the read is kept
                    # here too, for the h2d copy that next overwrites the slot to wait on.
                    # Without it, a d2h stream running behind (session 6's 3b-16k with host
                    # copies: 14 B/param out per device block, 12 in) had the slot
                    # overwritten by another block while the old master was still being
                    # written from it: training went back to its initial loss.
                    s.read_back = free_after

    def updated_in_place(self, g: int, buf: torch.Tensor | None = None) -> None:
        """Group g was updated on the device, in `buf` (its slot, or rest's buffer): that
        buffer stays valid, any other copy of g is stale (None: every fp32 slot of g)."""
        self.versions[g] += 1
        if g == 0:
            self.rest_version = self.versions[0]
        for s in self.slots:
            if s.group == g:
                # Only the slot the update wrote is current. An older fp32 slot of g (left
                # from before g's AdamW moved to the device) or a 16-bit copy of the old
                # weights is stale; marking every fp32 slot current let the next pass find
                # an old one.
                same = buf is None or s.buf.data_ptr() == buf.data_ptr()
                s.version = self.versions[g] if s.dtype == torch.float32 and same else -1

    def acquire_rest(self, master: torch.Tensor, after=None) -> torch.Tensor:
        """The `rest` group on the device, reloaded when its master changed. `after`: the
        event of a device-side update's write-back of rest, which reads this buffer."""
        if self.rest_version != self.versions[0] and self.rest.numel():
            with self.lanes.on(self.lanes.h2d):
                # Stream wait: the reload overwrites the buffer that write-back reads.
                self.lanes.wait(self.lanes.h2d, after)
                self.fill(0, self.rest, master)
                ev = self.lanes.event(self.lanes.h2d)
            self.lanes.wait(self.lanes.compute, ev)  # stream wait: rest weights landed
            self.rest_version = self.versions[0]
            self.bytes_h2d += self.rest.numel() * 4
        return self.rest

    def invalidate(self, g: int) -> None:
        """Group g's master is about to change: any device copy of it is stale."""
        self.versions[g] += 1
