"""Host-resident training state: one flat fp32 buffer per group, params are views into it.

Per group g (numel n_g):
  master[g]: n_g fp32, page-locked (pinned) so host->device copies are true DMA; every
             Parameter of the user's model is re-pointed at a view of it, so the model's
             parameters *are* the master weights (no second fp32 copy exists)
  grad[g]:   n_g fp32, pinned, landing buffer for the device->host gradient copy; one per
             group when the step must wait for the global norm (clipping), else a small
             ring shared by all groups (the update of a group frees its buffer)
  copy[g]:   n_g in the compute dtype (16-bit), pinned, blocks only, when the engine keeps
             host copies (Engine(host_weight_copy=True)): what a pass that does not need
             fp32 weights loads (half the bytes over PCIe); refreshed after every update
AdamW m and v live in the optimizer (see optimizer.py), also flat per group.
"""

from __future__ import annotations

import torch

from ..errors import OutcoreError
from ..memory import PinnedPool, pin_
from .blocks import Group
from .materialize import Fill, repoint


def check_rebound_shape(name: str, p: torch.Tensor, shape: torch.Size) -> None:
    """p.data = t through `.model` with t of another shape than the engine's layout: one
    line (the flat buffers cannot take it)."""
    if p.shape != shape:
        raise OutcoreError(f"parameter {name!r} was given shape {tuple(p.shape)} through "
                           f".model, the engine trains {tuple(shape)}: build a new Engine "
                           "for a model of other shapes")


class HostState:
    """Flat per-group fp32 masters; see the module docstring for the layout."""

    def __init__(self, groups: list[Group], pin: bool, fill: Fill | None = None):
        """fill: given for a model built on the meta device (materialize.py): each
        parameter's initial values are written straight into its view."""
        self.groups = groups
        self.pin = pin
        self.master: list[torch.Tensor] = []
        for g in groups:
            flat = torch.empty(g.numel, dtype=torch.float32)
            flat = pin_(flat) if pin else flat  # before the views: pin_ may copy
            for name, p, off in zip(g.names, g.params, g.offsets):
                view = flat[off:off + p.numel()].view(p.shape)
                if fill is not None and p.is_meta:
                    fill(name, view)
                else:
                    view.copy_(p.detach())
                # Re-point the Parameter at the flat buffer: the old storage is freed, so
                # the host never holds two fp32 copies of the weights.
                repoint(p, view)
            self.master.append(flat)
        self.grad_pool = PinnedPool(pin=pin)
        self.copy: list[torch.Tensor | None] = [None] * len(groups)
        # groups whose copy is older than their master (a device update that did not send
        # one back: DeviceUpdater.lazy_copies); a pass loads their fp32 master instead
        self.stale: set[int] = set()

    def keep_copies(self, dtype: torch.dtype) -> None:
        """Hold a `dtype` copy of every block's master (not group 0's, which stays on the
        device), pinned, and fill it now."""
        for g in self.groups[1:]:
            c = torch.empty(g.numel, dtype=dtype)
            self.copy[g.index] = pin_(c) if self.pin else c
            self.refresh(g.index)

    def adopt_rebound(self, g: int) -> None:
        """After `.model` was handed out: a parameter of group g whose `.data` the user
        rebound (p.data = t) no longer views the master, and training would ignore it.
        Its values are copied into the master and it is re-pointed there; a new shape is
        refused in one line."""
        grp = self.groups[g]
        for name, p, view in zip(grp.names, grp.params, self.views(self.master[g], grp)):
            if p.data_ptr() == view.data_ptr() and p.shape == view.shape:
                continue
            check_rebound_shape(name, p, view.shape)
            view.copy_(p.detach())
            repoint(p, view)

    def refresh(self, g: int) -> None:
        """Group g's master changed on the host: bring its 16-bit copy up to date (the same
        round-to-nearest-even cast the device makes of the fp32 weights)."""
        if self.copy[g] is not None:
            self.copy[g].copy_(self.master[g])
        self.stale.discard(g)

    @property
    def numel(self) -> int:
        return sum(g.numel for g in self.groups)

    def views(self, flat: torch.Tensor, g: Group) -> list[torch.Tensor]:
        """Split a flat buffer of group g into tensors shaped like g's parameters."""
        return [flat[o:o + s.numel()].view(s) for s, o in zip(g.shapes, g.offsets)]

    def bytes(self) -> int:
        copies = sum(c.numel() * c.element_size() for c in self.copy if c is not None)
        return sum(m.numel() * 4 for m in self.master) + copies + \
            self.grad_pool.bytes_allocated
