"""Activation checkpoints at block boundaries: on the device while they fit, else host.

Each block's input (B x T x D for a decoder) is kept for the recompute in backward. While
the device has room under its budget it stays there; beyond that it is copied to a pinned
host buffer on the d2h stream and fetched back (prefetched one block ahead) in backward.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import OutcoreError
from ..memory import PinnedPool
from ..transfer import Lanes


class ActivationStash:
    """put(g, x) in forward, prefetch(g) / take(g) in backward; see module docstring.

    limit: device bytes of checkpoints beyond which new ones go to the host; None keeps
    everything on the device.
    """

    def __init__(self, lanes: Lanes, pool: PinnedPool):
        self.lanes = lanes
        self.pool = pool
        self.limit: int | None = None
        self._dev: dict[int, torch.Tensor] = {}
        self._host: dict[int, tuple[torch.Tensor, torch.Size, torch.dtype, object]] = {}
        self._back: dict[int, tuple[torch.Tensor, object]] = {}
        self.bytes_offloaded = 0
        self.device_bytes = 0
        self.peak_device_bytes = 0
        # Bytes that share the checkpoints' room on the device (keep.py's kept weights).
        self.beside: Callable[[], int] = lambda: 0

    def held_bytes(self) -> int:
        """Device bytes of the checkpoints and of what shares their room."""
        return self.device_bytes + self.beside()

    def put(self, g: int, x: torch.Tensor) -> None:
        if g in self._dev or g in self._host:
            raise OutcoreError(
                f"streamed block {g} ran twice in one forward (one layer used at two places): "
                "each block streams once a step; keep the shared layer outside the blocks or "
                "give each place its own layer")
        nbytes = x.numel() * x.element_size()
        # `limit` is the room left for checkpoints beside everything else the step needs at
        # its peak (Engine._stash_limit), so it is compared with the checkpoints' own bytes.
        if self.limit is None or self.held_bytes() + nbytes <= self.limit:
            self._dev[g] = x
            self.device_bytes += nbytes
            self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)
            return
        buf = self.pool.get(x.numel(), x.dtype)
        with self.lanes.on(self.lanes.d2h):
            # Stream wait: x is produced on the compute stream; copy it once it exists.
            self.lanes.wait(self.lanes.d2h, self.lanes.event())
            buf.copy_(x.reshape(-1), non_blocking=True)
            done = self.lanes.event(self.lanes.d2h)
        if self.lanes.cuda:
            # Buffer reuse: x's memory may be reused only after the d2h stream read it.
            x.record_stream(self.lanes.d2h)
        self._host[g] = (buf, x.shape, x.dtype, done)
        self.bytes_offloaded += nbytes

    def prefetch(self, g: int) -> None:
        """Start bringing checkpoint g back to the device (no-op if it is there)."""
        if g not in self._host or g in self._back:
            return
        buf, shape, dtype, done = self._host[g]
        with self.lanes.on(self.lanes.h2d):
            # Stream wait: the device->host copy must have finished before copying back.
            self.lanes.wait(self.lanes.h2d, done)
            x = torch.empty(shape, dtype=dtype, device=self.lanes.device)
            x.view(-1).copy_(buf, non_blocking=True)
            ready = self.lanes.event(self.lanes.h2d)
        self._back[g] = (x, ready)

    def take(self, g: int) -> torch.Tensor:
        """Checkpoint g on the device, usable on the compute stream; forgets it."""
        if g in self._dev:
            x = self._dev.pop(g)
            self.device_bytes -= x.numel() * x.element_size()
            return x
        self.prefetch(g)
        x, ready = self._back.pop(g)
        buf, _, _, _ = self._host.pop(g)
        self.lanes.wait(self.lanes.compute, ready)  # stream wait: checkpoint landed
        if self.lanes.cuda:
            # Buffer reuse: x was allocated on the h2d stream and is used on compute.
            x.record_stream(self.lanes.compute)
        self.pool.put(buf, ready)
        return x

    def clear(self) -> None:
        self._dev.clear()
        self._back.clear()
        for buf, _, _, done in self._host.values():
            self.pool.put(buf, done)
        self._host.clear()
        self.device_bytes = 0
