"""One device allocation per product, carved into the plan's buffers.

    arena = Arena(device, plan.device_bytes() + Arena.slack(n_buffers))
    acc = arena.take(tile_m * tile_n, torch.float32)     # a 1-d view, 512-byte aligned

Why one allocation: gemm.Linear runs three products a step with three plans (forward NT,
dx NN, dW TN). Allocated buffer by buffer, each plan's sizes left the caching allocator
with segments the next plan could not reuse, and on the H200 an 8 GiB budget reserved
8.63 GB (7.68 GB allocated; gemm-linear-h200.json). One arena per product is one segment,
which the next product reuses (split) when it needs no more, and which is handed back
before a larger one is made.
"""

from __future__ import annotations

import threading

import torch

from ..memory import cached_unused_bytes, cuda_index as _index

ALIGN = 512   # bytes: every view starts on a boundary cuBLAS and the copy engines like

_lock = threading.Lock()


def largest_free_block(device: torch.device) -> int:
    """Bytes of the largest block the caching allocator holds freed on `device`: the
    largest allocation it can serve without a new segment (a snapshot of its segments,
    taken once per product)."""
    index = _index(device)
    best = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") != index:
            continue
        for block in seg.get("blocks", ()):
            if block.get("state") == "inactive":
                best = max(best, block.get("size", 0))
    return best


def _counts(device: torch.device) -> tuple | None:
    """The caching allocator's (reserved bytes, allocated bytes, allocations made so far)
    on `device`, or None before it has allocated anything."""
    st = torch.cuda.memory.memory_stats_as_nested_dict(device)
    if not st:
        return None
    return (st["reserved_bytes"]["all"]["current"], st["allocated_bytes"]["all"]["current"],
            st["allocation"]["all"]["allocated"])


# device index -> (bytes of the last arena freed there, _counts right after it was freed)
_FREED: dict = {}

# Whether _make_room may skip the snapshot where the last arena freed on the device holds
# the new one and nothing has been allocated or handed back since (False: a snapshot
# every product, the rule until session 27). The snapshot took 0.2 ms of each product's
# host time before its first copy (host-setup-h200*.json), 1% of an 18 ms bf16 product.
SKIP_SNAPSHOT = True


def _make_room(device: torch.device, nbytes: int) -> None:
    """Before a CUDA arena of `nbytes`: when the allocator caches freed blocks but none of
    them holds the arena, hand the cache back, so the new segment is not made beside them.

    Asked of the allocator each time, not remembered: session 9's GPU test of it failed
    (436 MB reserved against 256 MiB) when this kept the largest arena made so far in the
    process, and an earlier test's larger arena, long freed and handed back by the test's
    own empty_cache, hid that the next product's arena fit no cached block. What may be
    remembered is the last arena's own release (SKIP_SNAPSHOT): if since then the
    allocator has made no allocation and reserved and allocated bytes are as they were,
    that arena's freed block (merged with any freed neighbours) is still whole, and an
    arena no larger fits it. Anything else asks the snapshot."""
    with _lock:
        last = _FREED.pop(_index(device), None)
        if (SKIP_SNAPSHOT and last is not None and nbytes <= last[0]
                and _counts(device) == last[1]):
            return
        cached = cached_unused_bytes(device)
        if cached > 0 and largest_free_block(device) < nbytes:
            # Empties every unused cached block of the process, not only old arenas: they
            # would be reused, but an arena larger than all of them makes a new segment.
            torch.cuda.empty_cache()


class Arena:
    """`nbytes` on `device` (uninitialized), handed out front to back by take()."""

    def __init__(self, device: torch.device, nbytes: int):
        if device.type == "cuda":
            _make_room(device, nbytes)
        self.buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        self.used = 0

    def release(self) -> None:
        """Drop the arena (every view of it must be gone, or its memory stays allocated)
        and, on a GPU, note the allocator's counts for the next arena's _make_room."""
        device, nbytes = self.buf.device, self.buf.numel()
        self.buf = None
        if device.type == "cuda" and SKIP_SNAPSHOT:
            with _lock:
                _FREED[_index(device)] = (nbytes, _counts(device))

    @staticmethod
    def for_plan(device: torch.device, plan) -> "Arena":
        """The arena of one device running `plan` (a GemmPlan): its device_bytes() and the
        alignment of its views, one per slot and accumulator, a few more, and one per strip
        of the tail (each may take a block of its own rows: cache.py)."""
        return Arena(device, plan.device_bytes() + Arena.slack(
            plan.n_slots + plan.n_acc + 4 + plan.tail_tasks))

    @staticmethod
    def slack(n_buffers: int) -> int:
        """Bytes lost to alignment by `n_buffers` views at most."""
        return n_buffers * ALIGN

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """numel elements of `dtype`: a 1-d view into the arena. Raises when it is full (a
        plan whose device_bytes() undercounts its buffers)."""
        start = -(-self.used // ALIGN) * ALIGN
        end = start + numel * dtype.itemsize
        if end > self.buf.numel():
            raise RuntimeError(f"gemm arena: {end} bytes taken of {self.buf.numel()} (the plan "
                               "undercounts its device buffers)")
        self.used = end
        return self.buf[start:end].view(dtype)
