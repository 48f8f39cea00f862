"""Column strips of a row-major host B, packed by a host thread into one pinned buffer.

    B: K x N in storage order (row-major); strips [(c0, c1), ...]: strip s becomes a
    contiguous K x (c1 - c0) matrix, the strips one after another in the buffer

A TN product's last tile in column strips (lone.by_columns) loads each strip's own
columns of B (loads.py): rows as wide as the strip, 8 KiB for 2048 of 16384 fp32 columns,
which the link moves at 32-48 GB/s inside products (session 24's traces) against 55 for
contiguous copies. Packed, every piece of a strip is one contiguous copy. The thread
starts with the product and packs strip by strip while the first tile's copies run; a
strip's first load waits for its pack (`source`, a host wait).

Pinning costs ~0.5 s per GiB, more than such a product takes: the buffer comes from the
staging pool only when the pool already holds one of its size. The first product of a
shape copies its strips as they lie and a thread pins a buffer for the next one.
"""

from __future__ import annotations

import threading

import torch

from ..memory import PinnedPool
from .hostmat import HostMatrix

# Whether a lone device packs a TN plan's column strips (False: it copies them as they lie
# in B, for bench A/Bs)
PACK_STRIPS = True
# The most pinned bytes one product's packed strips may take (the pool keeps them)
PACK_MAX_BYTES = 1 << 30


class StripPacker:
    """Packs `spans` of B's columns (all K rows) in a thread; see the module docstring."""

    def __init__(self, b: HostMatrix, spans: list[tuple[int, int]], pool: PinnedPool):
        self.b, self.spans, self.pool = b, list(spans), pool
        k = b.shape[0]
        numel = k * sum(c1 - c0 for c0, c1 in self.spans)
        self.packed_bytes = 0
        self.error: BaseException | None = None
        self.ready = {s: threading.Event() for s in self.spans}
        self.buf = pool.take(numel, b.dtype)
        self.views: dict[tuple[int, int], torch.Tensor] = {}
        if self.buf is None:
            # Pinned for the next product of this shape; this one copies B as it lies. Not
            # joined: the product does not wait for the pinning.
            def pin():
                pool.put(pool.get(numel, b.dtype))
            self.thread = None
            threading.Thread(target=pin, name="outcore-gemm-pin", daemon=True).start()
            return
        off = 0
        for c0, c1 in self.spans:
            w = c1 - c0
            self.views[(c0, c1)] = self.buf[off:off + k * w].view(k, w)
            off += k * w
        self.thread = threading.Thread(target=self._pack, name="outcore-gemm-pack",
                                       daemon=True)
        self.thread.start()

    @staticmethod
    def worth(b: HostMatrix, spans: list[tuple[int, int]]) -> bool:
        """B is a torch-viewable row-major matrix and its strips fit PACK_MAX_BYTES."""
        cols = sum(c1 - c0 for c0, c1 in spans)
        return (PACK_STRIPS and b.t is not None and b.rowmajor
                and b.shape[0] * cols * b.itemsize <= PACK_MAX_BYTES)

    def _pack(self) -> None:
        try:
            for c0, c1 in self.spans:
                self.views[(c0, c1)].copy_(self.b.t[:, c0:c1])
                self.ready[(c0, c1)].set()
        except BaseException as e:  # noqa: BLE001 - re-raised by source/close
            self.error = e
            for ev in self.ready.values():
                ev.set()

    def source(self, span: tuple[int, int]) -> tuple[HostMatrix, tuple[int, int]] | None:
        """(the packed strip as a HostMatrix, its origin (0, c0) in B) once the thread has
        packed it; None where nothing is packed (no buffer this product, or not a strip)."""
        view = self.views.get(span)
        if view is None:
            return None
        self.ready[span].wait()   # host wait: the thread has packed this strip
        if self.error is not None:
            raise self.error
        self.packed_bytes += view.numel() * view.element_size()
        return HostMatrix(view, "B (packed)"), (0, span[0])

    def close(self) -> None:
        """After the device is done with the buffer (the caller synchronized)."""
        if self.thread is not None:
            self.thread.join()
            # Buffer reuse: no copy reads it any more, the next product may take it.
            self.pool.put(self.buf)
            self.thread = None
        if self.error is not None:
            raise self.error
