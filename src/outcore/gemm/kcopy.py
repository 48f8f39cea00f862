"""2-D copies between pinned host memory and a GPU by a kernel's own loads and stores.

The DMA engines move a 2-D region row by row, and narrow rows cross the H200's link slowly:
8 KiB rows at about 34 GB/s each way against 53 for contiguous ones (copy-rows-h200.json).
Pinned host memory is mapped into the device's address space (with unified addressing,
cudaHostRegister and cudaHostAlloc map it by default), so a kernel can read or write it
where it lies. On the H200 a Triton kernel of 16 programs moved 48-50 GB/s whatever the
row width, 4 to 128 KiB, either way (zcopy-h200.json, session 23); 8 programs already
reached 48. It costs those SMs while it runs, and beside a DMA the other way the pair moved
less in all than two DMAs (about 80 GB/s against 87-100), so callers use it only for rows
narrow enough that the DMA is far slower (copies.py).

    kcopy2d(dst, src, stream) -> bool   # False: not possible here, nothing enqueued

Without Triton, on a host side that is not mapped pinned memory, or where the first use's
check of a small copy fails, it answers False and the caller takes the DMA.
"""

from __future__ import annotations

import threading

import torch

PROGRAMS = 16          # the kernel's grid: enough to fill the link (8 did on the H200)
TILE_ROWS, TILE_COLS, WARPS = 8, 1024, 8

_lock = threading.Lock()
_ok: bool | None = None   # None: not probed yet

try:   # Triton ships with torch's CUDA builds; the CPU builds go without it
    import triton
    import triton.language as tl

    @triton.jit
    def _copy2d(src, dst, rows, cols, s_stride, d_stride, n_c, n_tiles,
                BR: tl.constexpr, BC: tl.constexpr):
        """dst[r, c] = src[r, c] over rows x cols (row strides in elements): program p
        copies BR x BC tiles p, p + grid, ... (a fixed grid leaves the other SMs to GEMMs)."""
        for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            r = (t // n_c) * BR + tl.arange(0, BR)[:, None]
            c = (t % n_c) * BC + tl.arange(0, BC)[None, :]
            m = (r < rows) & (c < cols)
            x = tl.load(src + r.to(tl.int64) * s_stride + c, mask=m)
            tl.store(dst + r.to(tl.int64) * d_stride + c, x, mask=m)
except ImportError:
    triton = None


def _shape_ok(dst: torch.Tensor, src: torch.Tensor) -> bool:
    if src.dtype != dst.dtype or src.shape != dst.shape or src.dim() != 2 or src.numel() == 0:
        return False
    if dst.is_cuda == src.is_cuda:
        return False
    return all(t.shape[1] == 1 or t.stride(1) == 1 for t in (dst, src))


def _launch(dst: torch.Tensor, src: torch.Tensor, stream) -> None:
    rows, cols = src.shape
    n_c = triton.cdiv(cols, TILE_COLS)
    n = triton.cdiv(rows, TILE_ROWS) * n_c
    dev = dst.device if dst.is_cuda else src.device
    with torch.cuda.device(dev), torch.cuda.stream(stream):
        _copy2d[(min(PROGRAMS, n),)](src, dst, rows, cols, src.stride(0), dst.stride(0),
                                     n_c, n, BR=TILE_ROWS, BC=TILE_COLS, num_warps=WARPS)


def _probe(device: torch.device) -> bool:
    """Copy a region of a pinned matrix in and back out by the kernel and compare."""
    try:
        src = torch.arange(3 * 2100, dtype=torch.float32).view(3, 2100).pin_memory()
        dev = torch.zeros(2, 1500, device=device)
        back = torch.zeros(3, 2100).pin_memory()
        stream = torch.cuda.current_stream(device)
        _launch(dev, src[1:3, 300:1800], stream)
        _launch(back[0:2, 1:1501], dev, stream)
        stream.synchronize()   # host sync: the probe's result is read right below
        want = torch.zeros(3, 2100)
        want[0:2, 1:1501] = src[1:3, 300:1800]
        return torch.equal(dev.cpu(), src[1:3, 300:1800]) and torch.equal(back, want)
    except Exception:  # noqa: BLE001 - any failure means "use the DMA"
        return False


def kcopy2d(dst: torch.Tensor, src: torch.Tensor, stream) -> bool:
    """Enqueue dst <- src on `stream` by the kernel: one side on a GPU, the other pinned
    host memory; both 2-D, same shape and dtype, unit inner stride. Returns False (nothing
    enqueued) where that is not possible here."""
    global _ok
    if triton is None or not _shape_ok(dst, src):
        return False
    if _ok is None:
        with _lock:
            if _ok is None:
                _ok = _probe(dst.device if dst.is_cuda else src.device)
    if not _ok:
        return False
    host = src if dst.is_cuda else dst
    if not host.is_pinned():
        return False
    try:
        _launch(dst, src, stream)
    except ValueError:   # Triton: "cannot be accessed" (host memory not mapped)
        return False
    return True


def available() -> bool | None:
    """True/False once probed, None before the first copy."""
    return None if _ok is None else _ok
