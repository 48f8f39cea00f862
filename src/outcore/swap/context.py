"""`outcore.swap(model, ...)`: swapping for one model, as a context manager or an object.

    with outcore.swap(model, gpu_memory="16GiB", min_swap_bytes="1MiB"):
        loss = loss_fn(model(x), y)
        loss.backward()
    optimizer.step()

    s = outcore.swap(model, gpu_memory="16GiB")     # or for a whole loop
    for x, y in data: ...
    print(s.report().summary()); s.close()

Hooks go on from construction until close() (or the end of the `with` block, also on an
exception). The saved-tensor hooks are pushed by a forward pre-hook of `model` and popped
by its forward hook (always_call, so also when forward raises): they cover exactly the
tensors saved inside model's forward, nest with other swaps (the innermost one packs) and
never stay on autograd's hook stack after the forward (after a KeyboardInterrupt inside it,
for which torch runs no always-call hook: until the next tensor saved on its thread outside
it, or the next forward, or close()). close() removes every module hook,
puts every parameter back on the device, and waits for copies still in flight.

The model's modules and parameters are read once, at construction: a layer or parameter
replaced afterwards (load_state_dict(assign=True) among others) needs a new swap. Which of
them require grad is read at every forward.
"""

from __future__ import annotations

import dataclasses
import sys
import threading

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ..errors import OutcoreError
from .activations import ActivationSwapper, _alias
from .allocator import ExpandableSegments
from .config import SwapConfig
from .host import HostStore
from .param_guard import (COMPILED, ParamGuard, compiled_caller, refuse_compiled,
                          wanted as guard_wanted)
from .params import ParamSwapper, _tensors
from .report import CopyClock, SwapReport
from .signature import signature
from .where import ModuleNames

_OPTIONS = {f.name for f in dataclasses.fields(SwapConfig)}


class Swap:
    """Tensor swapping for `model`; see the module docstring. Build it with `swap()`."""

    def __init__(self, model: nn.Module, config: SwapConfig, store: HostStore | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"outcore.swap needs a torch.nn.Module, got {type(model).__name__}")
        if store is not None and not isinstance(store, HostStore):
            raise TypeError(f"store must be an outcore.swap.HostStore, got {type(store).__name__}")
        self.model, self.config = model, config
        self._own_store = store is None
        self.store = store or HostStore(config.slab_bytes, config.host_memory)
        self._report = SwapReport(timed=config.timing)
        self.clock = CopyClock(self._report, config.timing)
        self.acts = ActivationSwapper(config, self.store, self._report, self.clock)
        self.acts.pending_grad = self._pending_grad
        # Read once: model.parameters() walks every module (2.5 ms for 511 modules on a
        # 2-core CPU host), and a forward's pre-hook runs before its first kernel, with the
        # GPU idle after a synchronized step.
        self._params = list(model.parameters())
        self._stack: list[saved_tensors_hooks | None] = []   # None: a forward run unhooked
        self._depth = 0
        self._frames: list = []     # the frame that called each live forward (innermost last)
        self._thread: int | None = None   # the thread the outermost live forward runs on
        self._hooked = True
        self.closed = False
        self._entered = 0           # `with` blocks of this swap entered and not left
        self._final: SwapReport | None = None
        self.params = None
        self._guard: ParamGuard | None = None   # this forward's check of parameter reads
        self._checked: set = set()    # forward signatures already checked by a guard
        self.segments = ExpandableSegments(config.expandable_segments)   # allocator.py
        self._handles = [model.register_forward_pre_hook(self._enter, with_kwargs=True)]
        try:
            if config.swap_params:
                refuse_compiled(model)
                self.params = ParamSwapper(model, self.store, self._report, self.clock,
                                           config.param_prefetch_bytes, config.force_copy)
                self._handles += self.params.install()
            if config.by_module:  # the innermost module running saves (where.py)
                self.acts.names = ModuleNames(model)
            self._handles.append(model.register_forward_hook(self._exit, always_call=True))
            # The guard ends after every forward hook of the model (moved last at each
            # forward: one added later, reading a parameter, is checked too)
            self._unguard = model.register_forward_hook(self._end_guard, always_call=True)
            self._handles.append(self._unguard)
        except BaseException:
            self.close()
            raise

    # ---- forward boundaries ---------------------------------------------------------------
    def _enter(self, module, args, kwargs) -> None:
        if self.params is not None and compiled_caller():
            raise OutcoreError(COMPILED)
        if self._depth:
            self._drop_dead_forwards()
        self._depth += 1
        # torch's call of the module: on the stack for as long as this forward runs (held
        # only while it runs: _exit lets go of it)
        self._frames.append(sys._getframe(1))
        if self._depth == 1:
            self._thread = threading.get_ident()
            if self.params is not None:
                self.params.begin_forward()
            sig = signature(module, args, kwargs, self._params)
            if self.params is not None and guard_wanted(module, self._checked, sig):
                self._guard = ParamGuard(self.params)
                self._guard.__enter__()
                hooks = module._forward_hooks
                if self._unguard.id in hooks:
                    hooks[self._unguard.id] = hooks.pop(self._unguard.id)
            self._hooked = not self.acts.fits_unhooked(sig)
            if self._hooked:
                self.acts.begin_forward(sig)
            else:
                self._report.unhooked_forwards += 1
        ctx = None
        if self._hooked:
            ctx = saved_tensors_hooks(self._pack, self.acts.unpack)
            ctx.__enter__()
        self._stack.append(ctx)

    def _pop_guard(self) -> None:
        """Take this forward's guard off torch's mode stack, wherever it is: not the top
        one when a mode was pushed after it and is still on (the user's own, around the
        forward after an interrupted one; another swap's guard, its forward running)."""
        guard, self._guard = self._guard, None
        if guard is None:
            return
        above = []
        while torch._C._len_torch_function_stack():
            mode = torch._C._pop_torch_function_stack()
            if mode is guard:
                break
            above.append(mode)
        for mode in reversed(above):
            torch._C._push_on_torch_function_stack(mode)

    def _end_guard(self, module, args, output) -> None:
        if self._depth == 0:
            self._pop_guard()

    def _pop_hooks(self, here: bool = True) -> None:
        """Leave the innermost forward's saved-tensor hooks (None: it ran unhooked).
        here=False: they are on another thread's stack (a forward interrupted there), which
        this thread cannot pop (torch asserts): they are only forgotten."""
        ctx = self._stack.pop() if self._stack else None
        if ctx is not None and here:
            ctx.__exit__(None, None, None)

    def _drop_dead_forwards(self) -> None:
        """Forget forwards that ended without _exit: torch runs always-call hooks for an
        Exception only, so a KeyboardInterrupt inside forward leaves depth, the frame and
        its saved-tensor hooks behind. A forward is dead when its caller's frame is no
        longer on this thread's stack (a nested call is made while it is)."""
        live, f = set(), sys._getframe(2)
        while f is not None:
            live.add(id(f))
            f = f.f_back
        here = self._thread in (None, threading.get_ident())
        while self._frames and id(self._frames[-1]) not in live:
            self._frames.pop()
            self._pop_hooks(here)
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                self._pop_guard()
                if self._hooked:
                    self.acts.end_forward([], failed=True)

    def _pack(self, t: torch.Tensor):
        """acts.pack while the forward that pushed these hooks runs. One interrupted by a
        KeyboardInterrupt left them pushed: the first tensor saved on its thread after it
        (a user's op after Ctrl-C) finds its frame gone, takes them off and is saved as it
        is. Saves on autograd's device threads (no forward frames there) are not checked.
        The walk costs about 1-2 us a save at ten modules deep (CPU, session 47's review)."""
        if self._frames and self._thread == threading.get_ident():
            target, f = self._frames[-1], sys._getframe(1)
            while f is not None and f is not target:   # a few frames up when it runs
                f = f.f_back
            if f is None:
                # Not inside a backward (a create_graph gradient, a reentrant checkpoint's
                # recompute): the engine puts the thread's hooks back after each node, so
                # popping them there would leave them pushed for good. The next save outside
                # it, the next forward or close() takes them off.
                if _graph_task() == -1:
                    self._drop_dead_forwards()
                return _alias(t)
        return self.acts.pack(t)

    def _exit(self, module, args, output) -> None:
        if self._frames:
            self._frames.pop()
        self._pop_hooks()
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            outs = _tensors(output)
            # Run from torch's `except` when forward raised: a forward that stopped part
            # way saved only part of its tensors, so it cannot vouch for the next.
            failed = sys.exc_info()[0] is not None
            if self._hooked:
                self.acts.end_forward(outs, failed=failed)
            else:
                self.acts.end_unhooked(failed)
            if self.params is not None:
                self.params.end_forward(outs)

    def _pending_grad(self, device: torch.device) -> int:
        return sum(p.numel() * p.element_size() for p in self._params
                   if p.requires_grad and p.grad is None and p.device == device)

    # ---- public ---------------------------------------------------------------------------
    def report(self) -> SwapReport:
        """Counters so far (waits for pending copy timings: a host sync); after close(),
        the counters as they were at close."""
        if self._final is not None:
            return self._final.snapshot()
        self.clock.fold(block=True)
        self._report.host_reserved_bytes = self.store.reserved_bytes
        self._report.host_peak_bytes = self.store.peak_in_use_bytes
        return self._report.snapshot()

    @property
    def trace(self) -> list[tuple]:
        """Every keep/offload/fetch decision in order (with trace=True)."""
        return self.acts.trace

    def close(self) -> None:
        """Remove every hook, put parameters back on the device, release host memory."""
        if self.closed:
            return
        self.closed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
        here = self._thread in (None, threading.get_ident())
        self._frames.clear()
        # A closed swap kept for its report must not keep parameters the model has
        # replaced since (load_state_dict(assign=True)) alive: their memory is the model's
        self._params = []
        while self._stack:  # close() inside the model's forward, or after one interrupted
            self._pop_hooks(here)   # (KeyboardInterrupt: torch ran no always-call hook)
        self._pop_guard()
        if self._depth:  # ... whose dedup table would keep its saved tensors and runs
            self._depth = 0
            self.acts.end_forward([], failed=True)
        self.acts.remove_node_hooks()
        self.acts.finish()
        if self.params is not None:
            self.params.close()
        self._final = self.report()
        self.segments.release()
        if self._own_store:
            self.store.release()

    def __enter__(self) -> "Swap":
        if self.closed:
            raise OutcoreError("this outcore.swap is closed (its with block ended or close() "
                               "ran): make a new one with outcore.swap(model, ...)")
        self._entered += 1
        return self

    def __exit__(self, *exc) -> bool:
        self._entered -= 1
        if self._entered <= 0:  # the outermost `with` of this swap: nested ones keep it on
            self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else "active"
        return f"Swap({type(self.model).__name__}, {self.config}, {state})"


def _graph_task() -> int:
    """The id of the backward running on this thread, -1 outside one."""
    get = getattr(torch._C, "_current_graph_task_id", None)
    return get() if get is not None else -1


def swap(model: nn.Module, gpu_memory=None, min_swap_bytes="1MiB", *,
         store: HostStore | None = None, **options) -> Swap:
    """Swap `model`'s saved activations (and, with swap_params=True, its parameters)
    between the device and pinned host memory; see SwapConfig for every option."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"outcore.swap got unknown option(s) {', '.join(unknown)}: "
                        f"choose from {', '.join(sorted(_OPTIONS - {'gpu_memory', 'min_swap_bytes'}))}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"outcore.swap needs a torch.nn.Module, got {type(model).__name__}")
    cfg = SwapConfig.build(gpu_memory=gpu_memory, min_swap_bytes=min_swap_bytes, **options)
    return Swap(model, cfg, store)

