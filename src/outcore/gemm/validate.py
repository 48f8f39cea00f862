"""Argument checks for matmul: one-line errors that say what to change."""

from __future__ import annotations

import ctypes
import functools
import mmap
import numbers
import os

import numpy as np
import torch

from ..errors import OutcoreError
from ..memory import cached_unused_bytes
from ..units import fmt_bytes, parse_bytes
from .computes import COMPUTE, DEFAULT_COMPUTE

_TORCH_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_NP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
CPU_BUDGET = 256 << 20      # a CPU worker's "device memory" when gpu_memory is not given
GPU_RESERVE = 1 << 30       # left free on each GPU when gpu_memory is not given
# Taken from a given gpu_memory before planning: the cuBLAS workspaces of the worker's
# streams and the small allocations beside the plan's buffers come out of the same
# allocator. Without it the H200 reserved 8.63 GB against gpu_memory="8GiB" (8.59 GB) in
# bench/gemm_linear.py; 64 MiB is an inference from that 40 MB, not measured on its own.
CUDA_EXTRAS = 64 << 20
BUDGET_STEP = 64 << 20      # a default budget's granularity (_rounded)


def dtype_of(x) -> torch.dtype:
    if isinstance(x, np.ndarray):
        return torch.float32 if x.dtype == np.float32 else torch.float64
    return x.dtype


def check_matrix(x, name: str) -> None:
    """A host matrix: a CPU torch tensor or numpy array, 2-d, float32/float64 (bf16 torch)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{name} is on {x.device}: matmul multiplies host matrices; pass "
                            f"{name}.cpu(), or use torch.mm for matrices already on the GPU")
        if x.dtype not in _TORCH_DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}: use torch.float32, torch.float64 or "
                            "torch.bfloat16 (cast it with .float())")
        if x.layout != torch.strided or x.is_nested:
            kind = "nested" if x.is_nested else str(x.layout).replace("torch.", "")
            raise TypeError(f"{name} is a {kind} tensor: matmul multiplies dense matrices; pass "
                            f"{name}.to_dense() (or torch.sparse.mm for sparse products)")
    elif isinstance(x, np.ndarray):
        if x.dtype not in _NP_DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}: use numpy float32 or float64 (cast it "
                            "with .astype(np.float32))")
    else:
        raise TypeError(f"{name} is a {type(x).__name__}: pass a CPU torch.Tensor, a numpy array "
                        "or a numpy memmap")
    if x.ndim != 2:
        raise OutcoreError(f"{name} is {x.ndim}-d with shape {tuple(x.shape)}: matmul takes 2-d "
                           f"matrices; reshape it (e.g. {name}.reshape(-1, {name}.shape[-1]))")


def check_flag(value, name: str) -> bool:
    """transa / transb: a bool (numpy's too, or the ints 0 and 1)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral)
                                               and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}={value!r} is not a bool: pass {name}=True or {name}=False")


def check_scalar(value, name: str) -> float:
    """alpha / beta: a real number (numpy's too, or a one-element tensor or array)."""
    real = isinstance(value, numbers.Real)
    if isinstance(value, torch.Tensor):
        real = value.numel() == 1 and not value.is_complex()
    elif isinstance(value, np.ndarray):
        real = value.size == 1 and value.dtype.kind in "biuf"
    if not real:
        raise TypeError(f"{name}={value!r} is not a real number: pass a float such as "
                        f"{name}={1.0 if name == 'alpha' else 0.0}")
    return float(value)


def op_shape(x, trans: bool) -> tuple[int, int]:
    r, c = x.shape
    return (c, r) if trans else (r, c)


def _span(x) -> tuple[int, int]:
    """[lowest, highest) byte addresses x touches."""
    if isinstance(x, np.ndarray):
        ptr, es, strides = x.__array_interface__["data"][0], x.itemsize, x.strides
    else:
        ptr, es = x.data_ptr(), x.element_size()
        strides = [s * es for s in x.stride()]
    if 0 in tuple(x.shape):
        return 0, 0
    lo = hi = ptr
    for size, stride in zip(x.shape, strides):
        if stride > 0:
            hi += (size - 1) * stride
        else:
            lo += (size - 1) * stride
    return lo, hi + es


def _strides(x) -> tuple[int, ...]:
    """x's strides in bytes."""
    if isinstance(x, np.ndarray):
        return tuple(x.strides)
    return tuple(st * x.element_size() for st in x.stride())


def _self_overlaps(x) -> bool:
    """Could two elements of x share memory? Taken from the smallest stride up, each
    dimension's stride must clear the bytes the dimensions below it span (a layout this
    rejects without a shared element, such as interleaved strides, is not worth the risk
    of writing one element twice)."""
    es = x.itemsize if isinstance(x, np.ndarray) else x.element_size()
    extent = es
    for stride, size in sorted((abs(st), sz) for st, sz in zip(_strides(x), x.shape) if sz > 1):
        if stride < extent:
            return True
        extent += (size - 1) * stride
    return False


def check_out(out, m: int, n: int, dtype: torch.dtype, a, b) -> None:
    check_matrix(out, "out")
    if tuple(out.shape) != (m, n):
        raise OutcoreError(f"out has shape {tuple(out.shape)} but op(A) @ op(B) is {m}x{n}: pass "
                           f"an out of shape ({m}, {n})")
    if dtype_of(out) != dtype:
        raise TypeError(f"out has dtype {dtype_of(out)} but A and B are {dtype}: pass an out of "
                        f"dtype {dtype}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise OutcoreError("out is read-only (a memmap opened with mode 'r'?): open it with "
                           "mode 'r+' or 'w+'")
    if isinstance(out, torch.Tensor) and out.device.type == "cpu" and not _writable(out):
        raise OutcoreError("out's memory is read-only (torch.from_numpy of a memmap opened "
                           "with mode 'r'?): open it with mode 'r+' or 'w+'")
    if _self_overlaps(out):
        raise OutcoreError(f"out's elements share memory (strides {_strides(out)} for shape "
                           f"{tuple(out.shape)}, e.g. from expand or as_strided): pass an out whose "
                           "elements are distinct, e.g. out.contiguous() or a new array")
    lo, hi = _span(out)
    where = _file_span(out)
    for x, name in ((a, "A"), (b, "B")):
        xlo, xhi = _span(x)
        if lo < xhi and xlo < hi and hi > lo:
            raise OutcoreError(f"out overlaps {name} in memory: tiles of out would overwrite "
                               f"{name} while it is read; pass a separate out")
        other = _file_span(x)
        if where and other and where[0] == other[0] and where[1] < other[2] \
                and other[1] < where[2]:
            raise OutcoreError(f"out overlaps {name} in the file {where[0]} (two memmaps of "
                               f"it): tiles of out would overwrite {name} while it is read; "
                               "pass an out in another file or another part of it")


def _writable(t: torch.Tensor) -> bool:
    """Can the process write t's first and last bytes? torch.from_numpy of a read-only
    memmap gives a tensor whose writes fault (a segfault, not an exception), so the kernel
    is asked instead: read(2) from a pipe into an address returns EFAULT where a store
    would fault. Each probed byte is written back with its own value. True where the
    probe cannot run (no libc, not Linux)."""
    lo, hi = _span(t)
    if hi <= lo:
        return True
    libc = _libc()
    if libc is None:
        return True
    r, w = os.pipe()
    try:
        for addr in {lo, hi - 1}:
            os.write(w, ctypes.string_at(addr, 1))   # its own value: reading is allowed
            if libc.read(r, ctypes.c_void_p(addr), 1) != 1:
                return False
    finally:
        os.close(r)
        os.close(w)
    return True


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
        libc.read.restype = ctypes.c_ssize_t
        return libc
    except (OSError, AttributeError):
        return None


def _file_span(x) -> tuple[str, int, int] | None:
    """(file, first byte, last byte + 1) of the file a numpy memmap maps x's elements
    from; None for memory that is no mapped file. Two memmaps of one file have different
    addresses, so _span alone cannot see them overlap."""
    mm = getattr(x, "_mmap", None)
    if not isinstance(x, np.memmap) or mm is None or not x.filename:
        return None
    try:
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data   # where the mapping starts
    except (TypeError, ValueError):   # a closed mapping: numpy reads no more from it
        return None
    start = x.offset - x.offset % mmap.ALLOCATIONGRANULARITY   # the mapping's file position
    lo, hi = _span(x)
    return os.path.realpath(x.filename), start + lo - base, start + hi - base


def resolve_compute(compute, dtype: torch.dtype) -> str:
    if compute is None:
        return DEFAULT_COMPUTE[dtype]
    name = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16"}.get(str(compute), compute)
    if not isinstance(name, str) or name not in COMPUTE:
        raise OutcoreError(f"compute={compute!r} is not one of {', '.join(COMPUTE)}: pick the "
                           "arithmetic (bf16 and tf32 accumulate in fp32)")
    return name


def resolve_devices(devices) -> list[torch.device]:
    """None -> every GPU, or the CPU when there is none; else an int, 'cuda:1', 'cpu',
    '0,1', a torch.device or a list of those (the CPU may be listed more than once: each
    entry is one worker)."""
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices is None:
        return [torch.device("cuda", i) for i in range(n_gpu)] or [torch.device("cpu")]
    if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
        devices = int(devices)   # numpy's integers too
    if not isinstance(devices, (str, int, torch.device, list, tuple)):
        raise OutcoreError(f"devices={devices!r} is not a device: use 'cpu', 'cuda:0', 0, "
                           "'0,1' or a list like [0, 1]")
    if isinstance(devices, (str, int, torch.device)):
        devices = [d for d in str(devices).split(",") if d.strip()] if isinstance(
            devices, str) else [devices]
    out: list[torch.device] = []
    for d in devices:
        try:
            if isinstance(d, str) and d.strip().isdigit():
                d = int(d)
            dev = torch.device("cuda", d) if isinstance(d, int) else torch.device(
                d.strip() if isinstance(d, str) else d)
        except (RuntimeError, TypeError, ValueError):
            raise OutcoreError(f"device {d!r} is not a device: use 'cpu', 'cuda:0', 0 or a list "
                               "like [0, 1]") from None
        if dev.type == "cuda":
            if dev.index is None:
                dev = torch.device("cuda", 0)
            if dev.index >= n_gpu:
                raise OutcoreError(f"device {dev} does not exist ({n_gpu} GPU(s) visible): pick "
                                   "one of them, or leave devices out (every GPU, else the CPU)")
            if dev in out:
                raise OutcoreError(f"device {dev} is listed twice: list each GPU once")
        elif dev.type != "cpu":
            raise OutcoreError(f"device {dev} is not supported: use CUDA GPUs or 'cpu'")
        out.append(dev)
    if not out:
        raise OutcoreError("devices is empty: pass None (all GPUs) or at least one device")
    return out


def _rounded(budget: int) -> int:
    """A default budget rounded down to BUDGET_STEP: free memory moves by a few MiB with
    cuBLAS workspaces and the driver's own allocations, and plans are remembered per
    budget, so an unrounded one could make the planner search again before a product's
    first copy (5-15 ms of host time at 32768)."""
    return budget - budget % BUDGET_STEP if budget > 16 * BUDGET_STEP else budget


def resolve_budget(gpu_memory, devices: list[torch.device]) -> int:
    """Bytes one device may use for tiles and cache: the smallest over the GPUs (a CPU
    worker next to GPUs takes theirs; it allocates only the blocks it touches)."""
    given = parse_bytes(gpu_memory, "gpu_memory")
    budgets = []
    for d in devices:
        if d.type == "cuda":
            # Free to this process: what the driver has free and what torch's allocator
            # holds cached but unused (the last product's arena, among others). Counting
            # the driver's figure alone, the budget shrank after each first product by its
            # arena, and the next call searched a plan again for a smaller device. (Session
            # 11 saw the first timed product after a warm-up run 7-50% slower than the ones
            # after it; whether this was the cause is not measured.)
            free = torch.cuda.mem_get_info(d)[0] + cached_unused_bytes(d)
            if given is not None and given > free:
                raise OutcoreError(f"gpu_memory={fmt_bytes(given)} but {d} has only "
                                   f"{fmt_bytes(free)} free: lower gpu_memory")
            budgets.append(max(given - CUDA_EXTRAS, given // 2) if given is not None else
                           _rounded(int(max(free - GPU_RESERVE, free // 2) * 0.9)))
    if not budgets:
        return given if given is not None else CPU_BUDGET
    return min(budgets)
