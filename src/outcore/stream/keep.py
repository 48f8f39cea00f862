"""Device-updated blocks kept on the device, in the compute dtype, for the next forward.

A block whose AdamW runs on the device (device_update.py) has its updated fp32 weights in
its slot at the end of its backward; its master goes back to the host, and the next
forward loads it again (4 B/param over PCIe). The forward is the half of the step that
the link bounds (3b-16k on the H200: ~11 GB of fp32 block loads against ~0.19 s of
forward compute), while the backward has room on the link. So, right after a device
update, the block's weights are also cast into a compute-dtype tensor that stays on the
device until the next forward uses it (and frees it): that forward loads nothing for it.

Only blocks between the slots' ends are kept: the last `n_slots` blocks of backward stay in
their slots and the forward finds them there, and the last `n_slots` of forward stay in
theirs for the backward, which needs them in fp32 (keepable). Copies live from late
backward (few checkpoints held) to early forward, and take only what the budget leaves
beside the last step's peak without checkpoints (Engine._device_room): the checkpoints and
the kept copies share that room (the stash counts the copies against its limit, PeakWatch
counts them as held).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import OutcoreError


def check_option(v) -> bool:
    """Engine(keep_weights=...): True or False."""
    if not isinstance(v, bool):
        raise OutcoreError(f"keep_weights={v!r}: use True or False")
    return v


class KeptWeights:
    """offer(g, w32) after g's device update; take(g) in g's next forward; has(g).

    enabled: Engine(keep_weights=...), True by default (session 9's A/B on the H200 at
      compiled 3b-16k, outcore alone, one run: 0.877 s a step against 0.928 without).
    room: bytes the checkpoints and the copies may take on the device now (None: no
      budget, no limit); -1 while unknown (a budget but no measured step): keep nothing.
    """

    def __init__(self, engine):
        self.e = engine
        self.enabled = False
        self.room: Callable[[], int | None] = self._room
        self._kept: dict[int, tuple[torch.Tensor, int]] = {}
        self.bytes = 0
        self.used = 0   # blocks whose forward took a kept copy instead of a load, this step

    def _room(self) -> int | None:
        if self.e.gpu_memory is None:
            return None
        room = self.e._device_room()
        return -1 if room is None else room

    def capacity_blocks(self) -> int:
        """How many blocks' copies the room holds now (balance.py's model): all with no
        budget."""
        room = self.room()
        block = max((g.numel for g in self.e.groups[1:]), default=0)
        if room is None:
            return len(self.e.groups)
        size = block * self.e.compute_dtype.itemsize
        return max(0, room) // size if size else 0

    def keepable(self, g: int) -> bool:
        """Blocks 1..n_slots stay in their slots from backward to forward, and the last
        n_slots blocks of forward stay there for backward (which needs them in fp32): a
        copy of either would save no load."""
        n_slots = len(self.e.cache.slots)
        return n_slots < g <= len(self.e.groups) - 1 - n_slots

    def offer(self, g: int, w32: torch.Tensor) -> bool:
        """Keep a compute-dtype copy of block g's updated weights `w32` (flat, fp32, on the
        device, current on the compute stream) if it is beyond the slots and fits."""
        if not self.enabled or not self.keepable(g):
            return False
        self._forget(g)
        nbytes = w32.numel() * self.e.compute_dtype.itemsize
        room = self.room()
        if room is not None and self.e.stash.held_bytes() + nbytes > room:
            return False
        self.e.peaks.mark()   # the interval before the copy: the block's backward
        # Allocated and written on the compute stream, read there by the next forward and
        # freed after it: no other stream touches it.
        w = w32.to(self.e.compute_dtype, copy=True)
        self._kept[g] = (w, self.e.cache.versions[g])
        self.bytes += nbytes
        self.e.peaks.rebase()   # held from here on, not other work (peaks.py)
        return True

    def has(self, g: int) -> bool:
        kept = self._kept.get(g)
        return kept is not None and kept[1] == self.e.cache.versions[g]

    def take(self, g: int) -> torch.Tensor | None:
        """Block g's kept weights (flat, compute dtype) for its forward, forgotten here; None
        when none is kept or g's master changed since."""
        ok = self.has(g)
        w = self._forget(g)
        if ok:
            self.used += 1
            return w
        return None

    def _forget(self, g: int) -> torch.Tensor | None:
        kept = self._kept.pop(g, None)
        if kept is None:
            return None
        self.bytes -= kept[0].numel() * kept[0].element_size()
        return kept[0]

    def drop(self) -> None:
        """Forget every copy (a backward starts: those its forward did not use are stale
        after its updates; or the host weights were edited)."""
        self._kept.clear()
        self.bytes = 0
