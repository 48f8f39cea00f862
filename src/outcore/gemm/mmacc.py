"""The one arithmetic step: a GEMM accumulated into a C tile, in the compute dtype."""

from __future__ import annotations

import torch

from . import ltmm

_OUT_DTYPE_OK: dict[str, bool] = {}
# Columns one GEMM call covers at most (0: the whole width of its C tile), for operands of
# these dtypes. Opt-in, and measured no faster (session 18, bench/diag/gemm_split.py,
# gemm-split-h200.json): bf16 2048 x 32768 x 32768 in one call 744 TFLOP/s, in 16384-wide
# chunks 762, in 8192-wide 688; the bf16-32768 product 186 ms whole against 187 in 16384-wide
# chunks (median of 4 alternating rounds), tf32-32768 226 against 225.
COL_CHUNK = 0
COL_CHUNK_DTYPES = (torch.bfloat16,)


def mm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
           beta: float) -> bool:
    """acc = alpha * a @ b + beta * acc (acc not read when beta == 0); in column chunks
    of COL_CHUNK (strided views of acc and b: no copies) where that is set. True where
    cuBLASLt's configured fp32 kernel ran it (ltmm.py)."""
    n = acc.shape[1]
    if COL_CHUNK and n > COL_CHUNK and a.dtype in COL_CHUNK_DTYPES:
        for c0 in range(0, n, COL_CHUNK):
            _mm_acc(acc[:, c0:c0 + COL_CHUNK], a, b[:, c0:c0 + COL_CHUNK], alpha, beta)
        return False
    return _mm_acc(acc, a, b, alpha, beta)


def _mm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
            beta: float) -> bool:
    """mm_acc on one GEMM call.

    bf16 operands into an fp32 accumulator: on GPUs torch's out_dtype GEMM (fp32
    accumulation across calls) where it exists, else a bf16 GEMM and an fp32 add; on the
    CPU the bf16 values multiplied in fp32 (exactly what bf16 x bf16 -> fp32 computes).
    """
    if a.dtype == acc.dtype:
        # (a tile's first GEMM as torch.mm(out=) instead ran no faster on the H200: session
        # 11's probe, gemm-probe-h200.json, kernels "mm" and "addmm0", case "mm-first")
        if ltmm.addmm(acc, a, b, alpha, beta):         # fp32 on an H200: a faster kernel
            return True
        acc.addmm_(a, b, beta=beta, alpha=alpha)
        return False
    kind = acc.device.type
    if kind == "cpu":
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype), beta=beta, alpha=alpha)
        return False
    if _OUT_DTYPE_OK.get(kind, True):
        try:
            torch.addmm(acc, a, b, beta=beta, alpha=alpha, out_dtype=acc.dtype, out=acc)
            _OUT_DTYPE_OK[kind] = True
            return False
        except (RuntimeError, TypeError, NotImplementedError):
            _OUT_DTYPE_OK[kind] = False
    prod = torch.mm(a, b)
    if beta == 0:
        torch.mul(prod, alpha, out=acc)
    else:
        if beta != 1:
            acc.mul_(beta)
        acc.add_(prod, alpha=alpha)
    return False
