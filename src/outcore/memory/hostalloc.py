"""Host tensors on transparent huge pages.

`host_empty(shape)` is an uninitialized CPU tensor in an anonymous mapping advised
MADV_HUGEPAGE and aligned to 2 MiB, so the kernel backs it by 2 MiB pages where it can
(THP "always" or "madvise"; elsewhere it is ordinary memory). Pages are made on first
touch, as with torch.empty. Register it with `pin_` for the GPU's copies.
"""

from __future__ import annotations

import mmap
from math import prod

import torch

HUGE_PAGE = 2 << 20


def host_empty(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """shape (an int or a tuple): uninitialized, contiguous, in huge-page-advised memory
    where this system has it (Linux), else from torch.empty. The tensor keeps its
    mapping alive; the mapping goes with the last view of it."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = prod(shape) * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advise is None:
        return torch.empty(shape, dtype=dtype)
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(advise)
    except OSError:   # THP compiled out: ordinary pages, still one mapping
        pass
    whole = torch.frombuffer(m, dtype=torch.uint8)   # holds `m` while any view lives
    skip = (-whole.data_ptr()) % HUGE_PAGE
    return whole[skip:skip + nbytes].view(dtype).view(shape)
