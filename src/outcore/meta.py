"""Build a model without its weights: parameters on the meta device, buffers real.

    with meta_parameters():
        model = MyModel(cfg)            # no parameter memory; buffers (small) are real
    engine = outcore.Engine(model, init=...)   # stream/materialize.py fills the state

Used by hf.py (a checkpoint's tensors replace the meta parameters one at a time), the
planner (sizes without memory) and `outcore.models.decoder(size, lazy=True)`.
"""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def meta_parameters():
    """Parameters created inside land on the meta device; buffers stay real (small)."""
    orig = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        orig(self, name, param)
    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = orig
