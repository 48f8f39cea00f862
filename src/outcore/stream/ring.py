"""Fixed device buffers reused in turn, so large per-block transients never churn the
caching allocator (near the memory budget every churned allocation can become a retry:
a full device sync that drains the pipeline).
"""

from __future__ import annotations

import torch

from ..transfer import Lanes


class Ring:
    """n flat device buffers of `numel` elements; take() the next free one, give() it back.

    take(stream) makes `stream` wait (device-side) until the buffer's previous user is
    done with it; give(i, event) records when that will be. A buffer taken and not yet
    given back is never handed out again: takes need not come in the order of their gives
    (the m, v of backward's first device-updated block were taken after the next block's,
    and a ring of two then gave the third take the buffer still holding that block's m, v).
    """

    def __init__(self, lanes: Lanes, n: int, numel: int, dtype=torch.float32):
        self.lanes = lanes
        self.bufs = [torch.empty(numel, dtype=dtype, device=lanes.device) for _ in range(n)]
        self.free_after: list[object] = [None] * n
        self._next = 0
        self._held: set[int] = set()

    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.bufs)

    def take(self, stream=None) -> tuple[int, torch.Tensor]:
        n = len(self.bufs)
        i = next((j % n for j in range(self._next, self._next + n) if j % n not in self._held),
                 None)
        if i is None:
            raise RuntimeError(f"outcore: all {n} ring buffers are in use (internal error)")
        self._next = (i + 1) % n
        self._held.add(i)
        # Stream wait (buffer reuse): whoever read this buffer last must have finished.
        self.lanes.wait(stream if stream is not None else self.lanes.compute, self.free_after[i])
        self.free_after[i] = None
        return i, self.bufs[i]

    def give(self, i: int, event) -> None:
        self.free_after[i] = event
        self._held.discard(i)
