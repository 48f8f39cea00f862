"""The one arithmetic step: a GEMM accumulated into a C tile, in the compute dtype."""

from __future__ import annotations

import torch

_OUT_DTYPE_OK: dict[str, bool] = {}


def mm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float,
           beta: float) -> None:
    """acc = alpha * a @ b + beta * acc (acc not read when beta == 0).

    bf16 operands into an fp32 accumulator: on GPUs torch's out_dtype GEMM (fp32
    accumulation across calls) where it exists, else a bf16 GEMM and an fp32 add; on the
    CPU the bf16 values multiplied in fp32 (exactly what bf16 x bf16 -> fp32 computes).
    """
    if a.dtype == acc.dtype:
        # (a tile's first GEMM as torch.mm(out=) instead ran no faster on the H200: session
        # 11's probe, gemm-probe-h200.json, kernels "mm" and "addmm0", case "mm-first")
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
