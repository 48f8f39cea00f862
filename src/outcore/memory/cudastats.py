"""The CUDA caching allocator's byte counts, read once.

torch.cuda.memory_reserved and torch.cuda.memory_allocated each call
torch.cuda.memory_stats, which flattens the allocator's whole nested stats dict in Python
(about 640 calls each). A gemm product read them four times before its first copy: 1.3
ms of host time before fp32-16384's first copy and 0.9 ms before an 18 ms bf16 product's
on the H200 (bench/results/host-setup-h200.json). The nested dict, read once, has both.
"""

from __future__ import annotations

import torch


def cuda_index(device: torch.device) -> int:
    """The index of CUDA `device` ("cuda" alone: the current device's)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def cached_unused_bytes(device: torch.device) -> int:
    """Bytes the caching allocator holds reserved on `device` but not allocated (0 before
    it has allocated anything)."""
    st = torch.cuda.memory.memory_stats_as_nested_dict(device)
    if not st:
        return 0
    return st["reserved_bytes"]["all"]["current"] - st["allocated_bytes"]["all"]["current"]
