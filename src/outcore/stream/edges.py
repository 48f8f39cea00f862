"""The step's two small transfers: the batch in, the loss out, neither stalling the host.

A pageable host->device copy blocks the host until the copy engine has taken it, and
`loss.item()` at the end of a step waits behind every device->host copy queued before it
(on the H200, the ~2.4 GB write-back of the last device-side AdamW: ~49 ms per 3B step with
the compute stream idle). So:
  batch  staged through pinned buffers, copied with non_blocking on the compute stream
  loss   copied into a pinned scalar on the d2h stream as soon as the forward has made it,
         long before the step's gradients and write-backs take that stream; the step's
         end waits only for that copy
"""

from __future__ import annotations

import torch

from ..memory import PinnedPool
from ..transfer import Lanes, host_wait


class StepEdges:
    """to_device(batch entry) at the step's start, post_loss(loss) after the forward,
    loss_value() at the step's end."""

    def __init__(self, lanes: Lanes, pool: PinnedPool):
        self.lanes = lanes
        self.pool = pool
        self._loss: torch.Tensor | None = None     # device scalar (CPU: the loss itself)
        self._host = None                          # pinned fp32 scalar it is copied into
        self._ready = None                         # event: that copy has landed

    def to_device(self, v):
        """A batch entry on the compute device; tensors already there pass through."""
        if not isinstance(v, torch.Tensor):
            return v
        dev = self.lanes.device
        if not self.lanes.cuda or v.device == dev:
            return v.to(dev)
        if v.device.type != "cpu" or v.is_pinned():
            return v.to(dev, non_blocking=True)
        buf = self.pool.get(v.numel(), v.dtype)
        buf.copy_(v.reshape(-1))                   # host memcpy into pinned memory
        out = buf.view(v.shape).to(dev, non_blocking=True)
        # Buffer reuse: the staging buffer is free once the compute stream's copy read it.
        self.pool.put(buf, after=self.lanes.event())
        return out

    def post_loss(self, loss: torch.Tensor) -> None:
        """Start copying the step's loss (a scalar on the device) to the host."""
        self._loss = loss.detach()
        if not self.lanes.cuda:
            return
        if self._host is None:
            self._host = torch.empty(1, dtype=torch.float32).pin_memory()
        # The last step's value was read (loss_value) before this step began, so the
        # pinned scalar is free to overwrite.
        lanes = self.lanes
        with lanes.on(lanes.d2h):
            # Stream wait: the loss is produced on the compute stream.
            lanes.wait(lanes.d2h, lanes.event())
            self._host.copy_(self._loss.reshape(1).float(), non_blocking=True)
            self._ready = lanes.event(lanes.d2h)
        # Buffer reuse: the loss's memory may be recycled only after the d2h copy read it.
        self._loss.record_stream(lanes.d2h)

    def loss_value(self) -> float:
        """The posted loss as a float (a host wait on its copy alone)."""
        if not self.lanes.cuda:
            return self._loss.item()
        host_wait(self._ready)  # host sync: the step's loss, once per step
        return float(self._host[0])
