"""HostStore: pinned host memory for swapped tensors, reused across steps and shapes.

Memory is reserved in slabs (`slab_bytes` each, or one request's size when larger) and
pinned once (outcore.memory.pin_: about 0.5 s per GiB, so never per step). A request gets
a run: a byte range of one slab, rounded up to `granule` bytes, first fit. Runs of any size
reuse freed space, so a new batch size (whose tensors all have new shapes) does not pin
anew; outcore.memory.PinnedPool keys buffers by exact shape and would. `release()` unpins
and drops the slabs (cudaHostUnregister before the free, so no pages stay locked).

Without CUDA the slabs are ordinary memory and the same code runs.
"""

from __future__ import annotations

import bisect
import threading

import torch

from ..errors import OutcoreError
from ..memory import pin_, unpin_
from ..transfer import host_wait
from ..units import fmt_bytes, parse_bytes

GRANULE = 64 * 1024


class Run:
    """A byte range [offset, offset + nbytes) of one slab, handed out by HostStore.alloc."""

    __slots__ = ("slab", "offset", "nbytes")

    def __init__(self, slab: "_Slab", offset: int, nbytes: int):
        self.slab, self.offset, self.nbytes = slab, offset, nbytes

    def view(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """numel elements of dtype at the start of this run (offset is granule aligned)."""
        nb = numel * torch.empty((), dtype=dtype).element_size()
        return self.slab.data[self.offset:self.offset + nb].view(dtype)


class _Slab:
    def __init__(self, nbytes: int, pin: bool):
        self.data = torch.empty(nbytes, dtype=torch.uint8)
        self.pinned = pin
        if pin:
            try:
                locked = pin_(self.data)
                if locked is not self.data:   # small: a pinned copy torch's allocator owns
                    self.data, self.pinned = locked, False
            except RuntimeError:  # registration refused: let CUDA allocate pinned pages
                self.data = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                self.pinned = False  # torch's pinned allocator owns (and frees) these
        self.nbytes = nbytes
        self.free: list[list[int]] = [[0, nbytes]]   # sorted [offset, length] holes
        self.used = 0

    def take(self, n: int) -> int | None:
        for i, (off, length) in enumerate(self.free):
            if length >= n:
                if length == n:
                    self.free.pop(i)
                else:
                    self.free[i] = [off + n, length - n]
                self.used += n
                return off
        return None

    def give(self, off: int, n: int) -> None:
        self.used -= n
        i = bisect.bisect_left(self.free, [off, 0])
        self.free.insert(i, [off, n])
        # Merge with the right neighbour, then with the left one.
        if i + 1 < len(self.free) and off + n == self.free[i + 1][0]:
            self.free[i][1] += self.free.pop(i + 1)[1]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:
            self.free[i - 1][1] += self.free.pop(i)[1]

    def drop(self) -> None:
        if self.pinned:
            unpin_(self.data)
        self.data = None


class HostStore:
    """Runs of pinned host memory; see the module docstring.

    alloc(n) -> Run; free(run, after=event) returns it once `event` (the last copy that
    reads or writes it) is done. Thread-safe: backward frees runs from autograd's thread.
    """

    def __init__(self, slab_bytes: int = 256 * 1024**2, limit: int | None = None,
                 pin: bool | None = None, granule: int = GRANULE):
        # Sizes as outcore.swap takes them (bytes or "256MiB"), refused here in one line
        # rather than by a comparison deep inside the first forward.
        for name, value in (("slab_bytes", slab_bytes), ("granule", granule)):
            if value is None:
                raise OutcoreError(f"HostStore {name}=None is not a size: give bytes or a "
                                   "string such as '256MiB'")
        self.slab_bytes = parse_bytes(slab_bytes, "slab_bytes")
        self.limit = parse_bytes(limit, "limit")
        self.pin = torch.cuda.is_available() if pin is None else (pin and torch.cuda.is_available())
        self.granule = parse_bytes(granule, "granule")
        self._slabs: list[_Slab] = []
        self._pending: list[tuple[object, Run]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.reserved_bytes = 0
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0

    def _round(self, n: int) -> int:
        return max(self.granule, -(-n // self.granule) * self.granule)

    def _reclaim(self, block: bool = False) -> None:
        # Buffer reuse: a run is free only once the copy that last touched it is done.
        still = []
        for ev, run in self._pending:
            if block and ev is not None:
                host_wait(ev)  # host sync: make room under the host limit (or release)
            if ev is None or ev.query():
                self._give(run)
            else:
                still.append((ev, run))
        self._pending = still

    def _give(self, run: Run) -> None:
        run.slab.give(run.offset, run.nbytes)
        self.in_use_bytes -= run.nbytes
        if self._closed and run.slab.used == 0:
            self._drop(run.slab)

    def _drop(self, slab: _Slab) -> None:
        if slab in self._slabs:
            self._slabs.remove(slab)
            self.reserved_bytes -= slab.nbytes
            slab.drop()

    def alloc(self, nbytes: int) -> Run:
        """A run of at least nbytes (rounded up to the granule); grows by one slab if needed."""
        n = self._round(nbytes)
        with self._lock:
            self._closed = False  # in use again: keep slabs for reuse
            self._reclaim()
            run = self._fit(n)
            if run is None and self._pending and self.limit is not None \
                    and self.reserved_bytes + max(n, self.slab_bytes) > self.limit:
                self._reclaim(block=True)
                run = self._fit(n)
            if run is None:
                size = max(n, self.slab_bytes)
                if self.limit is not None and self.reserved_bytes + size > self.limit:
                    size = n
                if self.limit is not None and self.reserved_bytes + size > self.limit:
                    raise OutcoreError(
                        f"swapping needs more than host_memory={fmt_bytes(self.limit)} of pinned "
                        f"host memory ({fmt_bytes(self.in_use_bytes)} in use, "
                        f"{fmt_bytes(nbytes)} more asked): raise host_memory or lower the batch")
                slab = _Slab(size, self.pin)
                self._slabs.append(slab)
                self.reserved_bytes += size
                run = Run(slab, slab.take(n), n)
            self.in_use_bytes += n
            self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
            return run

    def _fit(self, n: int) -> Run | None:
        for slab in self._slabs:
            off = slab.take(n)
            if off is not None:
                return Run(slab, off, n)
        return None

    def free(self, run: Run, after=None) -> None:
        """Return `run`; with `after` (an event) it is reused only once that event is done."""
        with self._lock:
            if after is None:
                self._give(run)
            else:
                self._pending.append((after, run))

    def release(self) -> None:
        """Wait for pending copies, unpin and drop every free slab.

        Slabs still holding runs (a graph not yet backpropagated) are dropped when their
        last run comes back, unless the store is used again before that.
        """
        with self._lock:
            self._reclaim(block=True)
            self._closed = True
            for slab in [s for s in self._slabs if s.used == 0]:
                self._drop(slab)
        if self.pin and hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()  # pages of slabs torch pinned for us (fallback)

    @property
    def slabs(self) -> int:
        return len(self._slabs)
