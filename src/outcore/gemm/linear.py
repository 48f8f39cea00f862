"""A Linear layer whose weight lives in host memory and may exceed the GPU budget.

    layer = outcore.gemm.Linear(65536, 65536, gpu_memory="8GiB")   # W: 16 GiB fp32, host
    y = layer(x)              # x: B x 65536 CPU tensor -> y: B x 65536 CPU tensor
    y.sum().backward()        # dx and dW through the out-of-core matmul as well

Each product goes through `outcore.matmul` (the seed paper's reduction of a layer's
forward and backward to GEMM):
    forward   y  = x @ W.T + b       (NT: x B x in, W out x in)
    backward  dx = dy @ W            (NN)
              dW = dy.T @ x          (TN)
              db = dy.sum(0)         (on the host)
Inputs, outputs and gradients are CPU tensors; the weight is page-locked once (pin=True,
with CUDA) so its blocks are copied by DMA directly.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import OutcoreError
from ..memory import pin_, unpin_
from .matmul import matmul


@dataclass(frozen=True)
class GemmOptions:
    """How the layer's products run (the keywords of outcore.matmul)."""
    devices: object = None
    gpu_memory: object = None
    tile: object = None
    compute: str | None = None

    def kwargs(self) -> dict:
        return {"devices": self.devices, "gpu_memory": self.gpu_memory, "tile": self.tile,
                "compute": self.compute}


class _LinearFn(torch.autograd.Function):
    """x: B x in, weight: out x in, bias: out (or None) -> B x out; see the module doc."""

    @staticmethod
    def forward(ctx, x, weight, bias, opts: GemmOptions):
        ctx.save_for_backward(x, weight)
        ctx.opts, ctx.has_bias = opts, bias is not None
        y = matmul(x, weight, transb=True, **opts.kwargs())
        if bias is not None:
            y.add_(bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        kw = ctx.opts.kwargs()
        dx = matmul(dy, weight, **kw) if ctx.needs_input_grad[0] else None
        dw = matmul(dy, x, transa=True, **kw) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class Linear(nn.Module):
    """y = x @ W.T + b with W (out_features x in_features) in host memory.

    devices, gpu_memory, tile, compute: passed to every outcore.matmul of the layer.
    pin: page-lock the weight (once; only with CUDA) so it is copied without staging.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: torch.dtype = torch.float32, devices=None, gpu_memory=None, tile=None,
                 compute: str | None = None, pin: bool = True):
        super().__init__()
        if dtype not in (torch.float32, torch.float64, torch.bfloat16):
            raise TypeError(f"dtype={dtype} is not supported: use torch.float32, torch.float64 "
                            "or torch.bfloat16")
        if in_features <= 0 or out_features <= 0:
            raise OutcoreError(f"Linear({in_features}, {out_features}): both sizes must be "
                               "positive")
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.opts = GemmOptions(devices, gpu_memory, tile, compute)
        self.reset_parameters()
        if pin and torch.cuda.is_available():
            w = self.weight.data
            pinned = pin_(w)
            if pinned is w:   # registered in place: unregister when the layer goes
                weakref.finalize(self, unpin_, w)   # holds w: unregistered before freed
            else:             # small: a pinned copy from torch's allocator (frees itself)
                self.weight.data = pinned

    def reset_parameters(self) -> None:
        """The initialization of torch.nn.Linear."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            raise TypeError("outcore.gemm.Linear takes CPU tensors (its weight lives in host "
                            f"memory); got {getattr(x, 'device', type(x).__name__)}: pass x.cpu()")
        if x.shape[-1] != self.in_features:
            raise OutcoreError(f"x has {x.shape[-1]} features in its last dimension but the layer "
                               f"takes {self.in_features}: reshape x or build the layer for it")
        if x.dtype != self.weight.dtype:
            raise TypeError(f"x is {x.dtype} but the layer's weight is {self.weight.dtype}: cast x "
                            "to the layer's dtype")
        lead = x.shape[:-1]
        y = _LinearFn.apply(x.reshape(-1, self.in_features), self.weight, self.bias, self.opts)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, {self.opts}")
