"""The AdamW m and v of a few device-updated blocks, kept on the device between steps.

Opt-in (`DeviceUpdater.resident_mv = N`). A device-updated block streams its m and v in
before its update and out after it (8 B/param each way); in session 14's profile of
3b-16k on the H200 that traffic, in the stretch of backward where every block updates on
the device, is where the whole step's idle compute time was. The first N device blocks
backward reaches keep theirs on the device instead (8 B/param of device memory each).
The host's m, v of such a block are stale until `sync()` (Engine.synchronize: a
checkpoint, the model handed out) or `write_back(g)` (its AdamW goes back to the CPU, or
it is no longer among the first N). Measured: no faster at 3b-16k in 14.5 GiB, where the
memory it takes pushed checkpoints to the host (bench/NOTES.md, session 14).
"""

from __future__ import annotations

import torch


class ResidentMV:
    """`count` blocks' device m, v: wanted(g), held(g), allocate(g), write_back(g), sync()."""

    def __init__(self, updater):
        self.u = updater
        self.count = 0
        self._held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def blocks(self) -> list[int]:
        return sorted(self._held)

    def wanted(self, g: int) -> bool:
        """Should g's m, v stay on the device: one of the first `count` device blocks of
        backward (the highest), never rest?"""
        groups = self.u.groups
        if not g or g not in groups or not self.count:
            return False
        return g in sorted((b for b in groups if b), reverse=True)[:self.count]

    def held(self, g: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._held.get(g)

    def allocate(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """g's m, v copied to buffers of their own on the device, held from now on. Called
        on the h2d stream (DeviceUpdater.prefetch); used and updated on compute only after
        (a buffer of their own on a CPU device too, where .to() would alias the host's)."""
        e, opt = self.u.e, self.u.e.opt
        m = torch.empty_like(opt.m[g], device=e.lanes.device)
        v = torch.empty_like(opt.v[g], device=e.lanes.device)
        m.copy_(opt.m[g], non_blocking=True)
        v.copy_(opt.v[g], non_blocking=True)
        self._held[g] = (m, v)
        if getattr(e, "_other_peak", None) is not None:
            e._other_peak += 8 * m.numel()   # held from now on (see DeviceUpdater.enable)
        return m, v

    def release_unwanted(self) -> None:
        for g in [g for g in self._held if not self.wanted(g)]:
            self.write_back(g)   # no longer among the first `count` (the groups changed)

    def write_back(self, g: int) -> None:
        """g's m, v back to the host, its device buffers freed after that copy."""
        mv = self._held.pop(g, None)
        if mv is None:
            return
        self._copy_out(g, *mv)
        if self.u.e.lanes.cuda:
            for t in mv:   # buffer reuse: freed only after the d2h stream read them
                t.record_stream(self.u.e.lanes.d2h)

    def sync(self) -> None:
        """The host's m, v current for every held block; the device's stay in use (their
        next update waits for this copy: DeviceUpdater.ready_events)."""
        for g, (m, v) in self._held.items():
            self._copy_out(g, m, v)

    def _copy_out(self, g: int, m: torch.Tensor, v: torch.Tensor) -> None:
        lanes, opt = self.u.e.lanes, self.u.e.opt
        with lanes.on(lanes.d2h):
            # Stream wait: the last update of m, v was enqueued on the compute stream.
            lanes.wait(lanes.d2h, lanes.event())
            opt.m[g].copy_(m, non_blocking=True)
            opt.v[g].copy_(v, non_blocking=True)
            self.u.ready_events[g] = lanes.event(lanes.d2h)
