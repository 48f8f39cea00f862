"""fp32 GEMMs through cuBLASLt with a kernel chosen by measurement, where cuBLAS's own pick
is slower.

On the H200 (sm_90) cuBLAS runs fp32 GEMMs of outcore's tile shapes (4096 x 4096 x 2048..16384)
on `sm80_xmma_gemm_f32f32_..._tilesize256x128x8_..._ffma` at 50.0-51.4 TFLOP/s, where whole
products (16384^3) reach 54. cuBLASLt's heuristic offers nothing faster for the tiles; its
algorithm 55 configured with tile id 24 (256 x 128) and stages id 31, which runs the same
kernel family with the tile the other way round (`..._tilesize128x256x8_...` in its own
column-major terms; `bench/diag/lt_algos.py`, lt-algos-h200.json, and the trace in
gemm-probe-h200-s21.json, session 21), runs them at 53.3 and 52.2 TFLOP/s.
Whole products (`bench/diag/lt_ab.py`, lt-ab-h200.json): fp32-16384 171 ms against 177,
fp32-32768 1.02x, the NN and TN training shapes 1.02-1.04x, the NT ones 0.97x (so not those).

`addmm(acc, a, b, alpha, beta)` does `acc = alpha * a @ b + beta * acc` that way and returns
True, or returns False (nothing done) where it does not apply: not fp32 in and out, TF32
allowed, not a GPU this was measured on (CAPABILITIES), a dimension under MIN_DIM, an operand
neither row- nor column-contiguous, b column-contiguous (measured slower), or cuBLASLt
refusing the configuration (it checks it per problem: cublasLtMatmulAlgoCheck). The caller
then runs torch's GEMM. OUTCORE_GEMM_LT=0 turns it off.

Layout: torch tensors are row-major; cuBLASLt's are column-major. A row-major X (r x c) with
row stride ld is the column-major X^T (c x r, ld), so C = A @ B is computed as C^T = B^T A^T:
cuBLASLt's first operand is B, its second A, its output C^T (n x m).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

import torch

from ..memory import cuda_index
from .cudacopy import _loaded_lib

ENABLED = os.environ.get("OUTCORE_GEMM_LT", "1") != "0"
CAPABILITIES = {(9, 0)}                 # where the kernel below was measured faster
ALGO_ID, TILE_256x128, STAGES_ID = 55, 24, 31
MIN_DIM = 256                           # smaller GEMMs stay with cuBLAS's own pick

_COMPUTE_32F, _R_32F = 68, 0            # cublasComputeType_t (no TF32), cudaDataType_t
_DESC_TRANSA, _DESC_TRANSB = 3, 4       # cublasLtMatmulDescAttributes_t
_CONFIG_TILE, _CONFIG_SPLITK, _CONFIG_STAGES = 1, 2, 6   # cublasLtMatmulAlgoConfigAttributes_t
_OP_N, _OP_T = 0, 1

calls = 0                               # GEMMs run here (tests read it)


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]          # cublasLtMatmulAlgo_t


class _Heuristic(ctypes.Structure):                     # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@dataclass(frozen=True)
class Operand:
    """One operand as cuBLASLt stores it: its op (N or T), rows x cols before the op, ld."""
    op: int
    rows: int
    cols: int
    ld: int


def lt_operand(x: torch.Tensor) -> Operand | None:
    """x (r x c, row-major terms) as the column-major operand standing for x^T, or None
    where x is neither row- nor column-contiguous."""
    r, c = x.shape
    s0, s1 = x.stride()
    if s1 == 1 and s0 >= max(1, c):
        return Operand(_OP_N, c, r, s0)      # memory holds x^T (c x r) column-major
    if s0 == 1 and s1 >= max(1, r):
        return Operand(_OP_T, r, c, s1)      # memory holds x (r x c) column-major
    return None


def operands(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple | None:
    """(B's operand, A's operand, C^T's ld) for acc (m x n) = a (m x k) @ b (k x n), or
    None where the shapes or strides rule cuBLASLt out."""
    if min(a.shape[0], a.shape[1], b.shape[1]) < MIN_DIM or acc.stride(1) != 1 \
            or acc.stride(0) < acc.shape[1]:
        return None
    lb, la = lt_operand(b), lt_operand(a)
    if lb is None or la is None:
        return None
    return lb, la, acc.stride(0)


def problem_key(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple | None:
    """operands(), where the configured kernel was measured faster: not with b
    column-contiguous (the NT products' blocks), 3% slower there than cuBLAS's pick in all
    six fp32 NT training shapes (lt-ab-h200.json)."""
    key = operands(acc, a, b)
    return None if key is None or key[0].op == _OP_T else key


class _Lt:
    """cuBLASLt on the library torch loaded: one handle, a descriptor set and the configured
    algorithm per problem key (None where cuBLASLt refused it)."""

    def __init__(self):
        path = _loaded_lib("libcublasLt.so")
        if path is None:
            raise OSError("libcublasLt is not loaded in this process")
        self.lib = ctypes.CDLL(path)
        self.handle = ctypes.c_void_p()
        if self.lib.cublasLtCreate(ctypes.byref(self.handle)) != 0:
            raise OSError("cublasLtCreate failed")
        self.problems: dict[tuple, tuple | None] = {}

    def _layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        if self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), _R_32F, ctypes.c_uint64(rows),
                                               ctypes.c_uint64(cols), ctypes.c_int64(ld)) != 0:
            raise OSError("cublasLtMatrixLayoutCreate failed")
        return out

    def prepare(self, key: tuple, m: int, n: int) -> tuple | None:
        """The descriptors and algorithm for `key`, made once (cuBLASLt's check included)."""
        if key in self.problems:
            return self.problems[key]
        lb, la, ldc = key
        lib, desc = self.lib, ctypes.c_void_p()
        got = None
        if lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F) == 0:
            for attr, val in ((_DESC_TRANSA, lb.op), (_DESC_TRANSB, la.op)):
                v = ctypes.c_int32(val)
                lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4)
            lay_b, lay_a = self._layout(lb.rows, lb.cols, lb.ld), self._layout(la.rows, la.cols,
                                                                               la.ld)
            lay_c = self._layout(n, m, ldc)
            algo, check = _Algo(), _Heuristic()
            ok = lib.cublasLtMatmulAlgoInit(self.handle, _COMPUTE_32F, _R_32F, _R_32F, _R_32F,
                                            _R_32F, _R_32F, ALGO_ID, ctypes.byref(algo)) == 0
            for attr, val in ((_CONFIG_TILE, TILE_256x128), (_CONFIG_STAGES, STAGES_ID),
                              (_CONFIG_SPLITK, 1)):
                v = ctypes.c_uint32(val)
                ok = ok and lib.cublasLtMatmulAlgoConfigSetAttribute(
                    ctypes.byref(algo), attr, ctypes.byref(v), 4) == 0
            ok = ok and lib.cublasLtMatmulAlgoCheck(
                self.handle, desc, lay_b, lay_a, lay_c, lay_c, ctypes.byref(algo),
                ctypes.byref(check)) == 0
            if ok and check.workspaceSize == 0:     # no workspace: nothing off the budget
                got = (desc, lay_b, lay_a, lay_c, algo)
            else:
                for lay in (lay_b, lay_a, lay_c):
                    lib.cublasLtMatrixLayoutDestroy(lay)
                lib.cublasLtMatmulDescDestroy(desc)
        self.problems[key] = got
        return got

    def matmul(self, prepared: tuple, acc, a, b, alpha: float, beta: float) -> bool:
        desc, lay_b, lay_a, lay_c, algo = prepared
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        stream = torch.cuda.current_stream(acc.device).cuda_stream
        return self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(al), ctypes.c_void_p(b.data_ptr()), lay_b,
            ctypes.c_void_p(a.data_ptr()), lay_a, ctypes.byref(be),
            ctypes.c_void_p(acc.data_ptr()), lay_c, ctypes.c_void_p(acc.data_ptr()), lay_c,
            ctypes.byref(algo), None, ctypes.c_size_t(0), ctypes.c_void_p(stream)) == 0


_LOCK = threading.Lock()
_PER_DEVICE: dict[int, _Lt | None] = {}


def _lt_for(device: torch.device) -> _Lt | None:
    """This device's cuBLASLt state, or None where cuBLASLt is not to be used on it."""
    idx = cuda_index(device)
    with _LOCK:
        if idx not in _PER_DEVICE:
            lt = None
            if torch.cuda.get_device_capability(idx) in CAPABILITIES:
                try:
                    with torch.cuda.device(idx):
                        lt = _Lt()
                except OSError:
                    lt = None
            _PER_DEVICE[idx] = lt
        return _PER_DEVICE[idx]


def addmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
          beta: float) -> bool:
    """acc (m x n) = alpha * a (m x k) @ b (k x n) + beta * acc on the current stream, through
    cuBLASLt's configured kernel; False, with nothing done, where that does not apply."""
    global calls
    if not ENABLED or acc.device.type != "cuda" or acc.dtype != torch.float32 \
            or a.dtype != torch.float32 or b.dtype != torch.float32 \
            or torch.backends.cuda.matmul.allow_tf32 \
            or torch.get_float32_matmul_precision() != "highest":
        return False
    key = problem_key(acc, a, b)
    if key is None:
        return False
    lt = _lt_for(acc.device)
    if lt is None:
        return False
    with _LOCK:                             # one worker thread per device may share the cache
        prepared = lt.prepare(key, acc.shape[0], acc.shape[1])
    if prepared is None:
        return False
    with torch.cuda.device(acc.device):    # cuBLASLt launches on the current device
        ran = lt.matmul(prepared, acc, a, b, alpha, beta)
    if not ran:
        with _LOCK:                         # refused at the call (e.g. alignment): not again
            lt.problems[key] = None
        return False
    calls += 1
    return True
