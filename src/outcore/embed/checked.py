"""Edge lists that `read_edges` validated, so `EmbeddingTrainer.fit` skips its second full
pass over them (ids in 0..num_nodes-1: 4 passes over the ids; weights finite, >= 0 and not
all zero: 3 over the weights; together seconds at 2e9 edges).

Skipping stays safe when the user changes the EdgeList afterwards: `mark` makes the arrays
read-only (their bases too) and remembers the very arrays and num_nodes it vouches for, so
- writing into an array in place fails (numpy: "assignment destination is read-only");
- setting an array writeable again, or assigning another array or num_nodes (as --holdout
  does), voids the mark: fit checks that EdgeList in full, as a hand-built one.
Training only reads the edge arrays; `host_tensor` wraps read-only ones for torch.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def mark(el):
    """Vouch for el (just validated): freeze its arrays and remember them."""
    arrays = (el.src, el.dst, el.weight)
    for a in arrays:
        while isinstance(a, np.ndarray):     # a view's base too: no way to write through it
            a.flags.writeable = False
            a = a.base
    el._checked = (*arrays, el.num_nodes)
    return el


def is_checked(el) -> bool:
    """Whether el holds exactly what `mark` vouched for, unchanged since."""
    m = getattr(el, "_checked", None)
    if m is None:
        return False
    arrays = (el.src, el.dst, el.weight)
    n, was = el.num_nodes, m[3]
    return (all(a is b for a, b in zip(arrays, m)) and type(n) is type(was) and n == was
            and not any(isinstance(a, np.ndarray) and a.flags.writeable for a in arrays))


def host_tensor(arr: np.ndarray) -> torch.Tensor:
    """torch.from_numpy for an array that is only read, without torch's 'not writable'
    warning for a read-only one (see `mark`): DLPack carries the read-only flag; an older
    numpy refuses to export read-only arrays that way, and the warning is silenced."""
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    try:
        return torch.from_dlpack(arr)
    except (BufferError, TypeError, RuntimeError):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(arr)
