"""Fixed device buffers reused in turn, so large per-block transients never churn the
caching allocator (near the memory budget every churned allocation can become a retry:
a full device sync that drains the pipeline).
"""

from __future__ import annotations

import torch

from ..transfer import Lanes


class Ring:
    """n flat device buffers of `numel` elements; take() the next, give() it back.

    take(stream) makes `stream` wait (device-side) until the buffer's previous user is
    done with it; give(i, event) records when that will be.
    """

    def __init__(self, lanes: Lanes, n: int, numel: int, dtype=torch.float32):
        self.lanes = lanes
        self.bufs = [torch.empty(numel, dtype=dtype, device=lanes.device) for _ in range(n)]
        self.free_after: list[object] = [None] * n
        self._next = 0

    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.bufs)

    def take(self, stream=None) -> tuple[int, torch.Tensor]:
        i = self._next
        self._next = (i + 1) % len(self.bufs)
        # Stream wait (buffer reuse): whoever read this buffer last must have finished.
        self.lanes.wait(stream if stream is not None else self.lanes.compute, self.free_after[i])
        self.free_after[i] = None
        return i, self.bufs[i]

    def give(self, i: int, event) -> None:
        self.free_after[i] = event
