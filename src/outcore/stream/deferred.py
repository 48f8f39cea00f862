"""Held updates applied on the device, when the next forward loads the block.

With clipping or skip_nonfinite every update waits for the step's global gradient norm,
so the CPU AdamW (about 2.5 G params/s under copy traffic) runs after backward, and the
next forward waits for it block by block. For the blocks chosen here the update is instead
made on the device by the next forward's load of the block (DeviceCache.fill):
  h2d  the weights p (as every load), then, chunk by chunk, m, v and the gradient held in
       pinned host memory since its backward (12 B/param more)
  dev  fused AdamW with the step's clip coefficient, on the h2d stream: after the chunk's
       copies, before the forward, which waits for the slot's copy event
  d2h  p, m, v (12 B/param) into the host buffers; the next load of p waits for that
The CPU meanwhile updates the other blocks, so the two halves run at once.

Anything that reads the host masters (engine.model, save, close) first calls `flush()`,
which applies on the CPU what is still pending: the same AdamW step, with the same scale.
"""

from __future__ import annotations

import torch

from ..errors import OutcoreError
from ..memory import pin_
from ..transfer import host_wait
from .device_choice import backlog_groups
from .optimizer import inverse_scale
from .ring import Ring

CHUNKS = 4      # a block's m, v, gradient cross in this many pieces, double-buffered
MAX_SHARE = 0.6  # of the blocks' parameters updated this way at most ('auto')


def check_option(v, hold_updates: bool, cuda: bool):
    """Engine(held_gpu_updates=...): 0 (off), 'auto' (blocks added while the next forward
    waits for CPU updates; CUDA with held updates only) or a number of blocks (1..k)."""
    if v in (None, 0, "off"):
        return 0
    if v == "auto":
        return "auto" if cuda and hold_updates else 0
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        if not hold_updates:
            raise OutcoreError("held_gpu_updates needs held updates (max_grad_norm or "
                               "skip_nonfinite); without them use gpu_updates")
        return v
    raise OutcoreError(f"held_gpu_updates={v!r}: use 0, 'auto' or a number of blocks")


class DeferredUpdates:
    """Which blocks update this way, their held and pending gradients, the chunk buffers."""

    def __init__(self, engine):
        self.e = engine
        self.groups: set[int] = set()
        self._held: dict[int, tuple] = {}      # g -> (hbuf, hsq, done) of this backward
        self.pending: dict[int, tuple] = {}    # g -> (hbuf, hsq, done, scale, lr), released
        self._ring: Ring | None = None
        self._chunk = 0
        self._base_fill = None
        self.applied_on_device = 0             # updates made by fill (tests, stats)
        self.applied_on_host = 0               # updates made by flush
        self.bytes_h2d = self.bytes_d2h = 0

    def enable(self, gs) -> list[int]:
        """Update blocks gs (>= 1) this way from the next backward on; returns those added."""
        e, added = self.e, []
        for g in gs:
            if 1 <= g < len(e.groups) and g not in self.groups and e.groups[g].numel:
                if e.lanes.cuda:
                    # Host wait ('auto' enables between steps): g's CPU update of this step
                    # may be running on the worker, and pin_ copies a small m, v (< 4 MiB):
                    # the copy must not be taken while the worker still writes the old one.
                    e.schedule.wait(g)
                    # Pinned once: DMA in and out every step.
                    e.opt.m[g] = pin_(e.opt.m[g])
                    e.opt.v[g] = pin_(e.opt.v[g])
                self.groups.add(g)
                added.append(g)
        if self.groups and self._ring is None:
            block = e.cache.slots[0].buf.numel()
            # chunks start at multiples of 256 elements (1 KiB): aligned for the fused
            # kernel's vectorised path
            self._chunk = -(-block // (CHUNKS * 256)) * 256
            self._ring = Ring(e.lanes, 2, 3 * self._chunk)
            if e._other_peak is not None:   # the next step's stash limit must leave room
                e._other_peak += self._ring.bytes()
            self._base_fill = e.cache.fill
            e.cache.fill = self.fill
        return added

    def plan(self, step_s: float, opt_wait_s: float, cpu_busy_s: float,
             cpu_params: int) -> list[int]:
        """Feedback ('auto'): the next forward waited for CPU updates, so that many more
        parameters' blocks move here, from block 1 on (their loads come first), up to
        MAX_SHARE of the blocks' parameters (each costs the forward 24 B/param of copies)."""
        e = self.e
        cap = MAX_SHARE * sum(grp.numel for grp in e.groups[1:])
        have = sum(e.groups[g].numel for g in self.groups)
        picked = []
        for g in backlog_groups(e.groups, self.groups, range(1, len(e.groups)), step_s,
                                opt_wait_s, cpu_busy_s, cpu_params):
            if have + e.groups[g].numel > cap:
                break
            picked.append(g)
            have += e.groups[g].numel
        return self.enable(picked)

    def bytes(self) -> int:
        return self._ring.bytes() if self._ring is not None else 0

    # ---- the step's side ------------------------------------------------------------------
    def hold(self, g: int, payload) -> bool:
        """Keep group g's gradient (pinned host copy) for the next load; False if g is not
        one of these blocks (then the CPU schedule takes it)."""
        if g not in self.groups:
            return False
        self._held[g] = payload
        return True

    def release(self, scale: float) -> None:
        """The step's norm is known: this backward's gradients become pending updates, with
        the step's learning rate (the load that applies one may come after a set_lr: a block
        skipped by the next forward is loaded only by its backward prefetch, or flushed)."""
        lr = self.e.opt.lr
        for g, (hbuf, hsq, done) in self._held.items():
            if g in self.pending:    # never loaded since its last step: apply that one first
                self._apply_on_host(g)
            self.pending[g] = (hbuf, hsq, done, scale, lr)
        self._held.clear()

    def drop(self) -> None:
        """A skipped step (non-finite norm): forget this backward's gradients."""
        pool = self.e.host.grad_pool
        for hbuf, hsq, done in self._held.values():
            # Buffer reuse: once the d2h copies into them are done.
            pool.put(hbuf, after=done)
            pool.put(hsq, after=done)
        self._held.clear()

    # ---- the load (DeviceCache.fill, on the h2d stream) -----------------------------------
    def fill(self, g: int, dst: torch.Tensor, master: torch.Tensor):
        """DeviceCache.fill, then g's pending update if any; returns the event after which
        the d2h stream no longer reads dst (the slot waits for it before its next fill)."""
        base = self._base_fill(g, dst, master)
        item = self.pending.pop(g, None)
        if item is None:
            return base
        hbuf, hsq, done, scale, lr = item
        e, lanes = self.e, self.e.lanes
        h2d, d2h = lanes.h2d, lanes.d2h
        lanes.wait(h2d, done)      # stream wait: the gradient's d2h into hbuf has landed
        n, c = dst.numel(), self._chunk
        # the clip coefficient, applied by the kernel as the CPU path applies it
        inv = inverse_scale(scale, dst.device) if scale != 1.0 else None
        for a in range(0, n, c):
            b = min(a + c, n)
            i, buf = self._ring.take(h2d)   # stream wait inside: the buffer's last d2h
            m, v, grad = buf[:b - a], buf[c:c + b - a], buf[2 * c:2 * c + b - a]
            m.copy_(e.opt.m[g][a:b], non_blocking=True)
            v.copy_(e.opt.v[g][a:b], non_blocking=True)
            grad.copy_(hbuf[a:b], non_blocking=True)
            # Enqueued on the h2d stream: after this chunk's copies, before the slot's
            # ready event that the forward waits on. The step count advances once a block.
            # found_inf None: a skipped step's gradients never become pending (drop()).
            e.opt.device_step(g, dst[a:b], grad, m, v, None, advance=b == n,
                              grad_scale=inv, lr=lr)
            updated = lanes.event(h2d)
            with lanes.on(d2h):
                lanes.wait(d2h, updated)    # stream wait: the chunk's update is done
                master[a:b].copy_(dst[a:b], non_blocking=True)
                e.opt.m[g][a:b].copy_(m, non_blocking=True)
                e.opt.v[g][a:b].copy_(v, non_blocking=True)
                out = lanes.event(d2h)
            self._ring.give(i, out)         # buffer reuse: after the d2h read m, v
        # Buffer reuse: the gradient's host buffers, once the h2d stream has read them.
        e.host.grad_pool.put(hbuf, after=lanes.event(h2d))
        e.host.grad_pool.put(hsq, after=done)
        e.host_ready[g] = out    # the next read of g's master (a load) waits for this
        self.bytes_h2d += 12 * n
        self.bytes_d2h += 12 * n
        self.applied_on_device += 1
        return out   # the last d2h copy read dst (d2h runs in order)

    # ---- before the host masters are read -------------------------------------------------
    def flush(self) -> None:
        """Apply every pending update on the CPU (save, engine.model, close)."""
        for g in sorted(self.pending):
            self._apply_on_host(g)

    def _apply_on_host(self, g: int) -> None:
        e = self.e
        hbuf, hsq, done, scale, lr = self.pending.pop(g)
        host_wait(done)  # host sync: the gradient's d2h copy must have landed
        host_wait(e.host_ready.pop(g, None))  # host sync: an earlier device update's d2h
        # host sync: and its m, v, which that d2h sends after the weights (device_update.py)
        host_wait(e.updater.ready_events.get(g))
        e.opt.step(g, hbuf, scale, lr=lr)
        e.cache.invalidate(g)    # the master changed: any device copy of it is stale
        e.host.grad_pool.put(hbuf)
        e.host.grad_pool.put(hsq)
        self.applied_on_host += 1
