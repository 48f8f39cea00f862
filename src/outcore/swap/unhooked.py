"""Forwards that need no swapping run with no saved-tensor hooks at all.

Packing costs Python work per saved tensor (about 23 ms a step for ResNet-152's ~1000
on the H200 run), so a forward that will keep everything on the device skips it: when its
inputs' signature (signature.py) equals that of the last forward that kept every
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
        bytes (the profile) still fit each device's room under the budget (`policy.room`)
        with what is allocated now. Packing costs Python work per saved tensor; skipping
        it makes a step that fits as fast as plain PyTorch. On True, each CUDA device's
        allocated bytes and room are kept for end_unhooked (measured once, here)."""
        if signature is None or signature != self._fit_sig or not self._states:
            return False
        rooms = {}
        for dev, st in self._states.items():
            alloc = torch.cuda.memory_allocated(dev) if st.cuda else 0
            room = st.policy.room(alloc, self.pending_grad(dev))
            if room is None or sum(st.policy.profile) > room:
                return False
            if st.cuda:
                rooms[dev] = (alloc, room)
        self._unhooked_room = rooms
        return True

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
