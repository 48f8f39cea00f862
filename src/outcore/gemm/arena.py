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

ALIGN = 512   # bytes: every view starts on a boundary cuBLAS and the copy engines like

_lock = threading.Lock()
_largest: dict[torch.device, int] = {}   # per GPU: the largest arena made since the last release


def _make_room(device: torch.device, nbytes: int) -> None:
    """Before a CUDA arena of `nbytes`: if an earlier, smaller arena sits freed in the
    allocator's cache, hand the cache back, so the new segment is not made beside it."""
    with _lock:
        if _largest.get(device, 0) < nbytes:
            if 0 < _largest.get(device, 0) and \
                    torch.cuda.memory_reserved(device) > torch.cuda.memory_allocated(device):
                # Empties every unused cached block of the process, not only the old arena's:
                # they would be reused, but an arena larger than any of them makes a new one.
                torch.cuda.empty_cache()
            _largest[device] = nbytes


class Arena:
    """`nbytes` on `device` (uninitialized), handed out front to back by take()."""

    def __init__(self, device: torch.device, nbytes: int):
        if device.type == "cuda":
            _make_room(device, nbytes)
        self.buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        self.used = 0

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
