"""The one arithmetic step: a GEMM accumulated into a C tile, in the compute dtype."""

from __future__ import annotations

import torch

_OUT_DTYPE_OK: dict[str, bool] = {}
# A first GEMM into a tile (beta == 0) as torch.mm(out=) rather than addmm_(beta=0): the
# probe times both (bench/gemm_probe.py, KERNELS); in-core torch.mm ran 54.0 TFLOP/s at
# 16384^3 in fp32 against 52.8 for addmm_ with beta=1. Off until measured.
MM_FOR_FIRST = False


def mm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
           beta: float) -> None:
    """acc = alpha * a @ b + beta * acc (acc not read when beta == 0).

    bf16 operands into an fp32 accumulator: on GPUs torch's out_dtype GEMM (fp32
    accumulation across calls) where it exists, else a bf16 GEMM and an fp32 add; on the
    CPU the bf16 values multiplied in fp32 (exactly what bf16 x bf16 -> fp32 computes).
    """
    if a.dtype == acc.dtype:
        if beta == 0 and MM_FOR_FIRST:
            torch.mm(a, b, out=acc)
            if alpha != 1:
                acc.mul_(alpha)
            return
        acc.addmm_(a, b, beta=beta, alpha=alpha)
        return
    kind = acc.device.type
    if kind == "cpu":
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype), beta=beta, alpha=alpha)
        return
    if _OUT_DTYPE_OK.get(kind, True):
        try:
            torch.addmm(acc, a, b, beta=beta, alpha=alpha, out_dtype=acc.dtype, out=acc)
            _OUT_DTYPE_OK[kind] = True
            return
        except (RuntimeError, TypeError, NotImplementedError):
            _OUT_DTYPE_OK[kind] = False
    prod = torch.mm(a, b)
    if beta == 0:
        torch.mul(prod, alpha, out=acc)
    else:
        if beta != 1:
            acc.mul_(beta)
        acc.add_(prod, alpha=alpha)
