"""LMS-style tensor swapping for any PyTorch model: `outcore.swap(model, gpu_memory=...)`.

Saved activations (and, opt-in, parameters of modules not running) go to pinned host
memory and come back just before backward (or forward) needs them, copies overlapped with
compute. See context.py for usage, policy.py for what is swapped, report.py for the report.
"""

from .config import SwapConfig
from .context import Swap, swap
from .host import HostStore
from .report import SwapReport

__all__ = ["swap", "Swap", "SwapConfig", "SwapReport", "HostStore"]
