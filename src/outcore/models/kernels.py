"""The decoder block's elementwise parts, eager or fused by torch.compile.

Between its matmuls a Llama block runs about thirty elementwise kernels per pass (the fp32
RMSNorm's six, the rotary embedding's slices, negation, cat, products and sum, SiLU and
its product, the residual adds), each reading and writing whole B x T x D activations; on
an H200 they take about a third of a 3B step (bench/results/stream-profile-pytorch-*).
`Kernels(compiled=True)` runs each of the functions below as one generated kernel forward
and one backward (torch.compile, inductor); the math is the same, so results agree with the
eager functions up to the order of floating-point operations.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from ..errors import OutcoreError

BACKEND = "inductor"   # torch.compile's backend (tests swap in a failing one)
_EAGER = False         # set by eager(): compiled kernels run their eager functions


@contextmanager
def eager():
    """Compiled kernels run as the eager functions inside: for work whose shapes change
    each call (sampling one token at a time), where compiling each new shape (dynamic=False)
    cost seconds a token and torch's recompile-limit warnings."""
    global _EAGER
    was, _EAGER = _EAGER, True
    try:
        yield
    finally:
        _EAGER = was


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: ... x D, weight: D -> ... x D in x's dtype (the statistics in fp32)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """x, delta: ... x D -> (x + delta, rms_norm(x + delta)): a residual add and the next
    pre-norm in one pass."""
    s = x + delta
    return s, rms_norm(s, weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: B x H x T x hd, cos/sin: 1 x 1 x T x hd (any float dtype) -> rotary-embedded x in
    x's dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: ... x F -> silu(gate) * up."""
    return F.silu(gate) * up


class Kernels:
    """The four functions above, eager or each through torch.compile (compiled lazily on
    first use; one compiled graph per input shape, dtype and grad mode)."""

    NAMES = ("rms_norm", "add_rms_norm", "rotate", "swiglu")

    def __init__(self, compiled: bool = False):
        self.compiled = compiled
        for name in self.NAMES:
            fn = globals()[name]
            setattr(self, name, _lazy_compile(fn) if compiled else fn)


def _lazy_compile(fn):
    compiled = None

    def call(*args):
        nonlocal compiled
        if _EAGER:
            return fn(*args)
        if compiled is None:
            # dynamic=False: the shapes are fixed within a run (a recompile per new shape
            # is cheaper than symbolic shapes' slower kernels)
            compiled = torch.compile(fn, dynamic=False, backend=BACKEND)
        try:
            return compiled(*args)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            inner = getattr(e, "inner_exception", e)
            first = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
            raise OutcoreError(f"compiled kernels: torch.compile could not build "
                               f"{fn.__name__} ({type(inner).__name__}: {first}); it needs "
                               "Triton on a GPU or a C++ compiler on the CPU: build the model "
                               "with compiled=False (no --compile-kernels)") from None
    call.__name__ = fn.__name__
    return call
