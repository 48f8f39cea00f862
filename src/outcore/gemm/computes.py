"""The arithmetic a product may run in (`compute=`), and what each keeps on the device."""

from __future__ import annotations

import torch

# compute name -> (dtype the tiles are multiplied in, dtype they are accumulated in)
COMPUTE = {
    "fp64": (torch.float64, torch.float64),
    "fp32": (torch.float32, torch.float32),
    "tf32": (torch.float32, torch.float32),
    "tf32x3": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.float32),
    # one Strassen-Winograd level in the host dtype's own arithmetic (strassen.py; float32
    # shown, float64 data runs in float64): not the tiled path, not its plan
    "strassen": (torch.float32, torch.float32),
}
STRASSEN = "strassen"
# Computes whose cached blocks are each held as two parts, hi + lo (split.py): the cache
# takes twice the compute dtype's bytes per element.
SPLIT_COMPUTES = ("tf32x3",)
DEFAULT_COMPUTE = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16"}


def cached_itemsize(compute: str) -> int:
    """Bytes the block cache holds per element of op(A) or op(B) under `compute`."""
    return COMPUTE[compute][0].itemsize * (2 if compute in SPLIT_COMPUTES else 1)
