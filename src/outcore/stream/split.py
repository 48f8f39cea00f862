"""Splitting a batch's tensors into micro-batches along dim 0, and joining them back."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..errors import OutcoreError


def split_like(obj, batch: int, n: int, size: int):
    """Split every tensor in `obj` (nested tuples/lists/dicts) whose dim 0 is `batch` into
    n pieces of `size` rows; other leaves (broadcast masks, rotary tables, None) repeat.

    Returns a list of n objects shaped like `obj`. 1-d tensors are never split: a sequence
    axis (cache_position) could have the batch's length by coincidence.
    """
    if isinstance(obj, torch.Tensor):
        if obj.dim() >= 2 and obj.shape[0] == batch and n > 1:
            return list(torch.split(obj, size, dim=0))
        return [obj] * n
    if isinstance(obj, (tuple, list)):
        parts = [split_like(o, batch, n, size) for o in obj]
        return [type(obj)(p[i] for p in parts) for i in range(n)]
    if isinstance(obj, dict):
        parts = {k: split_like(v, batch, n, size) for k, v in obj.items()}
        return [{k: v[i] for k, v in parts.items()} for i in range(n)]
    return [obj] * n


def positional_names(mod: nn.Module) -> list[str]:
    """The names of mod.forward's positional parameters after the hidden state (the first)."""
    try:   # after self and the hidden state
        params = list(inspect.signature(type(mod).forward).parameters.values())[2:]
    except (TypeError, ValueError):   # a builtin or C forward: no names to match
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_shared(shared, blocks: list[nn.Module]) -> frozenset[str]:
    """Engine(shared_args=...): names of block arguments that are never split, checked
    against the blocks' forward signatures (a typo would split silently)."""
    if shared is None:
        return frozenset()
    if isinstance(shared, str):
        shared = (shared,)
    names = list(shared) if isinstance(shared, (tuple, list, set, frozenset)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise OutcoreError(f"shared_args={shared!r}: pass argument names of the blocks' "
                           "forward, for example shared_args=('freqs_cis',)")
    known: set[str] = set()
    for mod in blocks:
        try:
            sig = inspect.signature(type(mod).forward)
        except (TypeError, ValueError):
            return frozenset(names)
        if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            return frozenset(names)     # **kwargs: any name may come
        known.update(list(sig.parameters)[2:])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OutcoreError(f"shared_args names {unknown[0]!r}, which no block's forward "
                           f"takes: use one of {sorted(known)}")
    return frozenset(names)


def split_extra(extra, names: list[str], shared: frozenset[str], batch: int, n: int,
                size: int) -> list:
    """A block's (args, kwargs) after the hidden state as n micro-batches: split_like on
    each, but the arguments named in `shared` (by the forward's parameter name) repeat,
    so a shared table whose first dim equals the batch size by chance stays whole."""
    args, kwargs = extra
    if not shared:
        return split_like(extra, batch, n, size)
    a = [[x] * n if i < len(names) and names[i] in shared else split_like(x, batch, n, size)
         for i, x in enumerate(args)]
    k = {key: [v] * n if key in shared else split_like(v, batch, n, size)
         for key, v in kwargs.items()}
    return [(tuple(p[i] for p in a), {key: v[i] for key, v in k.items()}) for i in range(n)]


def n_micro(batch: int, size: int | None) -> tuple[int, int]:
    """(number of micro-batches, rows each) for a batch of `batch` rows."""
    if size is None or size >= batch:
        return 1, batch
    return (batch + size - 1) // size, size


def first_tensor(out):
    """The hidden state of a block's output: the tensor itself or the first of a tuple."""
    if isinstance(out, torch.Tensor):
        return out, None
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], len(out)
    raise TypeError(f"a streamed block must return a tensor or a tuple starting with one, "
                    f"got {type(out).__name__}")
