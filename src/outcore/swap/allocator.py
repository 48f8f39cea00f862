"""Expandable segments in CUDA's caching allocator while a swap is open.

A swap keeps saved activations on the device up to its budget and frees them in backward
in another order than forward made them. Under torch's default allocator the freed blocks
stay cut up inside fixed segments, and the budget's edge is reached with gigabytes reserved
but unusable. Measured on the H200 (bench/swap.py, 16 GiB cap, session 49, two processes
each): wide_resnet101_2's largest batch under swap 182 and 193 with torch's default (the
GPU's memory the limit), 522 and 522 with expandable segments (the pinned host memory the
limit); ResNet-152 477-523 against 506-529; batch 64 throughput 0.99x PyTorch's either way.

So by default (SwapConfig.expandable_segments=None) the first open swap turns them on
(torch's allocator settings, the user's PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF kept)
and the last one to close turns them off again, unless the user's settings name
expandable_segments themselves or choose the cudaMallocAsync backend. True turns them on
whatever the settings say; False leaves the allocator alone. Segments made while they were
on stay expandable after; the setting is the process's, for every device.
"""

from __future__ import annotations

import os
import threading

import torch

_LOCK = threading.Lock()
_OPEN = 0                     # swaps holding expandable segments on
_RESTORE: str | None = None   # the settings to put back when the last one closes


def user_conf() -> str:
    """The allocator settings of the environment (torch reads the first set)."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if os.environ.get(name):
            return os.environ[name]
    return ""


def wanted(option: bool | None) -> bool:
    """Whether a swap with SwapConfig.expandable_segments=`option` turns them on."""
    if option is False or not torch.cuda.is_available():
        return False
    conf = user_conf()
    if "cudaMallocAsync" in conf:   # not the caching allocator: no segments to expand
        return False
    return option is True or "expandable_segments" not in conf


def _apply(settings: str) -> None:
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:   # torch before the accelerator API (2.4-2.8)
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


class ExpandableSegments:
    """One swap's hold on expandable segments (on from construction until release())."""

    def __init__(self, option: bool | None):
        global _OPEN, _RESTORE
        self.held = wanted(option)
        if not self.held:
            return
        with _LOCK:
            if _OPEN == 0:
                conf = user_conf()
                _RESTORE = conf if "expandable_segments" in conf else \
                    ",".join(filter(None, (conf, "expandable_segments:False")))
                try:
                    _apply(",".join(filter(None, (conf, "expandable_segments:True"))))
                except (AttributeError, RuntimeError):
                    # a torch without the setter, or settings it refuses: swap without
                    self.held = False
                    return
                if torch.cuda.is_initialized():
                    # cached free segments were made fixed: let later allocations come
                    # from expandable ones (a host sync, once, at the swap's start)
                    torch.cuda.empty_cache()
            _OPEN += 1

    def release(self) -> None:
        global _OPEN
        if not self.held:
            return
        self.held = False
        with _LOCK:
            _OPEN -= 1
            if _OPEN == 0 and _RESTORE is not None:
                _apply(_RESTORE)
