"""cuBLASXt through ctypes: the peer the benchmarks compare with (never used by matmul).

cuBLASXt multiplies host matrices on several GPUs with a static round-robin of
blockDim x blockDim tiles; it has SGEMM and DGEMM only (no tf32, no bf16). Its API is
column-major; a row-major C = op(A) @ op(B) is the column-major C.T = op(B).T @ op(A).T, so
the operands are passed swapped (`colmajor_args`).

    with CublasXt([0, 1], block_dim=4096) as xt:
        xt.gemm(A, B, C)      # pinned CPU tensors, float32 or float64, row-major
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

import torch

from .cudacopy import _loaded_lib

_OP_N, _OP_T = 0, 1


def find_libcublas() -> str:
    """Path of libcublas: the one torch loaded, else the nvidia-cublas wheel's, torch's
    lib dir, or the system's."""
    if torch.cuda.is_available():
        x = torch.ones(2, 2, device="cuda")
        (x @ x).sum().item()   # host sync: makes torch load its cuBLAS before we look for it
    path = _loaded_lib("libcublas.so")
    if path:
        return path
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    patterns = [os.path.join(r, "nvidia", "*", "lib", "libcublas.so*") for r in roots]
    patterns.append(os.path.join(os.path.dirname(torch.__file__), "lib", "libcublas*.so*"))
    for pat in patterns:
        for p in sorted(glob.glob(pat)):
            if "Lt" not in os.path.basename(p):
                return p
    found = ctypes.util.find_library("cublas")
    if found:
        return found
    raise RuntimeError("libcublas not found: install the nvidia-cublas wheel (it comes with "
                       "CUDA builds of torch) or put libcublas.so on LD_LIBRARY_PATH")


def colmajor_args(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, transa: bool,
                  transb: bool):
    """Column-major gemm arguments for row-major C = op(A) @ op(B).

    Returns (op1, op2, m, n, k, X1, ld1, X2, ld2, ldc): C.T (N x M) = op1(X1) @ op2(X2) with
    X1 = B, X2 = A. Every matrix must have unit stride along its rows (a row pitch is fine).
    """
    for x, name in ((A, "A"), (B, "B"), (C, "C")):
        if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
            raise ValueError(f"cuBLASXt needs row-major {name} (unit stride along rows)")
    m, k = (A.shape[1], A.shape[0]) if transa else tuple(A.shape)
    n = B.shape[0] if transb else B.shape[1]
    return (_OP_T if transb else _OP_N, _OP_T if transa else _OP_N, n, m, k,
            B, max(1, B.stride(0)), A, max(1, A.stride(0)), max(1, C.stride(0)))


class CublasXt:
    """One cuBLASXt handle on `devices` with a fixed block dimension."""

    def __init__(self, devices: list[int], block_dim: int | None = None, lib: str | None = None):
        self.lib = ctypes.CDLL(lib or find_libcublas())
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasXtCreate(ctypes.byref(self.handle)), "cublasXtCreate")
        ids = (ctypes.c_int * len(devices))(*devices)
        self._check(self.lib.cublasXtDeviceSelect(self.handle, len(devices), ids),
                    "cublasXtDeviceSelect")
        if block_dim:
            self._check(self.lib.cublasXtSetBlockDim(self.handle, int(block_dim)),
                        "cublasXtSetBlockDim")
        sz, vp = ctypes.c_size_t, ctypes.c_void_p
        for name in ("cublasXtSgemm", "cublasXtDgemm"):
            fn = getattr(self.lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [vp, ctypes.c_int, ctypes.c_int, sz, sz, sz, vp, vp, sz, vp, sz, vp,
                           vp, sz]

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *, transa: bool = False,
             transb: bool = False, alpha: float = 1.0, beta: float = 0.0) -> None:
        """C = alpha op(A) @ op(B) + beta C; returns when C is in host memory."""
        if not (A.dtype == B.dtype == C.dtype) or A.dtype not in (torch.float32, torch.float64):
            raise TypeError("cuBLASXt multiplies float32 or float64 only (all three alike)")
        op1, op2, m, n, k, x1, ld1, x2, ld2, ldc = colmajor_args(A, B, C, transa, transb)
        scalar = ctypes.c_float if A.dtype == torch.float32 else ctypes.c_double
        fn = self.lib.cublasXtSgemm if A.dtype == torch.float32 else self.lib.cublasXtDgemm
        a, b = scalar(alpha), scalar(beta)
        self._check(fn(self.handle, op1, op2, m, n, k, ctypes.byref(a), x1.data_ptr(), ld1,
                       x2.data_ptr(), ld2, ctypes.byref(b), C.data_ptr(), ldc),
                    "cublasXt gemm")

    def close(self) -> None:
        if self.handle:
            self.lib.cublasXtDestroy(self.handle)
            self.handle = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
