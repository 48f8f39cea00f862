"""Forwards that need no swapping run with no saved-tensor hooks at all.

Packing costs Python work per saved tensor (about 23 ms a step for ResNet-152's ~1000
on the H200 run), so a forward that will keep everything on the device skips it: when its
inputs' signature (context.signature) equals that of the last forward that kept every
saved tensor, and that forward's saved bytes still fit each device's budget with what is
allocated now. An unhooked forward vouches for the next one only if it succeeded and, on
CUDA, kept no more than the room the budget gave it.

A mixin of ActivationSwapper: it uses its per-device states (`_states`), `pending_grad`,
and the signatures `_sig` (the forward being packed) and `_fit_sig` (the last that kept
everything), which `begin_forward`/`end_forward` set.
"""

from __future__ import annotations

import torch


class UnhookedForwards:
    """Whether a forward may run unhooked, and whether an unhooked one vouches for the next."""

    def fits_unhooked(self, signature) -> bool:
        """True when a forward with these inputs needs no hooks at all: the last forward
        with the same input signature kept every saved tensor on the device, and its saved
        bytes still fit each device's budget with what is allocated now. Packing costs
        Python work per saved tensor; skipping it makes a step that fits as fast as plain
        PyTorch."""
        if signature is None or signature != self._fit_sig or not self._states:
            return False
        for dev, st in self._states.items():
            alloc = torch.cuda.memory_allocated(dev) if st.cuda else 0
            if not st.policy.fits(alloc, self.pending_grad(dev)):
                return False
        return True

    def begin_unhooked(self) -> None:
        """An unhooked forward starts: note each device's allocated bytes and the room its
        saved tensors have under the budget."""
        self._unhooked_room = {}
        for d, st in self._states.items():
            if st.cuda:
                alloc = torch.cuda.memory_allocated(d)
                self._unhooked_room[d] = (alloc, st.policy.room(alloc, self.pending_grad(d)))

    def end_unhooked(self, failed: bool) -> None:
        """An unhooked forward ended. It vouches for the next one only if it succeeded and
        what it kept on each device still fit that room: the same input shapes can save
        more (routing, masks), and an out-of-memory retry must run hooked."""
        if failed:
            self._fit_sig = None
            return
        for d, (before, room) in getattr(self, "_unhooked_room", {}).items():
            if room is None or torch.cuda.memory_allocated(d) - before > room:
                self._fit_sig = None
