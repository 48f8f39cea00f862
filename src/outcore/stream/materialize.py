"""Parameters built on the meta device, made real one tensor at a time where the state wants them.

A model whose parameters are on the meta device (`outcore.models.decoder(size, lazy=True)`,
or any model built inside `outcore.meta.meta_parameters()`) holds no weight memory (a
parameter that is real in a partly lazy model is copied as usual). The
engine then fills each group's flat host buffer in place (storage.HostState) or, on a rank
of a sharded engine, only its own slice of it (parallel/shard.py). So the host never holds
a whole fp32 model beside the training state: with N ranks on one machine, building costs
each rank one tensor, not one model (bench/parallel.py's largest rows).

Values come from `Engine(init=fn)`, fn(name, tensor) filling `tensor` (fp32, on the CPU,
shaped like parameter `name`) in place; else the model's own `init_param(name, rows,
generator)`, which draws each element on its own (RowBlocks: in parallel); else the owning
module's `reset_parameters()`. Each runs under an RNG seeded from the parameter's (or
module's) name, so every rank and every world size gets the same weights, whichever slice
of a tensor it keeps; the seed is torch.initial_seed() (torch.manual_seed's).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from ..draws import RowBlocks, seed_of
from ..errors import OutcoreError

Fill = Callable[[str, torch.Tensor], None]


def is_lazy(model: nn.Module) -> bool:
    """True when any parameter of `model` is on the meta device (nothing to copy from)."""
    return any(p.is_meta for p in model.parameters())


def _seeded(key: str, seed: int, fn: Callable[[], None]) -> None:
    """fn() with the CPU RNG seeded from (seed, key), the caller's RNG state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_of(seed, key))
        fn()


def lazy_fill(model: nn.Module, init: Callable | None = None) -> Fill | None:
    """The engine's fill for `model`: None when its parameters are real (they are copied),
    else filler(model, init). Buffers must be real: they are not initialised here."""
    if not is_lazy(model):
        if init is not None:
            raise OutcoreError("Engine(init=...) fills parameters built on the meta device; "
                               "this model's are real: leave init out")
        return None
    meta = [n for n, b in model.named_buffers() if b.is_meta]
    if meta:
        raise OutcoreError(f"buffer {meta[0]!r} is on the meta device: build the model inside "
                           "outcore.meta.meta_parameters() (parameters only on meta, buffers "
                           "real) rather than under torch.device('meta')")
    return filler(model, init)


def repoint(p: nn.Parameter, t: torch.Tensor) -> None:
    """Make Parameter p (same object: the model, groups and optimizer keep it) a view of t.
    A meta parameter cannot take .data from another device: its tensor is swapped."""
    if p.is_meta:
        torch.utils.swap_tensors(p, nn.Parameter(t, requires_grad=p.requires_grad))
    else:
        p.data = t


def left_as_is(name: str, t: torch.Tensor) -> None:
    """An init that writes nothing: for Engine.load, whose checkpoint overwrites it all."""


def filler(model: nn.Module, init: Callable | None = None, seed: int | None = None) -> Fill:
    """fill(name, tensor): parameter `name`'s initial values written into `tensor` (see the
    module docstring for where they come from). seed: by default torch.initial_seed(), the
    one torch.manual_seed set (the same on every rank of a seeded job)."""
    seed = torch.initial_seed() if seed is None else seed
    if init is not None:
        def fill(name: str, t: torch.Tensor) -> None:
            _seeded(name, seed, lambda: init(name, t))
        return fill
    if callable(getattr(model, "init_param", None)):
        return RowBlocks(model.init_param, seed)
    return ModuleReset(model, seed)


class ModuleReset:
    """fill(name, tensor) from the owning module's reset_parameters(), run on a real twin of
    that module (its own parameters only, fp32 on the CPU) under an RNG seeded from the
    module's name: a Linear's weight and bias come from one reset, as when built eagerly.
    The last twin is kept, so a module's parameters filled in turn cost one reset."""

    def __init__(self, model: nn.Module, seed: int):
        self.seed = seed
        self.owner: dict[str, tuple[str, nn.Module, str]] = {}
        for mname, m in model.named_modules():
            for local, _ in m.named_parameters(recurse=False):
                self.owner[f"{mname}.{local}" if mname else local] = (mname, m, local)
        self._twin: tuple[str, nn.Module] | None = None

    def __call__(self, name: str, t: torch.Tensor) -> None:
        mname, m, local = self.owner[name]
        if self._twin is None or self._twin[0] != mname:
            self._twin = (mname, self._reset_twin(name, mname, m))
        t.copy_(self._twin[1]._parameters[local].detach())

    def _reset_twin(self, name: str, mname: str, m: nn.Module) -> nn.Module:
        if not callable(getattr(m, "reset_parameters", None)):
            raise OutcoreError(
                f"parameter {name!r} is on the meta device and its module "
                f"({type(m).__name__}) has no reset_parameters(): give Engine(init=fn), "
                "fn(name, tensor) filling the fp32 tensor in place, or build it on the CPU")
        twin = copy.copy(m)   # shallow: children stay the (meta) originals, untouched
        twin._parameters = {k: None if p is None else
                            nn.Parameter(torch.empty(p.shape, dtype=torch.float32),
                                         requires_grad=p.requires_grad)
                            for k, p in m._parameters.items()}
        _seeded(mname, self.seed, twin.reset_parameters)
        return twin
