"""What moves where during a step: the engine's side of the block runner's calls.

`StepFlow` is mixed into Engine. The runner asks it for a block's parameters and buffers
(as views of a flat device buffer), RNG snapshots for recompute, prefetches (the next
block's weights in forward, the previous block's weights, checkpoint and m/v in
backward), and hands it each group's final gradient (`grad_ready`), which goes either to
the device-side AdamW or, copied to pinned host memory, to the CPU worker (`_apply_update`).
"""

from __future__ import annotations

import time

import torch

from ..transfer import host_wait


class StepFlow:
    """Mixin of Engine; uses its groups, cache, stash, host, opt, schedule and updater."""

    def block_params(self, g: int, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        grp = self.groups[g]
        return {n: flat[o:o + p.numel()].view(p.shape)
                for n, p, o in zip(self._local[g], grp.params, grp.offsets)}

    def block_buffers(self, g: int) -> dict[str, torch.Tensor]:
        return self._buffers[g]

    def _device_buffers(self) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = [{} for _ in self.groups]
        prefix = {g.name + ".": g.index for g in self.groups[1:]}
        for name, b in self._model.named_buffers():
            g = next((i for k, i in prefix.items() if name.startswith(k)), 0)
            local = name[len(self.groups[g].name) + 1:] if g else name
            out[g][local] = b.to(self.device)
        return out

    def _buffers_to_model(self) -> None:
        """The engine's copies of the buffers (on the device: BatchNorm's running statistics
        move there) into the model's own, for `.model` and what reads it (host copies)."""
        live = dict(self._model.named_buffers())
        for g, bufs in enumerate(self._buffers):
            prefix = f"{self.groups[g].name}." if g else ""
            for local, b in bufs.items():
                mine = live.get(prefix + local)
                if mine is not None and mine is not b:
                    mine.copy_(b)   # host sync: once per .model, after synchronize()

    def _accumulate_into(self, leaves: dict[str, torch.Tensor], numel: int) -> torch.Tensor:
        """A zeroed flat fp32 gradient of group 0, each leaf's `.grad` a view of it: autograd
        then adds each parameter's gradient in place (AccumulateGrad on a defined .grad),
        with no rest-sized temporaries. Allocated just before backward, so the forward's
        peak does not hold it."""
        grp = self.groups[0]
        flat = torch.zeros(numel, dtype=torch.float32, device=self.device)
        for leaf, p, o in zip(leaves.values(), grp.params, grp.offsets):
            leaf.grad = flat[o:o + p.numel()].view(p.shape)
        return flat

    def rng_snapshot(self):
        if not self._dropout:
            return None
        cuda = torch.cuda.get_rng_state(self.device) if self.lanes.cuda else None
        return torch.get_rng_state(), cuda

    def rng_restore(self, state) -> None:
        if state is not None:
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state(state[1], self.device)

    def weight_source(self, g: int, backward: bool) -> torch.Tensor:
        """The host weights a pass of group g loads: its 16-bit copy when the engine keeps
        one current (host_weight_copy: every block's, or with "device" the device-updated
        blocks' only) and the pass needs no fp32 weights, else the fp32 master. Only a
        device-side AdamW needs them: in the backward of a device-updated group."""
        copy = self.host.copy[g]
        device = g in self.updater.groups
        if copy is None or (backward and device) or g in self.host.stale:
            return self.host.master[g]
        if self.copy_mode == "device" and not device:
            return self.host.master[g]   # a CPU-updated block's copy is not kept current
        if device and g > len(self.groups) - 1 - len(self.cache.slots):
            # one of the last blocks of forward, still in its slot when backward starts:
            # loaded in fp32 the backward finds it there, a copy would mean a second load
            return self.host.master[g]
        if self.cache.holds(g, torch.float32):
            # current fp32 weights already on the device (a device-side update in place,
            # the last blocks of backward): cast them there rather than wait for the copy's
            # round trip through the host
            return self.host.master[g]
        return copy

    def reload_if_edited(self) -> None:
        """After .model was handed out (its weights may have been edited in place): bring
        the 16-bit host copies up to date and drop every device copy, so this step loads
        what the user left there (a device-updated `rest` would otherwise stay resident)."""
        if self._host_changed:
            self._host_changed = False
            self.keep.drop()
            for g in range(len(self.groups)):
                self.host.adopt_rebound(g)   # p.data = t: t's values become the master
                self.host.refresh(g)
                self.cache.invalidate(g)

    def prefetch_forward(self, g: int) -> None:
        ahead = g
        while ahead < len(self.groups) and self.keep.has(ahead):
            ahead += 1   # kept on the device (keep.py): the next block to load is later
        if ahead != g:
            # Look ahead past the kept blocks only when that block's update is done: a host
            # wait here would hold back the kept blocks' forwards, which need nothing.
            self.prefetch_ahead(ahead)
            return
        if g < len(self.groups):
            t = time.perf_counter()
            self.schedule.wait(g)  # host wait: block g's update from the last step
            self.stats.optimizer_wait_s += time.perf_counter() - t
            self.cache.prefetch(g, self.weight_source(g, False), self.host_ready.get(g))

    def prefetch_ahead(self, g: int) -> None:
        """Forward: start loading block g before its turn (past kept blocks, and with
        block_slots > 3 a few blocks early), unless it is kept, its update from the last
        step is still pending (no host wait here: it would hold back the blocks before g,
        which need nothing from it) or no slot is free."""
        if 0 < g < len(self.groups) and not self.keep.has(g) and not self.schedule.pending(g):
            self.cache.prefetch(g, self.weight_source(g, False), self.host_ready.get(g))

    def prefetch_backward(self, g: int) -> None:
        if g >= 1:
            # `after`: a device-side update's write-back of g's master may be in flight
            self.cache.prefetch(g, self.weight_source(g, True), self.host_ready.get(g))
            self.stash.prefetch(g)
        self.updater.prefetch(g)
        if 0 in self.updater.groups and g == self.updater.rest_lead():
            self.updater.prefetch(0)   # early: see DeviceUpdater.rest_lead

    def half_grad(self, g: int, n_micro: int) -> bool:
        """Does block g's gradient cross to the host in bf16? Only where that loses nothing
        and saves work: one micro-batch (the gradient of bf16 leaves is bf16, exactly; a
        sum over several is not), a CPU update by the one-pass kernel (which reads bf16
        gradients: 2 B/param less to read), not a device update (fp32 in place)."""
        return (n_micro == 1 and self.compute_dtype == torch.bfloat16
                and self.cast_kernel is not None and self.copy_mode == "all"
                and g not in self.updater.groups)

    def grad_ready(self, g: int, grad: torch.Tensor, w32: torch.Tensor | None = None,
                   ring_i: int | None = None) -> None:
        """Group g's gradient (flat, on the device; fp32, or bf16 where half_grad) is final
        for this step.

        w32: the fp32 weights of g on the device (its slot; `rest`'s buffer for g=0).
        ring_i: the grad_ring buffer holding `grad` (None: an ordinary allocation).
        """
        sq = self._group_sq(grad)
        self._sq.append(sq)
        if g in self.updater.groups:
            done = self.updater.update(g, w32, grad, sq, keep_grad=ring_i is not None)
            if ring_i is not None:
                self.grad_ring.give(ring_i, done)
            if g:
                self.cache.release(g, free_after=done)
            return
        if g:
            self.cache.release(g)
        if self.max_staged_grads and not self.hold_updates:
            # Host wait: at most max_staged_grads gradients wait in pinned host memory for
            # the CPU AdamW. The pool keeps every buffer it ever handed out, so a backlog
            # (the first steps, while torch.compile shares the cores) stayed allocated for
            # the whole run: ~3.8 B/param at 3b-16k on the H200, past the planner's 12.
            # Counted as optimizer wait, which the device-update planner reacts to.
            t = time.perf_counter()
            self.schedule.wait_below(self.max_staged_grads)
            self.stats.optimizer_wait_s += time.perf_counter() - t
        hbuf = self.host.grad_pool.get(grad.numel(), grad.dtype)
        hsq = self.host.grad_pool.get(1, torch.float32)
        with self.lanes.on(self.lanes.d2h):
            # Stream wait: the gradient is produced on the compute stream.
            self.lanes.wait(self.lanes.d2h, self.lanes.event())
            hbuf.copy_(grad, non_blocking=True)
            hsq.copy_(sq, non_blocking=True)
            done = self.lanes.event(self.lanes.d2h)
        if self.lanes.cuda:
            # Buffer reuse: sq's memory may be recycled only after the d2h copy read it.
            sq.record_stream(self.lanes.d2h)
        if ring_i is not None:
            self.grad_ring.give(ring_i, done)  # buffer reuse: after the d2h copy read it
        elif self.lanes.cuda:
            # Buffer reuse: grad's memory may be recycled only after the d2h copy read it.
            grad.record_stream(self.lanes.d2h)
        self.stats.bytes_d2h += grad.numel() * grad.element_size()
        self.cache.invalidate(g)
        if not self.deferred.hold(g, (hbuf, hsq, done)):   # else: updated by its next load
            self.schedule.submit(g, (hbuf, hsq, done))

    def _group_sq(self, grad: torch.Tensor) -> torch.Tensor:
        """grad's squared norm (shape 1, on grad's device): what clipping sums and what
        nonfinite_check judges the group by."""
        # no gradient-sized temporary; fp32 accumulation also for a bf16 gradient
        return torch.linalg.vector_norm(grad, dtype=torch.float32).square().reshape(1)

    def nonfinite_check(self, g: int, sq: torch.Tensor) -> bool:
        ok = bool(torch.isfinite(sq).all())
        if not ok:
            self._nonfinite_groups.append(g)
        return ok

    @staticmethod
    def _grad_landed(payload) -> bool:
        """Whether a staged gradient's d2h copy has landed (an event query: no wait)."""
        done = payload[2]
        return done is None or done.query()

    def _apply_update(self, g: int, payload, scale: float) -> None:
        """Worker thread: wait for group g's gradient to land, then run AdamW on it."""
        hbuf, hsq, done = payload
        host_wait(done)  # host sync (worker thread only): the d2h copy must have landed
        t = time.perf_counter()
        if self.nonfinite_check(g, hsq):
            copy = self.host.copy[g] if self.copy_mode == "all" else None
            if copy is not None and self.cast_kernel is not None:
                # AdamW writes the 16-bit copy as it writes the weights (cast_kernel.py)
                self.opt.step_cast(g, hbuf, copy, self.cast_kernel, scale)
                self.host.stale.discard(g)   # current again (set once the pass is done)
            else:
                self.opt.step(g, hbuf, scale)
                if copy is not None:
                    self.host.refresh(g)   # the 16-bit copy, before the next load waits
        self._cpu_busy_s += time.perf_counter() - t
        self._cpu_params += hbuf.numel()
        self.host.grad_pool.put(hbuf)
        self.host.grad_pool.put(hsq)
