"""Splitting a batch's tensors into micro-batches along dim 0, and joining them back."""

from __future__ import annotations

import torch


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
