"""The caller's inference mode for the product's own threads.

torch keeps inference mode per thread, and a tensor made under it may be written in place
only under it. `outcore.matmul` called inside `torch.inference_mode()` (or with an `out` made
there) writes tiles of out from worker, writer and band threads, which start outside it:
each enters the mode its caller was in.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch


def caller_mode() -> Callable[[], ContextManager]:
    """In the calling thread: a context factory that a new thread enters first."""
    if torch.is_inference_mode_enabled():
        return lambda: torch.inference_mode(True)
    return contextlib.nullcontext
