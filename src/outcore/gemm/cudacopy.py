"""2-D host<->device copies on a stream (cudaMemcpy2DAsync), through ctypes.

torch's `copy_` moves a strided region of a pinned host matrix by first making it
contiguous in pageable memory (slow, and the host blocks); the DMA engines can copy a
region with a row pitch directly. We call the CUDA runtime that torch already loaded
(found in /proc/self/maps), else the driver (libcuda.so.1, cuMemcpy2DAsync). The first use
checks the result of a small copy against torch; if anything is off, `copy2d` answers
False and callers stage through a contiguous pinned buffer instead.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from ..memory import clear_cuda_error

_H2D, _D2H = 1, 2
_lock = threading.Lock()
_impl = None          # None: not probed yet; False: unavailable; else a callable


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D (driver API, cuda.h)."""
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
    ]


def _loaded_lib(name: str) -> str | None:
    """Path of a shared library this process has already mapped, e.g. 'libcudart.so'."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip().split(" ")[-1]
                if "/" + name in path:
                    return path
    except OSError:
        pass
    return None


def _runtime():
    path = _loaded_lib("libcudart.so")
    if path is None:
        return None
    fn = ctypes.CDLL(path).cudaMemcpy2DAsync
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def call(dst, dpitch, src, spitch, width, height, kind, stream):
        return fn(dst, dpitch, src, spitch, width, height, kind, stream)
    return call


def _driver():
    fn = ctypes.CDLL("libcuda.so.1").cuMemcpy2DAsync_v2
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p]
    host, dev = 1, 2   # CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE

    def call(dst, dpitch, src, spitch, width, height, kind, stream):
        p = _Memcpy2D()
        p.srcPitch, p.dstPitch, p.WidthInBytes, p.Height = spitch, dpitch, width, height
        if kind == _H2D:
            p.srcMemoryType, p.srcHost, p.dstMemoryType, p.dstDevice = host, src, dev, dst
        else:
            p.srcMemoryType, p.srcDevice, p.dstMemoryType, p.dstHost = dev, src, host, dst
        return fn(ctypes.byref(p), stream)
    return call


def _geometry(t: torch.Tensor):
    """(pointer, pitch bytes, width bytes, rows) of a 2-D view with unit inner stride."""
    rows, cols = t.shape
    es = t.element_size()
    if cols > 1 and t.stride(1) != 1:
        return None
    if rows > 1 and t.stride(0) < cols:
        return None   # rows overlap (an expanded view, stride 0): no pitch describes it
    pitch = t.stride(0) * es if rows > 1 else cols * es
    return t.data_ptr(), pitch, cols * es, rows


def _probe(call, device: torch.device) -> bool:
    """Copy a 3x4 region of a pinned 5x7 matrix both ways and compare with torch."""
    try:
        src = torch.arange(35, dtype=torch.float32).view(5, 7).pin_memory()
        dev = torch.zeros(3, 4, device=device)
        back = torch.zeros(5, 7).pin_memory()
        stream = torch.cuda.current_stream(device)
        rc = _run(call, dev, src[1:4, 2:6], _H2D, stream)
        rc = rc or _run(call, back[2:5, 1:5], dev, _D2H, stream)
        stream.synchronize()  # host sync: the probe's result is read right below
        want = torch.zeros(5, 7)
        want[2:5, 1:5] = src[1:4, 2:6]
        if rc != 0:
            clear_cuda_error()
            return False
        return torch.equal(dev.cpu(), src[1:4, 2:6]) and torch.equal(back, want)
    except Exception:  # noqa: BLE001 - any failure means "use the staging path"
        return False


def _run(call, dst: torch.Tensor, src: torch.Tensor, kind: int, stream) -> int:
    d, s = _geometry(dst), _geometry(src)
    return call(d[0], d[1], s[0], s[1], s[2], s[3], kind, stream.cuda_stream)


def copy2d(dst: torch.Tensor, src: torch.Tensor, stream) -> bool:
    """Enqueue dst <- src on `stream` (one of them pinned host, the other on the device).

    Both 2-D, same shape and dtype, unit inner stride. Returns False (nothing enqueued)
    when that is not possible here; the caller then stages.
    """
    global _impl
    if src.dtype != dst.dtype or src.shape != dst.shape or src.numel() == 0:
        return False
    if _geometry(dst) is None or _geometry(src) is None:
        return False
    if _impl is None:
        with _lock:
            if _impl is None:
                found = False
                dev = dst.device if dst.is_cuda else src.device
                for make in (_runtime, _driver):
                    try:
                        call = make()
                    except (OSError, AttributeError):
                        call = None
                    if call is not None and _probe(call, dev):
                        found = call
                        break
                _impl = found
    if _impl is False:
        return False
    kind = _H2D if dst.is_cuda else _D2H
    rc = _run(_impl, dst, src, kind, stream)
    if rc != 0:
        clear_cuda_error()
        raise RuntimeError(f"2-D copy failed with CUDA error {rc}")
    return True


def available() -> bool | None:
    """True/False once probed, None before the first copy."""
    return None if _impl is None else _impl is not False
