"""A host matrix (torch CPU tensor, numpy array or memmap) seen in its storage order.

    S: R x C, the matrix as it lies in memory: row-major with a row pitch when either stride
    is 1 (a column-major matrix is stored as its transpose, `flipped`), any strides else.

Blocks are read and written as 2-D regions of S. A region of a pinned S with unit inner
stride can be copied by DMA directly (one 2-D copy); anything else goes through a pinned
staging buffer with a host memcpy first.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import torch

_NP_TO_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def _cuda_ok() -> bool:
    return torch.cuda.is_available()


class HostMatrix:
    """One operand or output, normalized to storage order; see the module docstring.

    `t` is a torch view of S (zero-copy, numpy included) or None for numpy arrays torch
    cannot view (negative strides), which are then read and written through numpy.
    """

    def __init__(self, x, name: str):
        self.name = name
        self.np: np.ndarray | None = None
        self.t: torch.Tensor | None = None
        if isinstance(x, np.ndarray):
            self.dtype = _NP_TO_TORCH[x.dtype]
            try:
                with warnings.catch_warnings():
                    # read-only memmaps: we never write through views of inputs
                    warnings.simplefilter("ignore", UserWarning)
                    t = torch.from_numpy(x) if x.size else torch.empty(x.shape, dtype=self.dtype)
            except (ValueError, RuntimeError):
                t = None
                self.np = x
        else:
            t = x.detach()
            self.dtype = t.dtype
        self.flipped = False
        if t is not None:
            r, c = t.shape
            if c > 1 and t.stride(1) != 1 and (r == 1 or t.stride(0) == 1):
                t, self.flipped = t.t(), True
            self.t = t
        self.shape = tuple(self.t.shape if self.t is not None else self.np.shape)
        self.pinned = bool(self.t is not None and self.t.numel() and _cuda_ok()
                           and self.t.is_pinned())
        self.rowmajor = self.t is not None and (self.shape[1] <= 1 or self.t.stride(1) == 1)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def region(self, r0: int, r1: int, c0: int, c1: int) -> "HostMatrix":
        """S[r0:r1, c0:c1] as a HostMatrix of its own, sharing S's memory (pinning and
        row-major layout carry over: a slice keeps the unit inner stride)."""
        sub = copy.copy(self)
        if self.t is not None:
            sub.t = self.t[r0:r1, c0:c1]
        else:
            sub.np = self.np[r0:r1, c0:c1]
        sub.shape = (r1 - r0, c1 - c0)
        return sub

    def view(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor | None:
        """S[r0:r1, c0:c1] as a torch view, or None (numpy-only matrix)."""
        return None if self.t is None else self.t[r0:r1, c0:c1]

    def direct(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor | None:
        """The region if a DMA engine can copy it as it lies (pinned, unit inner stride)."""
        if not (self.pinned and self.rowmajor):
            return None
        return self.t[r0:r1, c0:c1]

    def read_into(self, region: tuple[int, int, int, int], dst: torch.Tensor) -> None:
        """dst (a CPU or device tensor of the region's shape) <- S[region] (dtype converted)."""
        r0, r1, c0, c1 = region
        if self.t is not None:
            dst.copy_(self.t[r0:r1, c0:c1])
        else:
            dst.copy_(torch.from_numpy(self.np[r0:r1, c0:c1].copy(order="C")))

    def write_from(self, region: tuple[int, int, int, int], src: torch.Tensor) -> None:
        """S[region] <- src (a CPU tensor of the region's shape)."""
        r0, r1, c0, c1 = region
        if self.t is not None:
            self.t[r0:r1, c0:c1].copy_(src)
        else:
            self.np[r0:r1, c0:c1] = src.to(torch.float64 if self.dtype == torch.float64
                                            else torch.float32).numpy()
