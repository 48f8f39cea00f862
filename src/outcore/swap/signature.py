"""A forward's signature: what decides the sizes of the tensors it saves.

Two forwards of one signature save the same tensors (unhooked.py skips the hooks of one
that fits as the last did) and read the same parameters (param_guard.py checks each
signature once)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_leaves


def _autocast_state() -> tuple:
    return tuple((torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
                 for dev in ("cuda", "cpu"))


def signature(module: nn.Module, args, kwargs, params=None) -> tuple | None:
    """What decides the sizes a forward saves: the inputs' shapes, dtypes and devices, the
    other arguments, training mode, grad mode, autocast and which parameters (`params`,
    default module.parameters()) require grad (unfreezing layers makes autograd save their
    activations). None when an argument cannot be compared (then the forward is always
    hooked)."""
    params = module.parameters() if params is None else params
    sig = [module.training, torch.is_grad_enabled(), _autocast_state(),
           tuple(p.requires_grad for p in params)]
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            sig.append((tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            sig.append(leaf)
        else:
            return None
    return tuple(sig)
