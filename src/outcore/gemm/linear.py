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
with CUDA) so its blocks are copied by DMA directly. The products record no autograd
graph: differentiating a gradient taken through the layer with create_graph=True raises
(torch.nn.Linear for higher-order gradients).
"""

from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..draws import RowBlocks
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


class _NoDoubleBackward(torch.autograd.Function):
    """Gradients taken with create_graph=True: the same values, whose own backward raises
    (the out-of-core products record no graph, so a second derivative through them would
    silently come out as zero)."""

    @staticmethod
    def forward(ctx, *grads):
        return tuple(g.detach() for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise OutcoreError("outcore.gemm.Linear has no double backward (a gradient taken "
                           "through it with create_graph=True was differentiated again): "
                           "use torch.nn.Linear for higher-order gradients")


def _refuse_second_order(grads, depends):
    """grads, with those that depend on a tensor requiring grad (depends[i]) marked so that
    differentiating them raises; unchanged outside create_graph=True."""
    marked = [i for i, g in enumerate(grads) if g is not None and depends[i]]
    if not torch.is_grad_enabled() or not marked:
        return grads
    fake = [grads[i].detach().requires_grad_() for i in marked]
    out = list(grads)
    for i, g in zip(marked, _NoDoubleBackward.apply(*fake)):
        out[i] = g
    return tuple(out)


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
        # under create_graph=True: dx depends on dy and W, dW on dy and x, db on dy
        grads = _refuse_second_order((dx, dw, db), (dy.requires_grad or weight.requires_grad,
                                                    dy.requires_grad or x.requires_grad,
                                                    dy.requires_grad))
        return (*grads, None)


PARALLEL_INIT = 1 << 24   # weights this large are drawn on a pool of threads


class Linear(nn.Module):
    """y = x @ W.T + b with W (out_features x in_features) in host memory.

    devices, gpu_memory, tile, compute: passed to every outcore.matmul of the layer.
    pin: page-lock the weight (once; only with CUDA) so it is copied without staging.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: torch.dtype = torch.float32, devices=None, gpu_memory=None, tile=None,
                 compute: str | None = None, pin: bool = True):
        super().__init__()
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (in_features, out_features)):
            raise TypeError(f"Linear({in_features!r}, {out_features!r}): in_features and "
                            "out_features must be integers")
        if dtype not in (torch.float32, torch.float64, torch.bfloat16):
            raise TypeError(f"dtype={dtype} is not supported: use torch.float32, torch.float64 "
                            "or torch.bfloat16")
        if in_features <= 0 or out_features <= 0:
            raise OutcoreError(f"Linear({in_features}, {out_features}): both sizes must be "
                               "positive")
        self.in_features, self.out_features = int(in_features), int(out_features)
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
        """The initialization of torch.nn.Linear: weight and bias uniform in +-1/sqrt(in
        features) (kaiming_uniform_ with a=sqrt(5)). A weight of PARALLEL_INIT elements or
        more is drawn in row blocks on a pool of threads (draws.RowBlocks; torch draws on
        one thread: a 16384 x 65536 layer took 4.9 s against 8.9-12.4 on 2 cores, session
        46) from one seed taken from torch's RNG, so torch.manual_seed still decides it,
        whatever the thread count; a smaller one by torch's own init, value for value."""
        bound = 1 / math.sqrt(self.in_features)
        if self.weight.numel() >= PARALLEL_INIT:
            seed = int(torch.randint(2**62, (), dtype=torch.int64))
            draw = RowBlocks(lambda name, rows, g: rows.uniform_(-bound, bound, generator=g),
                             seed)
            try:
                draw("weight", self.weight.data)
            finally:
                draw.close()
        else:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"outcore.gemm.Linear takes a CPU torch.Tensor, not a "
                            f"{type(x).__name__}: pass torch.as_tensor(x)")
        if x.device.type != "cpu":
            raise TypeError("outcore.gemm.Linear takes CPU tensors (its weight lives in host "
                            f"memory); got one on {x.device}: pass x.cpu()")
        self._check_weight()
        if x.ndim == 0:
            raise OutcoreError(f"x is a 0-d tensor: the layer takes x of at least 1-d with "
                               f"{self.in_features} features in its last dimension")
        if x.shape[-1] != self.in_features:
            raise OutcoreError(f"x has {x.shape[-1]} features in its last dimension but the layer "
                               f"takes {self.in_features}: reshape x or build the layer for it")
        if x.dtype != self.weight.dtype:
            raise TypeError(f"x is {x.dtype} but the layer's weight is {self.weight.dtype}: cast x "
                            "to the layer's dtype")
        lead = x.shape[:-1]
        y = _LinearFn.apply(x.reshape(-1, self.in_features), self.weight, self.bias, self.opts)
        return y.reshape(*lead, self.out_features)

    def _check_weight(self) -> None:
        """The parameters must stay host tensors of a dtype matmul takes (.cuda(), .to() or
        .half() on the module move or cast them)."""
        for name, p in (("weight", self.weight), ("bias", self.bias)):
            if p is None:
                continue
            if p.device.type != "cpu":
                raise TypeError(f"the layer's {name} is on {p.device} (moved by .to() or "
                                ".cuda()?): outcore.gemm.Linear keeps its parameters in host "
                                "memory and feeds the GPU itself; call layer.cpu()")
            if p.dtype not in (torch.float32, torch.float64, torch.bfloat16):
                raise TypeError(f"the layer's {name} is {p.dtype} (cast by .to() or .half()?): "
                                "use torch.float32, torch.float64 or torch.bfloat16, e.g. "
                                "layer.float()")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, {self.opts}")
