"""AdamW on the device for a share of the groups, with their fp32 state streamed.

The CPU AdamW (a worker thread) is the bottleneck when the device computes a step faster
than the host can update every parameter (3B params at 16k tokens: ~1.1 s of compute vs
~1.35 s of AdamW at the 2.5 G params/s the host manages under copy traffic). For the
groups chosen here the update runs on the device instead, right after the group's
backward, on the fp32 weights already in its slot:
  h2d  m, v (8 B/param, prefetched with the weights for backward)
  dev  fused AdamW (found_inf skips it on a non-finite gradient, no host sync)
  d2h  weights, m, v (12 B/param) into the pinned host buffers, and the weights' 16-bit
       copy (2 B/param) when the engine keeps one on the host (host_weight_copy)
The next h2d read of that group's master waits on the d2h event (`ready(g)`).
Groups are taken from the end of backward (rest, block 1, 2, ...): their gradients arrive
last, so on the CPU they would be the tail that the next forward waits for.
"""

from __future__ import annotations

import torch

from ..errors import OutcoreError
from ..memory import pin_
from ..transfer import host_wait
from .device_choice import backlog_groups, candidate_order
from .resident_mv import ResidentMV


class DeviceUpdater:
    """Which groups update on the device, their m/v in flight, and the d2h events.

    order: which groups move here first.
      "tail" (default, measured): rest, block 1, 2, ... (the end of backward). The last
        stretch of backward then loads 12 B/param per block and writes 12 back: on the
        H200 at 3b-16k both copy directions were busy through it and compute idled ~10 ms
        a block in its last blocks.
      "interleave" (opt-in, bench/stream.py --update-order): rest, blocks
        1..3, then every other block (5, 7, ...), then the blocks between (4, 6, ...).
        Each device block's copies then sit beside a CPU block's 4 B/param, and the CPU
        blocks' gradients still arrive early enough for their next forward. Measured
        on the H200 at 3b-16k with 4 slots (session 33, stream-h200-ab-s33a-*.json):
        0.963 s a step (0.921 planned by stream/simulate.py) against the default's 0.884.
    """

    def __init__(self, engine):
        self.e = engine
        self.order = "tail"
        self.tuner = None   # tune.UpdateTuner, opt-in: hands groups back while it pays
        self.settle_compiles = False   # opt-in: no planning from a step that compiled
        # "backlog" (move while the step waits for the CPU, never back) or "balance"
        # (opt-in, balance.py: the shortest predicted step, moving either way)
        self.policy = "backlog"
        self.balancer = None
        # Opt-in (session 14: no faster alone, bench/NOTES.md): no 16-bit copy of a device
        # update goes back to the host when the next forward will find the block on the
        # device (kept by keep.py, or still in its slot); should it not, it loads the fp32
        # master (storage.HostState.stale). 2 B/param less out in the stretch of backward
        # where both copy directions are the limit (session 14's profile at 3b-16k: ~130
        # ms of compute idle per step there, none elsewhere).
        self.lazy_copies = False
        # Opt-in (session 14): the first device blocks of backward keep m, v on the
        # device between steps (resident_mv.py; `resident_mv` sets how many)
        self.resident = ResidentMV(self)
        self.groups: set[int] = set()
        self._mv: dict[int, tuple[torch.Tensor, torch.Tensor, object, int | None]] = {}
        self._ring = None  # 2 buffers of m|v for blocks (rest's are allocated per step)
        self._ring16 = None  # 2 buffers for the 16-bit copies of updated blocks
        self.ready_events: dict[int, object] = {}   # g's last write-back, m and v too
        # The event after which g's host weights (master, and its 16-bit copy) are current:
        # what the next load of g waits for (Engine.host_ready). The write-back sends them
        # before m and v, which only the next device update reads, so a load does not also
        # wait for 8 B/param of m and v behind them on the d2h stream.
        self.weights_ready: dict[int, object] = {}
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        # Whether m, v allocated per step (rest's) come from the compute stream's pool, not
        # the h2d stream's (False: the rule until session 34, for bench A/Bs). Measured
        # at 3b-16k on the H200 (session 34, stream-h200-ab-s34{e,f}-*.json): the h2d
        # pool's 1.6 GB segment is gone, the reserved peak is not lower (15.4-15.5 GB:
        # the engine caps the process at its budget and the allocator caches freed
        # blocks up to that cap), the step 0.930 s against 1.002 and 0.959 for the old
        # rule, whose runs took 17 and 14 device groups against 12.
        self.mv_on_compute = True

    def enable(self, gs) -> None:
        before = self._ring.bytes() if self._ring is not None else 0
        grew = 0
        for g in gs:
            if g not in self.groups and self.e.groups[g].numel:
                refresh = self.e.copy_mode == "device" and self.e.host.copy[g] is not None
                if self.e.lanes.cuda or refresh:
                    # Host wait ('auto' enables between steps): g's CPU update of this step
                    # may be running on the worker, and what follows reads or copies what
                    # the worker writes (its master, its m and v).
                    self.e.schedule.wait(g)
                if self.e.lanes.cuda:
                    # Pinned once: DMA in and out every step (pin_ copies a small m, v).
                    self.e.opt.m[g] = pin_(self.e.opt.m[g])
                    self.e.opt.v[g] = pin_(self.e.opt.v[g])
                if refresh:
                    # A host cast: only device updates write the copies in this mode, so
                    # g's is as old as the last one; the next forward loads it.
                    self.e.host.refresh(g)
                self.groups.add(g)
                if not g:
                    grew += 8 * self.e.groups[0].numel   # rest's m, v, held in backward
                if g and self._ring is None:
                    from .ring import Ring
                    block = self.e.cache.slots[0].buf.numel()
                    # one m|v buffer per block backward may have in flight: the one
                    # computing and those the runner prefetches (block_slots - 2)
                    k = max(2, self.e.block_slots - 1)
                    self._ring = Ring(self.e.lanes, k, 2 * block)
                    if self.e.host.copy[g] is not None:
                        self._ring16 = Ring(self.e.lanes, k, block, self.e.compute_dtype)
                        grew += self._ring16.bytes()
        grew += (self._ring.bytes() if self._ring is not None else 0) - before
        if grew and getattr(self.e, "_other_peak", None) is not None:
            # The next step's checkpoint limit comes from this step's measured peak, which
            # held none of this: without the margin a step that keeps many checkpoints on
            # the device (3b-64k) ran out of its budget right after groups moved here.
            # The step after re-measures.
            self.e._other_peak += grew
        # groups added above a resident block push it out of the first resident_mv: its
        # m, v go home now (the newcomers' come to stay at their first prefetch)
        self.resident.release_unwanted()

    @property
    def resident_mv(self) -> int:
        return self.resident.count

    @resident_mv.setter
    def resident_mv(self, n: int) -> None:
        self.resident.count = n
        self.resident.release_unwanted()

    def hand_back(self, g: int) -> None:
        """Group g's AdamW goes back to the CPU: its next gradient goes to the worker,
        which reads the host's m and v, so resident ones are written back first."""
        self.groups.discard(g)
        self.resident.write_back(g)

    def prefetch(self, g: int) -> None:
        """Start copying group g's m and v to the device (no-op if not a device group)."""
        if g not in self.groups or g in self._mv:
            return
        lanes, opt = self.e.lanes, self.e.opt
        n = opt.m[g].numel()
        held = self.resident.held(g)
        if held is not None:
            self._mv[g] = (*held, None, None)   # current on the compute stream already
            return
        wanted = self.resident.wanted(g)
        fresh = not wanted and not (g and self._ring is not None)
        on_compute = fresh and self.mv_on_compute and lanes.cuda
        if on_compute:
            # Allocated on the compute stream, whose pool the step's other buffers share:
            # allocated on h2d, rest's m, v (1.6 GB at 3b) kept a segment of h2d's own
            # pool all run, which no other buffer could use (bench/NOTES.md, session 34).
            m = torch.empty(n, dtype=opt.m[g].dtype, device=lanes.device)
            v = torch.empty(n, dtype=opt.v[g].dtype, device=lanes.device)
            allocated = lanes.event()
        with lanes.on(lanes.h2d):
            # Stream wait: last step's d2h of this group's m, v must have landed.
            lanes.wait(lanes.h2d, self.ready_events.get(g))
            i = None
            if wanted:
                m, v = self.resident.allocate(g)
            elif not fresh:
                i, buf = self._ring.take(lanes.h2d)
                m, v = buf[:n], buf[n:2 * n]
                m.copy_(opt.m[g], non_blocking=True)
                v.copy_(opt.v[g], non_blocking=True)
            elif on_compute:
                # Stream wait: the memory may be a block that compute work queued before
                # the allocation still reads or writes.
                lanes.wait(lanes.h2d, allocated)
                m.copy_(opt.m[g], non_blocking=True)
                v.copy_(opt.v[g], non_blocking=True)
                # Buffer reuse: not recycled before this copy is done, even if dropped
                # unused (the update itself waits for it anyway).
                m.record_stream(lanes.h2d)
                v.record_stream(lanes.h2d)
            else:
                m = opt.m[g].to(lanes.device, non_blocking=True)
                v = opt.v[g].to(lanes.device, non_blocking=True)
            ev = lanes.event(lanes.h2d)
        self.bytes_h2d += 8 * n
        self._mv[g] = (m, v, ev, i)

    def candidates(self) -> list[int]:
        """Every group, in the order they move to the device (see `order`)."""
        return candidate_order(len(self.e.groups), self.order)

    def rest_lead(self) -> int:
        """The block whose backward prefetch also starts rest's m, v (group 0, the largest
        group and the last gradient of backward).

        Device groups are taken from the end of backward, so its last stretch loads 12
        B/param per block and keeps the h2d stream busy; rest's m, v queued behind that
        arrived after its gradient (~14 ms of idle compute per 3B step on the H200). They
        are started instead ~1.5x rest's size in blocks before the first device-updated
        block, while backward's blocks still load only their weights (4 B/param). Holding
        them on the device that long costs no peak: by then backward has freed more
        checkpoints than they take."""
        e = self.e
        top = 0                  # the end of backward's contiguous run of device blocks
        while top + 1 in self.groups:
            top += 1
        block = max((grp.numel for grp in e.groups[1:]), default=0)
        lead = -(-3 * e.groups[0].numel // (2 * block)) if block else 0
        return min(len(e.groups) - 1, top + lead)

    def update(self, g: int, w32: torch.Tensor, grad: torch.Tensor, sq: torch.Tensor,
               keep_grad: bool = False):
        """Run AdamW for group g on the device and write it back; returns the d2h event."""
        e, lanes = self.e, self.e.lanes
        self.prefetch(g)
        m, v, ev, ring_i = self._mv.pop(g)
        lanes.wait(lanes.compute, ev)  # stream wait: m, v landed on the device
        keep_mv = self.resident.held(g) is not None
        # Stream wait: the weights are written in place below, and when they were not
        # reloaded since g's last update (its slot kept, or rest's resident buffer) that
        # update's write-back may still be reading them on a d2h stream running behind.
        lanes.wait(lanes.compute, self.ready_events.get(g))
        if lanes.cuda and ring_i is None and not keep_mv and not self.mv_on_compute:
            # Buffer reuse: m, v were allocated on the h2d stream, used on compute.
            m.record_stream(lanes.compute)
            v.record_stream(lanes.compute)
        found_inf = (~torch.isfinite(sq)).float().reshape(())
        e.opt.device_step(g, w32, grad, m, v, found_inf)
        e.cache.updated_in_place(g, w32)
        # A copy for the next forward, where the budget has room (keep.py). Cast before
        # the event the write-back waits on: the slot's next fill waits for that
        # write-back, so it cannot overwrite w32 before this cast has read it.
        kept = bool(g) and e.keep.offer(g, w32)
        copy = e.host.copy[g]
        if copy is not None and self.lazy_copies and (kept or g <= len(e.cache.slots)):
            # The next forward finds g on the device (kept, or still in its slot): the
            # host's copy is not sent and is stale until g's next CPU update or refresh
            # (a forward that misses g on the device loads its fp32 master then).
            e.host.stale.add(g)
            copy = None
        if copy is not None:   # the host's 16-bit copy, cast here where the weights are
            i16, w16 = self._ring16.take()
            w16 = w16[:w32.numel()]
            w16.copy_(w32)
        with lanes.on(lanes.d2h):
            # Stream wait: the update is enqueued on the compute stream.
            lanes.wait(lanes.d2h, lanes.event())
            e.host.master[g].copy_(w32, non_blocking=True)
            if copy is not None:
                copy.copy_(w16, non_blocking=True)
            weights = lanes.event(lanes.d2h)
            if not keep_mv:   # resident m, v stay where they are (synchronize, hand_back)
                e.opt.m[g].copy_(m, non_blocking=True)
                e.opt.v[g].copy_(v, non_blocking=True)
            done = lanes.event(lanes.d2h)
        if copy is not None:
            self._ring16.give(i16, weights)   # buffer reuse: after the d2h copy read it
            self.bytes_d2h += copy.numel() * copy.element_size()
            e.host.stale.discard(g)
        if ring_i is not None:
            self._ring.give(ring_i, done)  # buffer reuse: after the d2h copy read m, v
        if lanes.cuda:
            # Buffer reuse: m, v (unless from the ring) and grad (unless the caller owns it)
            # may be recycled only after the d2h stream read them.
            own = ([] if ring_i is not None or keep_mv else [m, v]) + \
                ([] if keep_grad else [grad])
            for t in own:
                t.record_stream(lanes.d2h)
        else:
            e.nonfinite_check(g, sq)
        self.bytes_d2h += (4 if keep_mv else 12) * w32.numel()
        self.ready_events[g] = done
        self.weights_ready[g] = weights
        return done

    def ready(self, g: int):
        """Event after which group g's host master is current (None: it already is)."""
        return self.weights_ready.get(g)

    def synchronize(self) -> None:
        self.resident.sync()   # the host's m, v current (a checkpoint, .model)
        for ev in list(self.ready_events.values()) + list(self.weights_ready.values()):
            host_wait(ev)  # host sync: the host state must be final (save, model access)

    def plan(self, step_s: float, opt_wait_s: float, cpu_busy_s: float, cpu_params: int):
        """Feedback: if the last step waited for CPU updates, move that much work over.

        A deliberate, measured choice: the step's optimizer wait (host blocked on a pending
        CPU update) times the CPU's update rate seen this step is the backlog the CPU could
        not absorb; that many parameters (plus one group of margin) move to the device,
        taken from the end of backward (rest, block 1, 2, ...). Never moves groups back.
        With policy "balance" (balance.py) the groups come from a model of the step instead.
        """
        if self.policy == "balance":
            if self.balancer is None:
                from .balance import Balancer
                self.balancer = Balancer(self)
            return self.balancer.plan(self.e.stats.compute_s, cpu_busy_s, cpu_params)
        if self.policy != "backlog":
            raise OutcoreError(f"device update policy {self.policy!r}: use 'backlog' or "
                               "'balance'")
        added = self.affordable(backlog_groups(self.e.groups, self.groups,
                                               self.candidates(), step_s, opt_wait_s,
                                               cpu_busy_s, cpu_params))
        self.enable(added)
        return added

    def affordable(self, gs: list[int]) -> list[int]:
        """The groups of gs whose device state fits the budget beside the last step's
        measured peak (Engine._device_room). One that does not fit is skipped, not those
        after it: rest's m, v are 8 B/param of a large group held through backward's end,
        while a block adds nothing once the ring of two blocks' m|v exists. At 7b-16k in
        14.5 GiB the planner moved rest and 12 blocks without this, and the next step ran
        out of the budget."""
        room = self.e._device_room()
        if room is None:
            return gs
        block = self.e.cache.slots[0].buf.numel()   # as enable() sizes the ring
        ring = 2 * 2 * block * 4 + (2 * block * self.e.compute_dtype.itemsize
                                    if self.e.host.copy[-1] is not None else 0)
        has_ring, out = self._ring is not None, []
        for g in gs:
            cost = 8 * self.e.groups[0].numel if g == 0 else 0 if has_ring else ring
            if cost <= room:
                room -= cost
                out.append(g)
                has_ring = has_ring or g > 0
        return out
