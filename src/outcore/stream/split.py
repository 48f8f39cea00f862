"""Splitting a batch's tensors into micro-batches along dim 0, and joining them back."""

from __future__ import annotations

import functools
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


def block_input(mod: nn.Module, name: str, args: tuple, kw: dict):
    """(hidden, other positional args) of a call of streamed block `mod` (kw: its keyword
    arguments, the hidden state popped from them when passed by name). Refuses, in one
    line, other arguments that carry a gradient: BlockFn hands backward's gradient to the
    hidden state and the block's own parameters only, so theirs would be dropped."""
    if args:
        hidden, rest = args[0], args[1:]
    else:
        first = _input_name(type(mod))
        key = first if first in kw else "hidden_states"
        if key not in kw:
            raise OutcoreError(f"block {name!r} was called with no input (keywords "
                               f"{sorted(kw)}): pass its hidden state first, as "
                               f"block(hidden, ...) or block({first}=hidden, ...)")
        hidden, rest = kw.pop(key), ()
    if not isinstance(hidden, torch.Tensor):
        raise OutcoreError(f"block {name!r} was called with a {type(hidden).__name__} as its "
                           "input: a streamed block takes the hidden state tensor first")
    if torch.is_grad_enabled():
        grad = _grad_arg(rest, "") or _grad_arg(kw, "")
        if grad is not None:
            raise OutcoreError(
                f"block {name!r} gets argument {grad}, which needs a gradient: the engine "
                "passes gradients through a block's hidden state and its own weights only; "
                "compute it inside the block, or .detach() it to train without that path")
    return hidden, rest


@functools.lru_cache(maxsize=None)
def _input_name(cls: type) -> str:
    """The name of cls.forward's first parameter after self (once per block class: a
    block called by keyword is called so every step)."""
    try:
        return next(iter(list(inspect.signature(cls.forward).parameters)[1:]),
                    "hidden_states")
    except (TypeError, ValueError):   # a builtin or C forward: no names to match
        return "hidden_states"


def _grad_arg(obj, where: str) -> str | None:
    """The position of the first tensor in `obj` (nested tuples/lists/dicts) that requires
    grad, as a readable string ('#1', 'mask', 'cache[0]'), or None."""
    if isinstance(obj, torch.Tensor):
        return where or "?" if obj.requires_grad else None
    if isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            got = _grad_arg(o, f"{where}[{i}]" if where else f"#{i + 1}")
            if got is not None:
                return got
    elif isinstance(obj, dict):
        for k, o in obj.items():
            got = _grad_arg(o, f"{where}[{k!r}]" if where else str(k))
            if got is not None:
                return got
    return None


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
        # The engine hands the model None in place of the entries after the first (only
        # the hidden state crosses BlockFn): a tensor there (an auxiliary loss, router
        # logits) would vanish from the model's sums without a word.
        more = next((i for i, o in enumerate(out) if i and isinstance(o, torch.Tensor)), None)
        if more is not None:
            raise OutcoreError(f"a streamed block returned a tensor at [{more}] of its output "
                               "tuple, which the engine replaces with None (only the hidden "
                               "state crosses a block): return the hidden state alone")
        return out[0], len(out)
    raise TypeError(f"a streamed block must return a tensor or a tuple starting with one, "
                    f"got {type(out).__name__}")
