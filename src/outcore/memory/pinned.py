"""Pinned host memory.

Two ways to get page-locked memory, both exact in size:
- `pin_(t)`: register an existing CPU tensor's pages with CUDA (cudaHostRegister). Used for
  the fp32 master buffers, which are allocated once and live for the whole run. torch's own
  `pin_memory=True` goes through a caching allocator that rounds large requests up to a
  power of two (up to 2x the bytes): for tens of GB of weights that waste is not affordable.
- `PinnedPool`: reusable staging buffers (activation checkpoints, gradients) handed out by
  size and returned after use, so pinning (about 0.5 s per GiB) is paid once per run.

Without CUDA both fall back to ordinary memory, so the CPU path runs the same code.
"""

from __future__ import annotations

import ctypes
import resource
import threading
from collections import defaultdict

import torch

from ..errors import OutcoreError


def _cuda_ok() -> bool:
    return torch.cuda.is_available()


_REGISTER_MIN = 4 << 20  # below this, pages may be shared with other allocations


_REGISTERED: set[int] = set()   # storage pointers pin_ registered (unpin_ undoes only these)
# Reentrant: unpin_ also runs from weakref finalizers (gemm.Linear), which the garbage
# collector may start in this very thread while it holds the lock.
_REG_LOCK = threading.RLock()


def _loaded_cudart():
    """The CUDA runtime library this process loaded (torch's), by its path in
    /proc/self/maps, or None (Linux only; a torch that links it statically)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "libcudart.so" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)   # the same handle: dlopen of a loaded library
        except OSError:
            continue
    return None


def clear_cuda_error() -> None:
    """A failed cudart call also leaves its code as the runtime's last error, which the
    next kernel launch of the process would raise as its own: read it to clear it.
    torch.cuda.cudart() has no cudaGetLastError in torch 2.11 (an AttributeError there hid
    the real failure and left the error for the next kernel): the loaded library's own."""
    rt = torch.cuda.cudart()
    if hasattr(rt, "cudaGetLastError"):
        rt.cudaGetLastError()
        return
    lib = _loaded_cudart()
    if lib is not None:
        lib.cudaGetLastError()


def pin_(t: torch.Tensor) -> torch.Tensor:
    """Page-locked `t`: its own storage registered in place when large (no copy), else a
    pinned copy (small allocations can share pages with others, and registering a page
    twice fails). Use the returned tensor. No-op without CUDA or for empty tensors."""
    if not _cuda_ok() or t.numel() == 0 or t.is_pinned():
        return t
    nbytes = t.untyped_storage().nbytes()
    if nbytes < _REGISTER_MIN:
        return t.pin_memory()
    ptr = t.untyped_storage().data_ptr()
    rc = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    if int(rc) != 0:
        clear_cuda_error()
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with code {int(rc)}")
    with _REG_LOCK:
        _REGISTERED.add(ptr)
    return t


def unpin_(t: torch.Tensor) -> None:
    """Undo `pin_` (before the storage is freed). A tensor pin_ did not register (a pinned
    copy from torch's allocator, or one never pinned) is left alone."""
    if not _cuda_ok() or t.numel() == 0:
        return
    ptr = t.untyped_storage().data_ptr()
    with _REG_LOCK:
        if ptr not in _REGISTERED:
            return
        _REGISTERED.discard(ptr)
    if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
        clear_cuda_error()


def unpin_all(tensor_lists, pools) -> None:
    """Unregister what pin_ registered among `tensor_lists` (lists of tensors or None, read
    now: their entries may have been replaced since) and every buffer of `pools`. An owner
    of registered memory calls this before the memory can be freed: a freed range that is
    still registered makes a later cudaHostRegister of the same addresses fail (a second
    Engine in one process failed so on the H200)."""
    if not _cuda_ok():
        return
    with _REG_LOCK:
        if not _REGISTERED:
            return
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)   # host sync: no copy may still read or write these pages
    for ts in tensor_lists:
        for t in ts:
            if t is not None:
                unpin_(t)
    for pool in pools:
        pool.close()


class PinnedPool:
    """Pinned staging buffers, reused by (numel, dtype).

    `get(n, dtype)` -> a 1-d tensor of exactly n elements; `put(t)` returns it. Buffers are
    never freed while the pool lives: reuse is the point (pinning is slow).
    """

    def __init__(self, pin: bool = True):
        self.pin = pin and _cuda_ok()
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self._pending: list[tuple[object, torch.Tensor]] = []
        self._made: list[torch.Tensor] = []   # every buffer get() allocated (for close)
        # id()s of the buffers now returned (free or pending): a second put of one of them
        # would list it twice and get() would hand one buffer to two users. Those tensors are
        # referenced from _free/_pending, so their ids cannot be reused meanwhile.
        self._returned: set[int] = set()
        self.bytes_allocated = 0

    def _reclaim(self) -> None:
        # Buffer reuse: a returned buffer is free only once the copy that reads it is done.
        still = []
        for ev, t in self._pending:
            if ev is None or ev.query():
                self._free[(t.numel(), t.dtype)].append(t)
            else:
                still.append((ev, t))
        self._pending = still

    def get(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = (numel, dtype)
        with self._lock:
            self._reclaim()
            if self._free[key]:
                t = self._free[key].pop()
                self._returned.discard(id(t))
                return t
            self.bytes_allocated += numel * torch.empty((), dtype=dtype).element_size()
        t = torch.empty(numel, dtype=dtype)
        t = pin_(t) if self.pin else t
        with self._lock:
            self._made.append(t)
        return t

    def close(self) -> None:
        """Unregister every buffer this pool pinned in place and forget them all (the
        caller has synchronized: no copy uses them)."""
        with self._lock:
            made, self._made = self._made, []
            self._free.clear()
            self._pending = []
            self._returned.clear()
        for t in made:
            unpin_(t)

    def put(self, t: torch.Tensor, after=None) -> None:
        """Return `t`; with `after` (an event) it is reused only once that event is done."""
        with self._lock:
            if id(t) in self._returned:
                raise OutcoreError("PinnedPool.put: this buffer was already returned and not "
                                   "taken out again since: return each buffer once")
            self._returned.add(id(t))
            self._pending.append((after, t))


def host_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc), in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return host_peak_rss_bytes()


def host_peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
