"""Parameter swapping (opt-in): weights of modules not running live in host memory.

When parameters live where, for each managed parameter p (one that owns its whole storage):
  between steps   on the device, so optimizers, zero_grad and state_dict work unchanged
  forward         at the model's forward start p is copied to its host run (a frozen p
                  only if its version moved since the last copy) and its device storage is
                  freed (storage.resize_(0): autograd keeps the same tensor object). Its
                  module's forward pre-hook fetches it (the next modules' are prefetched in
                  the previous forward's order) and its forward hook frees it again.
  backward        a pre-hook on the module's output node fetches p before the module's
                  backward runs (earlier modules prefetched); p then stays, so its .grad
                  lands on the device next to it. A final callback fetches whatever
                  backward did not use, so after .backward() every p is on the device;
                  so does any optimizer's step (a global step pre-hook, while swapping)
                  and the model's state_dict().
A parameter used outside the forward of the module that owns it is not supported (but
nn.MultiheadAttention moves as one unit with its out_proj, which it reads itself); the
first forward of each input signature refuses such a read in one line (param_guard.py).
"""

from __future__ import annotations

import numbers
import weakref

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

from ..errors import OutcoreError
from ..transfer import Lanes, host_wait
from .host import HostStore
from .report import CopyClock, SwapReport

# id(param) -> ParamSwapper managing it (refuse nesting). Weak, as the global optimizer
# hook's reference is: a swap never closed must not keep its model alive once dropped.
_OWNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_task_id = getattr(torch._C, "_current_graph_task_id", None)   # the running backward


class _Slot:
    __slots__ = ("param", "run", "host", "nbytes", "on_device", "version", "ready", "event")

    def __init__(self, p: nn.Parameter, store: HostStore):
        self.param = p
        self.nbytes = p.numel() * p.element_size()
        self.run = store.alloc(self.nbytes)
        self.host = self.run.view(p.dtype, p.numel())
        self.on_device = True
        self.version = None      # p._version when the host copy was made
        self.ready = None        # h2d copy into p done (compute must wait)
        self.event = None        # last copy touching the host run


def _in_backward() -> bool:
    """True inside a backward: a module's forward run there recomputes it (activation
    checkpointing), and the node that asked for it is about to read what it saved."""
    return _task_id is not None and _task_id() >= 0


def _owns_storage(p: torch.Tensor) -> bool:
    return (p.numel() > 0 and p.is_contiguous() and p.storage_offset() == 0
            and p.untyped_storage().nbytes() == p.numel() * p.element_size())


# Modules whose forward reads a child's parameters without calling the child (out_proj's;
# the transformer layers' fast path, which reads all, is off while submodules have hooks).
_READS_CHILDREN = (nn.MultiheadAttention,)
# Output leaves that hold no tensor a backward could need (anything else may hide one).
_PLAIN = (torch.Tensor, numbers.Number, str, bytes, type(None), torch.dtype, torch.device,
          torch.Size)


def _tensors(output) -> list[torch.Tensor]:
    return [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]


class ParamSwapper:
    """Moves the parameters of `model`'s modules; see the module docstring."""

    def __init__(self, model: nn.Module, store: HostStore, report: SwapReport,
                 clock: CopyClock, window: int, force_copy: bool):
        self.store, self.report, self.clock, self.window = store, report, clock, window
        self.model = model
        self.units: list[list[_Slot]] = []
        self.modules: list[nn.Module] = []
        self.slots: dict[int, _Slot] = {}
        self.lanes: dict[torch.device, Lanes] = {}
        found, inside = [], set()
        for mod in model.modules():   # parents before their children
            if id(mod) in inside:
                continue
            whole = isinstance(mod, _READS_CHILDREN)   # one unit with its children's
            if whole:
                inside.update(id(m) for m in mod.modules())
            params = [p for p in mod.parameters(recurse=whole)
                      if (p.is_cuda or force_copy) and _owns_storage(p)]
            if params:
                found.append((mod, params))
        if any(_OWNED.get(id(p), self) is not self for _, ps in found for p in ps):
            raise OutcoreError("a parameter is already swapped by another outcore.swap (an "
                               "enclosing one, or one not closed): pass swap_params=False "
                               "to this one, or close() the other first")
        try:
            for mod, params in found:
                for p in params:
                    if id(p) not in self.slots:
                        self.slots[id(p)] = _Slot(p, store)
                        _OWNED[id(p)] = self
                self.units.append([self.slots[id(p)] for p in params])
                self.modules.append(mod)
        except BaseException:  # host_memory too small: give back what was taken
            self._forget()
            raise
        self.order: list[int] = []        # units in first-call order, this forward
        self.prev: list[int] = []         # ... and in the previous forward
        self.bwd: list[int] = []          # order of the forward that built the graph
        self._queued = None           # graph task whose end restores the parameters
        self.closed = False
        self._node_hooks: list = []
        self._pos: dict[int, int] = {}
        self._running: list[int] = []     # units whose forward is running (outermost first)
        self._prev_pos: dict[int, int] = {}
        self._bwd_pos: dict[int, int] = {}

    def install(self) -> list:
        # Any optimizer's step first brings every parameter back (a forward without its
        # backward leaves them in host memory until then).
        ref = weakref.ref(self)   # weak: see _OWNED

        def restore(opt, args, kwargs) -> None:
            if ref() is not None:
                ref().restore()

        handles = [register_optimizer_step_pre_hook(restore)]
        # So does the model's state_dict (a checkpoint or an eval after a forward whose
        # graph was dropped would read freed storage).
        handles.append(self.model.register_state_dict_pre_hook(
            lambda mod, prefix, keep_vars: self.restore()))
        # Prepended: a module's own pre-hooks (pruning, old-style weight_norm) compute
        # from its parameters, so these must be on the device before they run. Not the
        # model's: its parameters are on the device until its forward begins (_enter).
        # Their forward hook frees them after the module's other forward hooks, those added
        # later too (a user's logging the weight's norm): _pre moves it last. Not the
        # model's: the swap's own forward hook (context.py) must follow it.
        self._post_ids: list[int | None] = []
        for u, mod in enumerate(self.modules):
            handles.append(mod.register_forward_pre_hook(lambda m, a, u=u: self._pre(u),
                                                         prepend=mod is not self.model))
            handles.append(mod.register_forward_hook(lambda m, a, o, u=u: self._post(u, o),
                                                     always_call=True))
            self._post_ids.append(None if mod is self.model else handles[-1].id)
        return handles

    def _lanes(self, device: torch.device) -> Lanes:
        if device not in self.lanes:
            self.lanes[device] = Lanes(device)
        return self.lanes[device]

    # ---- moves -------------------------------------------------------------------------
    def _out(self, s: _Slot, step_start: bool = False) -> None:
        """Copy p to its host run if it may have changed, then free its device storage.

        At a forward's start trainable parameters are copied every time (an optimizer's
        kernel need not bump the version counter); otherwise only when the version moved."""
        p = s.param
        lanes = self._lanes(p.device)
        if lanes.cuda and s.ready is not None:
            # Stream wait: a prefetch into p that no forward waited for (its module did not
            # run) must land before p is copied out or its memory is freed for reuse.
            torch.cuda.current_stream(p.device).wait_event(s.ready)
            s.ready = None
        if (step_start and p.requires_grad) or s.version != p._version:
            if lanes.cuda:
                d2h = lanes.d2h
                d2h.wait_stream(torch.cuda.current_stream(p.device))  # stream wait: p's last writes
                with torch.cuda.stream(d2h):
                    mark = self.clock.start(d2h)
                    s.host.copy_(p.data.view(-1), non_blocking=True)
                    self.clock.stop(mark, "copy", d2h)
                    s.event = torch.cuda.Event()
                    s.event.record(d2h)
                # Buffer reuse: p's block is handed out again only after the d2h read.
                p.data.record_stream(d2h)
            else:
                s.host.copy_(p.data.view(-1))
            s.version = p._version
            self.report.param_bytes_to_host += s.nbytes
        p.untyped_storage().resize_(0)
        s.on_device, s.ready = False, None

    def _in(self, s: _Slot) -> None:
        """Give p its device storage back and copy it in on the h2d stream."""
        p = s.param
        lanes = self._lanes(p.device)
        p.untyped_storage().resize_(s.nbytes)
        if lanes.cuda:
            h2d = lanes.h2d
            # Stream wait: the new storage may reuse memory of tensors freed by kernels still
            # queued on the compute stream; write it only after them.
            h2d.wait_stream(torch.cuda.current_stream(p.device))
            lanes.wait(h2d, s.event)  # stream wait: the copy out to the host is done
            with torch.cuda.stream(h2d):
                mark = self.clock.start(h2d)
                p.data.view(-1).copy_(s.host, non_blocking=True)
                self.clock.stop(mark, "copy", h2d)
                s.ready = torch.cuda.Event()
                s.ready.record(h2d)
            s.event = s.ready
        else:
            p.data.view(-1).copy_(s.host)
        s.on_device = True
        self.report.param_bytes_to_device += s.nbytes

    def _fetch(self, u: int) -> None:
        for s in self.units[u]:
            if not s.on_device:
                self._in(s)

    def _use(self, u: int) -> None:
        """Fetch unit u if needed and make the current stream wait for its copies."""
        self._fetch(u)
        for s in self.units[u]:
            if s.ready is not None:
                cur = torch.cuda.current_stream(s.param.device)
                mark = self.clock.start(cur)
                cur.wait_event(s.ready)  # stream wait: the weights have landed
                self.clock.stop(mark, "stall", cur)
                s.ready = None

    def _ahead(self, order: list[int], start: int, step: int) -> None:
        """Prefetch units order[start], order[start + step], ... up to `window` bytes."""
        got, i = 0, start
        while 0 <= i < len(order) and got < self.window:
            self._fetch(order[i])
            got += sum(s.nbytes for s in self.units[order[i]])
            i += step

    # ---- hooks -------------------------------------------------------------------------
    def begin_forward(self) -> None:
        self.prev, self.order = self.order, []
        self._prev_pos = {u: i for i, u in enumerate(self.prev)}
        self._pos: dict[int, int] = {}
        self._node_hooks = []  # the previous forward's graph keeps its hooks; see close()
        self._queued = None    # (a backward that raised never ran its callback)
        self._running = []     # (a forward interrupted by Ctrl-C left its units here)
        for s in self.slots.values():
            if s.on_device:
                self._out(s, step_start=True)

    def _pre(self, u: int) -> None:
        hid, hooks = self._post_ids[u], self.modules[u]._forward_hooks
        if hid is not None and hid in hooks:
            hooks[hid] = hooks.pop(hid)
        if _in_backward():  # a recomputation (checkpoint): bring the weights in, no more
            self._use(u)
            return
        if u not in self._pos:
            self._pos[u] = len(self.order)
            self.order.append(u)
        self._running.append(u)
        self._use(u)
        if u in self._prev_pos:
            self._ahead(self.prev, self._prev_pos[u] + 1, +1)

    def _post(self, u: int, output) -> None:
        if _in_backward():  # a recomputation saved p for the backward running now: p stays
            return          # (this backward's end callback finds it on the device)
        if self._running and self._running[-1] == u:  # (calls nest: u is the innermost)
            self._running.pop()
        if torch.is_grad_enabled():
            leaves = tree_leaves(output)
            if not all(isinstance(x, _PLAIN) for x in leaves):
                return  # an object we cannot look into (a dataclass): no node of its backward
                        # to hook, so p stays on the device (the next forward moves it out)
            nodes = {t.grad_fn for t in leaves
                     if isinstance(t, torch.Tensor) and t.grad_fn is not None}
            for node in nodes:
                self._node_hooks.append(node.register_prehook(lambda g, u=u: self._backward(u)))
        # A parameter shared with a module still running (a parent that owns it too) is
        # used again by that forward: it leaves when that module's forward ends.
        busy = {id(s) for v in self._running for s in self.units[v]}
        for s in self.units[u]:
            if s.on_device and id(s) not in busy:
                self._out(s)

    def _backward(self, u: int) -> None:
        if self.closed:  # a graph that outlived the swap: parameters are on the device
            return
        task = _task_id() if _task_id is not None else 0
        if self._queued != task:  # first node of this backward (a failed one drops callbacks)
            self._queued = task
            # Runs when this backward ends: every parameter back on the device for the step.
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        self._use(u)
        if u in self._bwd_pos:
            self._ahead(self.bwd, self._bwd_pos[u] - 1, -1)

    def _after_backward(self) -> None:
        self._queued = None
        if not self.closed:
            self.restore()

    def end_forward(self, outputs: list[torch.Tensor]) -> None:
        self.bwd = list(self.order)
        self._bwd_pos = dict(self._pos)
        if not (torch.is_grad_enabled() and any(t.grad_fn is not None for t in outputs)):
            self.restore()  # no backward will come to fetch them

    def restore(self) -> None:
        """Every parameter on the device, usable on the current stream."""
        for u in range(len(self.units)):
            self._use(u)

    def close(self) -> None:
        """Restore every parameter, wait for the copies, return the host runs."""
        self.restore()
        self.closed = True
        for h in self._node_hooks:
            h.remove()
        self._node_hooks.clear()
        self._forget()
        # A closed swap kept for its report must not hold parameters the model has replaced
        # since (load_state_dict(assign=True)): the units' slots and modules refer to them
        self.units.clear()
        self.modules.clear()

    def _forget(self) -> None:
        """Return every host run and let go of every parameter (another swap may take it)."""
        for s in self.slots.values():
            if s.event is not None:
                host_wait(s.event)  # host sync: closing; the host run is about to be reused
            self.store.free(s.run)
            _OWNED.pop(id(s.param), None)
        self.slots.clear()
