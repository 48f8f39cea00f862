"""Moving 2-D regions between a HostMatrix and one device, on that device's copy streams.

Fast path: a region of a pinned, row-major host matrix is copied by DMA directly (one 2-D
copy). Otherwise the region goes through a pinned staging buffer: a host memcpy in the
calling thread, then the DMA, for inputs; the DMA, then a host memcpy in a writer thread,
for the output (so the thread issuing GPU work never waits for a copy to finish).

On the CPU every copy is a plain synchronous `copy_`.
"""

from __future__ import annotations

import queue
import threading

import torch

from ..memory import PinnedPool
from ..transfer import Lanes, host_wait
from .cudacopy import copy2d
from .hostmat import HostMatrix
from .threadmode import caller_mode

_POOL: PinnedPool | None = None
_POOL_LOCK = threading.Lock()


def staging_pool() -> PinnedPool:
    """The process-wide pool of pinned staging buffers (pinning is paid once per size)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = PinnedPool()
        return _POOL


def _direct(dst: torch.Tensor, src: torch.Tensor, stream) -> bool:
    """Enqueue dst <- src as one DMA on the current (copy) stream if that is possible."""
    if dst.is_contiguous() and src.is_contiguous():
        dst.copy_(src, non_blocking=True)
        return True
    return copy2d(dst, src, stream)


def _enqueue(dst: torch.Tensor, src: torch.Tensor, stream) -> None:
    """dst <- src where one side is a contiguous pinned staging buffer: torch copies a
    strided device side through a device temporary if the 2-D DMA is unavailable."""
    if not _direct(dst, src, stream):
        dst.copy_(src, non_blocking=True)


class Copier:
    """Copies for one device worker; counts bytes in `stats` (a DeviceStats)."""

    def __init__(self, lanes: Lanes, stats, stage_numel: int):
        self.lanes = lanes
        self.stats = stats
        self.pool = staging_pool() if lanes.cuda else None
        self.stage_numel = stage_numel
        self._writer: _Writer | None = None

    def _staging(self, shape, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        n = shape[0] * shape[1]
        base = self.pool.get(max(n, self.stage_numel), dtype)
        return base, base[:n].view(shape)

    def h2d(self, dst: torch.Tensor, host: HostMatrix, region) -> None:
        """dst (device, host dtype) <- host[region], enqueued on the h2d stream."""
        L = self.lanes
        self.stats.h2d_bytes += dst.numel() * dst.element_size()
        if not L.cuda:
            host.read_into(region, dst)
            return
        with L.on(L.h2d):
            src = host.direct(*region)
            if src is not None and _direct(dst, src, L.h2d):
                return
            base, buf = self._staging(tuple(dst.shape), host.dtype)
            host.read_into(region, buf)   # host memcpy into pinned memory (this thread waits)
            self.stats.staged_bytes += buf.numel() * buf.element_size()
            _enqueue(dst, buf, L.h2d)
            # Buffer reuse: the pool hands `base` out again only after this DMA read it.
            self.pool.put(base, after=L.event(L.h2d))

    def d2h(self, host: HostMatrix, region, src: torch.Tensor, ready):
        """host[region] <- src (device) once `ready` (an event) is done; returns the d2h event
        after which `src` may be overwritten."""
        L = self.lanes
        self.stats.d2h_bytes += src.numel() * src.element_size()
        if not L.cuda:
            host.write_from(region, src)
            return None
        with L.on(L.d2h):
            L.wait(L.d2h, ready)   # stream wait: the tile is final before it is copied out
            dst = host.direct(*region)
            if dst is not None and _direct(dst, src, L.d2h):
                return L.event(L.d2h)
            base, buf = self._staging(tuple(src.shape), host.dtype)
            _enqueue(buf, src, L.d2h)
            done = L.event(L.d2h)
            self.stats.staged_bytes += buf.numel() * buf.element_size()
            if self._writer is None:
                self._writer = _Writer(self.pool)
            self._writer.put(done, base, buf, host, region)
            return done

    def close(self) -> None:
        """Wait until every staged output tile is in host memory."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _Writer:
    """A thread that moves staged output tiles into the host matrix, in order."""

    def __init__(self, pool: PinnedPool):
        self.pool = pool
        # at most two tiles waiting: the issuing thread blocks here if the host copy lags
        self.q: queue.Queue = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.mode = caller_mode()
        self.thread = threading.Thread(target=self._loop, name="outcore-gemm-writer",
                                       daemon=True)
        self.thread.start()

    def put(self, event, base, buf, host: HostMatrix, region) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((event, base, buf, host, region))

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            event, base, buf, host, region = item
            try:
                host_wait(event)   # host sync: the d2h copy into the staging buffer is done
                with self.mode():
                    host.write_from(region, buf)
            except BaseException as e:  # noqa: BLE001 - re-raised by put/close
                self.error = e
            # Buffer reuse: the host copy above has read it, nothing on the GPU touches it.
            self.pool.put(base)

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
