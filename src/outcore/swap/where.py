"""Which module's forward saved a tensor (SwapConfig.by_module), read off the Python stack.

The innermost nn.Module call on the stack when pack runs is the module whose forward (or
whose op) saved the tensor: Module.__call__ runs Module._call_impl, whose frame holds the
module as `self`. Reading the stack costs a few microseconds per offloaded tensor, only in
forwards that pack. Forward hooks on every module (which the names were tracked with
before) cost each module call a few microseconds in every forward, the unhooked ones too.
With context.py's parameter list read once, ResNet-152's step that needs no swapping went
from 0.89-0.97x plain PyTorch to 0.98-0.99x on the H200 (session 44, both changes at once;
session 45's whole swap bench read 0.95x).
"""

from __future__ import annotations

import sys

import torch

_CALL = torch.nn.Module._call_impl.__code__


class ModuleNames:
    """id(module) -> its name in the model (named_modules at the swap's start)."""

    def __init__(self, model: torch.nn.Module):
        # The modules are held by the model for as long as the swap: their ids stay theirs
        # (a module replaced after swap() could be freed and its id reused: context.py's
        # docstring says such a model needs a new swap).
        # A module shared under two names gets its first (named_modules' own), one that
        # model.named_modules() lists, as the per-module hooks named it before.
        self.names = {id(m): n for n, m in model.named_modules()}

    def saving(self) -> str:
        """The name of the innermost module of the model whose call is on this thread's
        stack ("" for the model itself, or when none is: a save outside any module)."""
        f = sys._getframe(1)
        while f is not None:
            if f.f_code is _CALL:
                name = self.names.get(id(f.f_locals.get("self")))
                if name is not None:
                    return name
            f = f.f_back
        return ""
