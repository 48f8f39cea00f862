"""Skipping, in a block's recompute, the last projection whose output the backward never reads.

The backward recomputes block g from its checkpoint to rebuild the graph. The block's last
nn.Linear (the output projection of a pre-norm MLP or attention) computes an output that
nothing in the backward reads: a matmul's backward needs only its inputs, and the residual
add after it needs no values. PyTorch's non-reentrant checkpoint stops its recompute before
it for the same reason (one fewer large matmul per block and step: ~30 ms of a 3B step on
an H200, from the profiles in bench/results/stream-profile-*).

`TailSkip` finds that Linear on a block's first backward: the Linear called last, once,
with no tensor saved for backward after it. From then on that Linear returns an
zero tensor whose backward is the Linear's backward. Every skipping pass checks
that it is still the last Linear, called once; when not (control flow that depends on
values), the pass is recomputed without skipping and the block never skips again. Only
the first pass watches saved tensors (a saved_tensors_hooks context, which shadows any
outer one, such as outcore.swap's, for that pass).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class _SkipLinear(torch.autograd.Function):
    """x: (..., in), w: (out, in), b: (out,) | None -> zeros (..., out) (a memset, not a
    matmul: finite and deterministic should a hook look at it); the backward is
    y = x w^T + b's."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return x.new_zeros(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = g @ w
        g2 = g.reshape(-1, g.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = g2.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def _skipping_forward(lin: nn.Linear):
    def forward(x):
        w, b = lin.weight, lin.bias
        dev = x.device.type
        if torch.is_autocast_enabled(dev):   # what autocast does to a linear: operands
            dt = torch.get_autocast_dtype(dev)   # in its dtype
            x, w = x.to(dt), w.to(dt)
            b = b.to(dt) if b is not None else None
        return _SkipLinear.apply(x, w, b)
    return forward


class _Watch:
    """During one forward of `module`: the nn.Linear called last, how often it was called,
    and whether any tensor was saved for backward after its call."""

    def __init__(self, module: nn.Module, saves: bool = True):
        # exactly nn.Linear: a subclass may compute something else in its forward
        self.linears = [m for m in module.modules() if type(m) is nn.Linear]
        self.saves = saves                 # watch saved tensors too (the probe pass)
        self.last: nn.Linear | None = None
        self.calls = 0
        self.saved_after = False

    def _hook(self, mod, inputs, output) -> None:
        self.calls = self.calls + 1 if mod is self.last else 1
        self.last, self.saved_after = mod, False

    def _pack(self, t):
        self.saved_after = True
        return t

    @contextlib.contextmanager
    def __call__(self):
        handles = [m.register_forward_hook(self._hook) for m in self.linears]
        saved = (torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
                 if self.saves else contextlib.nullcontext())
        try:
            with saved:
                yield self
        finally:
            for h in handles:
                h.remove()

    def tail(self) -> nn.Linear | None:
        """The Linear whose output nothing saved for backward, or None."""
        if self.last is None or self.saved_after or self.calls != 1:
            return None
        return self.last


@contextlib.contextmanager
def _patched(lin: nn.Linear):
    had = "forward" in lin.__dict__
    old = lin.__dict__.get("forward")
    lin.forward = _skipping_forward(lin)
    try:
        yield
    finally:
        if had:
            lin.forward = old
        else:
            del lin.forward


class TailSkip:
    """Per block: unknown (first backward probes), False (never skips) or the Linear."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.state: dict[int, nn.Linear | bool] = {}

    def recompute(self, g: int, module: nn.Module, run):
        """out = run() (block g's forward with a graph; it restores its own RNG state),
        with the block's tail Linear skipped where that is known to be safe."""
        lin = self.state.get(g)
        if not self.enabled or lin is False or not isinstance(module, nn.Module):
            return run()
        watch = _Watch(module, saves=lin is None)
        with watch(), (_patched(lin) if lin is not None else contextlib.nullcontext()):
            out = run()
        found = watch.tail()
        if lin is None:
            self.state[g] = found if found is not None else False
            return out
        if found is lin:
            return out
        # the skipped Linear was not the tail this time: its zero output may have been
        # read, so this pass is recomputed whole and the block stops skipping
        self.state[g] = False
        return run()

    def skipping(self) -> list[int]:
        """The blocks whose recompute skips their tail Linear."""
        return sorted(g for g, v in self.state.items() if isinstance(v, nn.Linear))
