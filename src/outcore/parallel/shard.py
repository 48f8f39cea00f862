"""Host state sharded over ranks, and device slots filled by shard copy + all-gather.

Group g (n_g elements) is padded to P_g = ceil(n_g / N) * N; rank r holds the fp32 master
(and, in the optimizer, AdamW m and v) of elements [r * P_g/N, (r+1) * P_g/N) only, so
the host holds 12 / N bytes per parameter per rank, plus O(largest block) of staging.
The user's Parameters are left as 4-byte placeholders of the right shape (stride 0):
`engine.model` gathers the real weights on request.
"""

from __future__ import annotations

import torch

from ..memory import PinnedPool, pin_
from ..stream.device import DeviceCache
from ..stream.materialize import Fill, repoint


def padded(numel: int, world: int) -> int:
    return -(-numel // world) * world


def placeholder(p: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like p that holds one element (the real weights live in shards)."""
    return torch.zeros((), dtype=p.dtype).expand(p.shape)


def _values(p: torch.Tensor, name: str, fill: Fill | None) -> torch.Tensor:
    """p's values, flat: its own, or made by fill (a temporary of p's size)."""
    if fill is None or not p.is_meta:   # a real parameter of a partly lazy model too
        return p.detach().reshape(-1)
    t = torch.empty(p.shape, dtype=torch.float32)
    fill(name, t)
    return t.reshape(-1)


class ShardedHost:
    """master[g]: P_g / N fp32 (this rank's slice, pinned on CUDA); see module docstring."""

    def __init__(self, groups, rank: int, world: int, pin: bool, fill: Fill | None = None):
        """fill: given for a model built on the meta device (stream/materialize.py): each
        parameter this rank keeps a slice of is made real alone, sliced, and dropped."""
        self.groups, self.rank, self.world, self.pin = groups, rank, world, pin
        self.padded = [padded(g.numel, world) for g in groups]
        self.master: list[torch.Tensor] = []
        for g, P in zip(groups, self.padded):
            s = P // world
            lo, hi = rank * s, rank * s + s
            shard = torch.zeros(s, dtype=torch.float32)
            for name, p, off in zip(g.names, g.params, g.offsets):
                a, b = max(off, lo), min(off + p.numel(), hi)
                if a < b:
                    shard[a - lo:b - lo].copy_(_values(p, name, fill)[a - off:b - off])
                repoint(p, placeholder(p))  # frees the full copy: only the shard stays
            self.master.append(pin_(shard) if pin and s else shard)
        self.grad_pool = PinnedPool(pin=pin)
        self.copy = [None] * len(groups)   # no 16-bit copies of shards (Engine checks)

    def refresh(self, g: int) -> None:
        """Nothing to bring up to date: shards keep no 16-bit copies."""

    def adopt_rebound(self, g: int) -> None:
        """Nothing to adopt: ShardedEngine takes what .model handed out (edited in place or
        rebound) into the shards before the step (ShardedEngine._take_edits)."""

    def bounds(self, g: int) -> tuple[int, int]:
        """[lo, hi) of this rank's slice of group g's padded flat buffer."""
        s = self.padded[g] // self.world
        return self.rank * s, self.rank * s + s

    @property
    def numel(self) -> int:
        return sum(g.numel for g in self.groups)

    def bytes(self) -> int:
        return sum(m.numel() * 4 for m in self.master) + self.grad_pool.bytes_allocated


class ShardedCache(DeviceCache):
    """DeviceCache whose slots hold padded groups, filled by shard h2d copy + all-gather.

    The copy (1/N of the block over this GPU's PCIe link) runs on the h2d stream; the
    all-gather (NVLink on one machine) is issued from the compute stream after waiting for
    that copy, so every collective of this rank goes through one stream in one order (two
    streams issuing on one NCCL communicator can deadlock). Compute reads the slot after
    the gather by stream order.
    """

    def __init__(self, lanes, numels: list[int], comm):
        super().__init__(lanes, numels)
        self.comm = comm
        self.bytes_h2d_shard = 0

    def fill(self, g: int, dst: torch.Tensor, master: torch.Tensor) -> None:
        own = dst.chunk(self.comm.world)[self.comm.rank] if dst.numel() else dst
        own.copy_(master, non_blocking=True)
        self.bytes_h2d_shard += master.numel() * 4
        if not self.lanes.cuda:
            self.comm.all_gather(dst)
            return
        landed = self.lanes.event(self.lanes.h2d)
        with self.lanes.on(self.lanes.compute):
            self.lanes.wait(self.lanes.compute, landed)  # stream wait: this rank's shard
            self.comm.all_gather(dst)
