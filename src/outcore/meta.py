"""Build a model without its weights: parameters on the meta device, buffers real.

    with meta_parameters():
        model = MyModel(cfg)            # no parameter memory; buffers (small) are real
    engine = outcore.Engine(model, init=...)   # stream/materialize.py fills the state

Used by hf.py (a checkpoint's tensors replace the meta parameters one at a time), the
planner (sizes without memory) and `outcore.models.decoder(size, lazy=True)`. `materialize`
makes such a model real on the CPU, filled as the engine would fill it; `decoder(size)`
builds that way: its weights drawn once, on a pool of threads, not by each nn.Linear's
own init and again by the decoder's, each on one thread (1B on 2 cores: 9 s against 16).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

_depth = 0   # meta_parameters() blocks entered and not left (nested ones count)


@contextlib.contextmanager
def meta_parameters():
    """Parameters created inside land on the meta device; buffers stay real (small)."""
    global _depth
    orig = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        orig(self, name, param)
    nn.Module.register_parameter = register
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        nn.Module.register_parameter = orig


def building_on_meta() -> bool:
    """Is a meta_parameters() block open (a model built now is meant to hold no weights)?"""
    return _depth > 0


def materialize(model: nn.Module, init: Callable | None = None) -> nn.Module:
    """Every meta parameter of `model` made real on the CPU, in its dtype, holding the
    values the engine would fill it with (stream/materialize.py: `init(name, tensor)`, else
    model.init_param in row blocks on a pool of threads, else each module's
    reset_parameters(); seeded from torch.initial_seed() and the name). So
    Engine(materialize(m)) starts from the weights Engine(m) would. Parameters already real
    are left alone; the same Parameter objects are kept (tied weights stay tied).
    Returns `model`."""
    from .stream.materialize import filler, repoint
    fill = filler(model, init)
    try:
        for name, p in model.named_parameters():
            if p.is_meta:
                t = torch.empty(p.shape, dtype=torch.float32)   # as the engine's fp32 state
                fill(name, t)
                repoint(p, t if p.dtype == torch.float32 else t.to(p.dtype))
    finally:
        close = getattr(fill, "close", None)
        if close is not None:
            close()   # RowBlocks' threads
    return model
