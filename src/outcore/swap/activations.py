"""Saved-activation swapping: autograd's saved tensors to pinned host memory and back.

pack (forward, once per tensor autograd saves): parameters, small tensors (< min_swap_bytes),
strided views, sparse, nested or subclass tensors and what the budget can hold (policy.py)
stay as they are. The rest is copied on the d2h stream into a run of the HostStore; the
device tensor is let go once that copy is done. A tensor saved twice (a ReLU output is
saved by the ReLU and by the next conv) is copied once: packs are deduplicated by (address,
dtype, shape, strides, version, conj and neg bits) while the first saved tensor object is
alive (so the address cannot have been reused).

unpack (backward): the handle is fetched back if it is not on the device yet, and the next
handles of the schedule (handles.py: reverse save order node by node, or the order the
previous step's backward used) are prefetched on the h2d stream while fewer than `window` bytes are
fetched and unused. Prefetching starts when backward reaches the model's output, so
swapped tensors come back while the backward of the kept ones runs. Strides are kept: a
tensor comes back bit-identical with the same layout, so gradients are exactly those
without swapping. Torch skips its in-place check (a saved tensor modified after its save)
for tensors packed by hooks, so unpack makes it (handles.check_version): a model that
raises without swapping raises with it.
"""

from __future__ import annotations

import collections
import time
import weakref

import torch

from ..transfer import Lanes, host_wait
from .config import SwapConfig
from .handles import Generation, Handle, Saved, dense, node_seq
from .host import HostStore
from .policy import BudgetPolicy, StepPlan
from .report import CopyClock, SwapReport
from .unhooked import UnhookedForwards


def _alias(t: torch.Tensor) -> Saved:
    """t itself, or for a tensor with a grad_fn the same data without it (the saved graph
    must not hold its own node through the packed object: a reference cycle that would
    keep the graph and its tensors alive if it is dropped without backward), with its
    version for unpack's in-place check (detach() shares the version counter)."""
    return Saved(t if t.grad_fn is None else t.detach())


def _is_param(t: torch.Tensor) -> bool:
    return issubclass(type(t), torch.nn.Parameter) or getattr(t, "_is_param", False)


class _DeviceState:
    def __init__(self, device: torch.device, cfg: SwapConfig):
        self.lanes = Lanes(device)
        self.cuda = self.lanes.cuda
        self.policy = BudgetPolicy(cfg)
        self.plan: StepPlan | None = None
        self.plan_gen = -1
        self.out: collections.deque = collections.deque()   # (done event, tensor, nbytes)
        self.out_bytes = 0


class ActivationSwapper(UnhookedForwards):
    """pack/unpack for torch.autograd.graph.saved_tensors_hooks; see the module docstring.

    The owner (context.py) calls begin_forward()/end_forward(outputs) around each forward
    of the model and sets `names` (by_module: where.ModuleNames) and `pending_grad(device)`.
    """

    def __init__(self, cfg: SwapConfig, store: HostStore, report: SwapReport, clock: CopyClock):
        self.cfg, self.store, self.report, self.clock = cfg, store, report, clock
        self.gen: Generation | None = None
        self.prev: Generation | None = None
        self.names = None   # where.ModuleNames with by_module: the report's per-module bytes
        self.pending_grad = lambda device: 0
        self.trace: list[tuple] = []
        self._states: dict[torch.device, _DeviceState] = {}
        self._gens = 0
        self._node_hooks: list = []
        self._sig = None        # input signature of the forward being packed
        self._fit_sig = None    # signature of the last forward that kept everything

    def state(self, device: torch.device) -> _DeviceState:
        st = self._states.get(device)
        if st is None:
            st = self._states[device] = _DeviceState(device, self.cfg)
        return st

    def _log(self, kind: str, gen: Generation, index: int, nbytes: int) -> None:
        if self.cfg.trace:
            self.trace.append((kind, gen.id, index, nbytes))

    # ---- forward boundaries -------------------------------------------------------------
    def begin_forward(self, signature=None) -> None:
        self._sig = signature
        self._gens += 1
        self.gen = Generation(self._gens)
        self.report.forwards += 1
        for st in self._states.values():
            self._drain(st)
        self.clock.fold()

    def end_forward(self, outputs: list[torch.Tensor], failed: bool = False) -> None:
        gen, self.gen = self.gen, None
        if gen is None:
            return
        gen.seen.clear()  # drop our references to this forward's tensors and handles
        for st in self._states.values():
            if st.plan is not None and st.plan_gen == gen.id:
                st.policy.end(st.plan)
                gen.window = max(gen.window, st.policy.window(st.plan.largest))
        kept_all = not failed and not gen.items and all(
            st.plan is not None and st.plan.mode != "all" for st in self._states.values())
        self._fit_sig = self._sig if kept_all else None
        gen.plan_schedule(self.prev)
        self.prev = gen
        self._node_hooks = [h for h in self._node_hooks if h[0]() is not None]
        if gen.items:
            gref = weakref.ref(gen)
            for node in {t.grad_fn for t in outputs if t.grad_fn is not None}:
                hook = node.register_prehook(lambda grads, g=gref: self._start_backward(g()))
                self._node_hooks.append((gref, hook))

    def remove_node_hooks(self) -> None:
        for _, hook in self._node_hooks:
            hook.remove()
        self._node_hooks.clear()

    def _start_backward(self, gen: Generation | None) -> None:
        if gen is not None:
            gen.start_backward()
            self._prefetch(gen)

    # ---- pack ------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        # (runs once per saved tensor: isinstance(t, Parameter) runs a Python metaclass
        # check, so plain tensors are told apart by their type first)
        if (t.requires_grad and t.is_leaf) or (type(t) is not torch.Tensor and _is_param(t)):
            return Saved(t)  # lives elsewhere anyway: moving it frees nothing
        gen = self.gen
        if gen is None:
            return _alias(t)  # saved outside the model's forward
        rep = self.report
        rep.saved_tensors += 1
        if not t.is_cuda and not self.cfg.force_copy:
            rep.host_tensors += 1
            return _alias(t)  # already in host memory
        nbytes = t.numel() * t.element_size()
        if nbytes < self.cfg.min_swap_bytes:
            rep.small_tensors += 1
            return _alias(t)
        if t.layout is not torch.strided or t.is_nested or type(t) is not torch.Tensor:
            rep.strided_tensors += 1  # sparse, nested or a subclass: no plain storage to copy
            return _alias(t)
        # A conjugate or negative view shares t's address, shape and version: its bits
        # tell it apart (dedup must not hand backward x for conj(x)).
        key = (t.data_ptr(), t.dtype, t.shape, t.stride(), t._version, t.is_conj(),
               t.is_neg())
        hit = gen.seen.get(key)
        if hit is not None and hit[0]() is not None:
            rep.deduplicated += 1   # the first tensor is alive: the address was not reused
            if isinstance(hit[1], Handle):
                hit[1].packs += 1
                hit[1].seq = node_seq()  # needed first by this later node in backward
            return hit[1]
        if not dense(t):  # a strided view (of a weight, say): copying it frees nothing
            rep.strided_tensors += 1
            return _alias(t)
        st = self.state(t.device)
        if st.plan_gen != gen.id:
            alloc = torch.cuda.memory_allocated(t.device) if st.cuda else 0
            st.plan, st.plan_gen = st.policy.begin(alloc, self.pending_grad(t.device)), gen.id
        cand = len(gen.sizes)
        gen.sizes.append(nbytes)
        if not st.policy.offload(st.plan, nbytes):
            rep.kept_tensors += 1
            rep.kept_bytes += nbytes
            kept = _alias(t)
            gen.seen[key] = (weakref.ref(t), kept)
            self._log("keep", gen, cand, nbytes)
            return kept
        h = self._offload(t, nbytes, st, gen, cand)
        gen.seen[key] = (h.src, h)
        return h

    def _offload(self, t: torch.Tensor, nbytes: int, st: _DeviceState, gen: Generation,
                 cand: int) -> Handle:
        h = Handle(gen, cand, self.store, self.store.alloc(nbytes), t, nbytes)
        flat = t.as_strided((t.numel(),), (1,), t.storage_offset())
        if st.cuda:
            d2h = st.lanes.d2h
            # Stream wait: t is produced by kernels queued on the compute stream.
            d2h.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(d2h):
                mark = self.clock.start(d2h)
                h.host.copy_(flat, non_blocking=True)
                self.clock.stop(mark, "copy", d2h)
                h.event = torch.cuda.Event()
                h.event.record(d2h)
            # Buffer reuse: t's device memory must not be handed out again while the d2h
            # stream reads it, so t stays referenced here until its copy is done.
            st.out.append((h.event, t, nbytes, h))
            st.out_bytes += nbytes
            self._throttle(st)
        else:
            mark = self.clock.start(None)
            h.host.copy_(flat)
            self.clock.stop(mark, "copy", None)
        rep = self.report
        rep.offloaded_tensors += 1
        rep.bytes_to_host += nbytes
        if self.names is not None:
            name = self.names.saving()
            rep.by_module[name] = rep.by_module.get(name, 0) + nbytes
        self._log("offload", gen, h.index, nbytes)
        return h

    def _drain(self, st: _DeviceState) -> None:
        """Let go of device tensors whose copy to the host is done (frees their memory)."""
        while st.out and st.out[0][0].query():
            self._let_go(st)

    @staticmethod
    def _let_go(st: _DeviceState) -> None:
        """Drop the oldest device tensor whose copy out is done; remember its version (an
        in-place change before now may have raced the copy: unpack then raises)."""
        _, t, nbytes, h = st.out.popleft()
        st.out_bytes -= nbytes
        h.last = t._version

    def _throttle(self, st: _DeviceState) -> None:
        self._drain(st)
        window = st.policy.window(st.plan.largest if st.plan else 0)
        while st.out_bytes > window and len(st.out) > 1:
            t0 = time.perf_counter()
            host_wait(st.out[0][0])  # host sync: bounds device memory waiting to go out
            self.report.host_wait_s += time.perf_counter() - t0
            self._drain(st)

    # ---- unpack ----------------------------------------------------------------------
    def unpack(self, obj):
        if type(obj) is Saved:
            return obj.get()
        if not isinstance(obj, Handle):
            return obj
        h, gen = obj, obj.gen
        h.check()
        st = self.state(h.device)
        if st.cuda:
            self._drain(st)
        if h.dev is None:
            self._fetch(h, st, "fetch")  # not predicted: fetch on demand (the stream waits)
        elif h.ahead:
            h.ahead = False
            gen.inflight -= h.nbytes
        if not h.used:
            h.used = True
            if gen.backwards <= 1:
                gen.used.append(h.cand)
        x = h.dev
        self._log("use", gen, h.index, h.nbytes)
        self._prefetch(gen)
        if st.cuda:
            cur = torch.cuda.current_stream(h.device)
            mark = self.clock.start(cur)
            cur.wait_event(h.ready)  # stream wait: the copy into x has landed
            self.clock.stop(mark, "stall", cur)
        h.unpacks += 1
        if h.unpacks >= h.packs:  # every saver has it now; a second backward fetches again
            h.dev, h.unpacks = None, 0
        return x

    def _prefetch(self, gen: Generation) -> None:
        while True:
            h = gen.next_ahead()
            if h is None or (gen.inflight > 0 and gen.inflight + h.nbytes > gen.window):
                return
            self._fetch(h, self.state(h.device), "prefetch")
            h.ahead = True
            gen.inflight += h.nbytes

    def _fetch(self, h: Handle, st: _DeviceState, kind: str) -> None:
        x = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
        flat = x.as_strided((h.host.numel(),), (1,), 0)
        if st.cuda:
            h2d = st.lanes.h2d
            # Stream wait: x's memory may come from tensors freed by kernels still queued on
            # the compute stream; write it only after them.
            h2d.wait_stream(torch.cuda.current_stream(h.device))
            st.lanes.wait(h2d, h.event)  # stream wait: the copy out to the host is done
            with torch.cuda.stream(h2d):
                mark = self.clock.start(h2d)
                flat.copy_(h.host, non_blocking=True)
                self.clock.stop(mark, "copy", h2d)
                h.ready = torch.cuda.Event()
                h.ready.record(h2d)
            h.event = h.ready
        else:
            mark = self.clock.start(None)
            flat.copy_(h.host)
            self.clock.stop(mark, "copy", None)
        h.dev = x
        rep = self.report
        rep.fetched_tensors += 1
        rep.bytes_to_device += h.nbytes
        rep.prefetched_tensors += int(kind == "prefetch")
        self._log(kind, h.gen, h.index, h.nbytes)

    def finish(self) -> None:
        """Wait for copies out (a host sync) so every device tensor we hold is released."""
        for st in self._states.values():
            while st.out:
                host_wait(st.out[0][0])  # host sync: closing; let go of every device tensor
                self._let_go(st)
        self.clock.fold(block=True)
