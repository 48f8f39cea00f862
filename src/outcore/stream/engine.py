"""The streaming engine: fp32 masters and AdamW state on the host, blocks on the device.

    engine = Engine(model, optimizer=AdamW(lr=3e-4), device="cuda", gpu_memory="16GiB")
    loss = engine.train_step({"input_ids": x, "labels": y})

One step, for a model = rest + blocks 1..N:
  forward   rest weights loaded; block g copied in (prefetched during g-1), every
            micro-batch through g, input kept as checkpoint, slot released
  backward  block g reloaded (block N is still resident), micro-batches recomputed with
            a graph, fp32 gradient accumulated on the device, copied to the host once
  update    a worker thread runs AdamW on g as soon as its gradient lands (schedule.py);
            the next forward of g waits only for g's own update
"""

from __future__ import annotations

import inspect
import math
import time
import weakref

import torch
from torch import nn
from torch.func import functional_call

from ..errors import OutcoreError
from ..memory import PinnedPool, unpin_all
from ..transfer import Lanes
from ..units import parse_bytes
from .blocks import build_groups, find_blocks
from .device import DeviceCache, check_slots
from .deferred import DeferredUpdates
from .deferred import check_option as check_held
from .device_update import DeviceUpdater
from .device_choice import check_option as check_gpu_updates
from .edges import StepEdges
from .accounting import StepAccounting
from .flow import StepFlow
from .keep import KeptWeights
from .keep import check_option as check_keep
from .materialize import lazy_fill
from .ring import Ring
from .optimizer import AdamW, GroupOptimizers
from .runner import BlockRunner
from .schedule import UpdateSchedule
from .split import check_shared
from .peaks import PeakWatch
from .stash import ActivationStash
from .stats import ComputeTimer, StepStats
from .validate import (check_batch, check_copy_option, check_host_room, check_loss,
                       check_loss_fn, check_lr, check_model, check_optimizer,
                       check_step_options, forward_kwargs, resolve_copy_option,
                       resolve_device, resolve_staged_cap)


# The fewest blocks' gradients that may wait for the CPU AdamW (Engine.max_staged_grads:
# more, or no cap, where the host has room: validate.resolve_staged_cap)
STAGED_GRADS = 8


class Engine(StepFlow, StepAccounting):
    """Train `model` with its state in host memory; see the module docstring."""

    def __init__(self, model: nn.Module, optimizer: AdamW | None = None, device="cpu",
                 compute_dtype: torch.dtype | None = None, micro_batch_size: int | None = None,
                 max_grad_norm: float | None = None, gpu_memory: str | int | None = None,
                 blocks: str | None = None, gpu_updates: int | str | None = "balance",
                 skip_nonfinite: bool = False, distributed: bool | None = None,
                 held_gpu_updates: int | str | None = 0,
                 host_weight_copy: bool | str = "auto",
                 keep_weights: bool = True, block_slots: int = 3,
                 shared_args=None, init=None, verbose: bool = False):
        check_model(model)
        self._closed = False
        self.device = resolve_device(device)
        if compute_dtype is None:
            compute_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if compute_dtype not in (torch.float32, torch.bfloat16):
            fp16 = " (float16 would need loss scaling, which the engine does not do)" \
                if compute_dtype == torch.float16 else ""
            raise OutcoreError(f"compute_dtype={compute_dtype} is not supported{fp16}: use "
                               "torch.float32 or torch.bfloat16")
        check_step_options(micro_batch_size, max_grad_norm, skip_nonfinite)
        self.gpu_memory = parse_bytes(gpu_memory, "gpu_memory")
        self.block_slots = check_slots(block_slots)
        self.compute_dtype = compute_dtype
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        # Hold every update until the step's global gradient norm is known: needed for
        # clipping, and for skip_nonfinite (a non-finite gradient anywhere skips the whole
        # step). It costs the overlap of the CPU updates with backward.
        self.hold_updates = max_grad_norm is not None or bool(skip_nonfinite)
        self.optimizer_config = check_optimizer(optimizer)
        # A model built on the meta device is made real group by group, straight into the
        # host state (materialize.py): no whole fp32 model is ever allocated.
        self._fill = lazy_fill(model, init)
        self._model = model.float() if self._fill else model.to("cpu").float()
        self.blocks_path, container = find_blocks(model, blocks)
        self.groups = build_groups(model, self.blocks_path, container)
        # block arguments never split into micro-batches (split.split_extra)
        self.shared_args = check_shared(shared_args, [g.module for g in self.groups[1:]])
        if type(held_gpu_updates) is int and held_gpu_updates > len(self.groups) - 1:
            raise OutcoreError(f"held_gpu_updates={held_gpu_updates} but the model has "
                               f"{len(self.groups) - 1} blocks: use at most that, or 'auto'")
        from .plan import check_fits, describe
        check_fits(self)  # before anything large is pinned or allocated on the device
        self.lanes = Lanes(self.device)
        if verbose and self.lanes.cuda:
            n = sum(g.numel for g in self.groups)
            print(f"outcore: page-locking {n * 4 / 2**30:.1f} GiB of fp32 master weights "
                  "(about 0.5 s per GiB, once)", flush=True)
        # "auto": the fused copies where they can run and the host has room, else none
        host_weight_copy = resolve_copy_option(self, host_weight_copy, held_gpu_updates,
                                               STAGED_GRADS)
        self.host_weight_copy = host_weight_copy   # as resolved: no "auto" left
        shards = getattr(self, "world", 1)   # a ShardedEngine's rank holds 1/world
        check_host_room(self.groups, self.hold_updates, bool(host_weight_copy), STAGED_GRADS,
                        shards=shards, lazy=self._fill is not None)
        # Gradients staged in pinned host memory for the CPU AdamW at once (None: no cap;
        # held updates keep every gradient anyway): as many as the host has room for.
        self.max_staged_grads: int | None = resolve_staged_cap(
            self.groups, self.hold_updates, bool(host_weight_copy), STAGED_GRADS,
            shards=shards, lazy=self._fill is not None)
        self.host = self._host_state()
        if hasattr(self._fill, "close"):
            self._fill.close()   # RowBlocks' threads: filling is done
        # What pin_ registered in place must be unregistered before its memory can be
        # freed (close(), or this engine's collection): see memory.unpin_all.
        self._pinned, self._pools = [self.host.master, self.host.copy], [self.host.grad_pool]
        self._unpin = weakref.finalize(self, unpin_all, self._pinned, self._pools)
        self._unpin.atexit = False   # at exit the process's registrations end with it
        # None, "all" (True) or "device": which groups' passes load 16-bit copies
        self.copy_mode = check_copy_option(self, host_weight_copy, held_gpu_updates)
        if self.copy_mode:
            self.host.keep_copies(compute_dtype)
        # host_weight_copy="fused": the CPU AdamW writes the bf16 copies in its own pass
        # (cast_kernel.py; None when it cannot be built: a cast after torch's AdamW).
        self.cast_kernel = None
        if host_weight_copy == "fused" and compute_dtype == torch.bfloat16:
            from .cast_kernel import load
            self.cast_kernel = load()
        self._host_changed = False   # set by .model: the caller may have edited weights
        self.opt = GroupOptimizers(self.host.master, self.optimizer_config)
        self._pinned += [self.opt.m, self.opt.v]   # pinned by enable(): the lists, read late
        self.cache = self._device_cache()
        # Gradient buffers of the blocks, as large as a slot, reused in turn (ring.py).
        self.grad_ring = Ring(self.lanes, 3, self.cache.slots[0].buf.numel()
                              if self.cache.slots else 0)
        self.stash = ActivationStash(self.lanes, PinnedPool(pin=self.lanes.cuda))
        # Device-updated blocks' weights kept for the next forward (keep.py); they share the
        # checkpoints' room. On by default since session 9's A/B on the H200.
        self.keep = KeptWeights(self)
        self.keep.enabled = check_keep(keep_weights)
        self.stash.beside = lambda: self.keep.bytes
        self.peaks = PeakWatch.for_device(self.stash, self.device, self.lanes.cuda)
        self.edges = StepEdges(self.lanes, PinnedPool(pin=self.lanes.cuda))
        self._pools += [self.stash.pool, self.edges.pool]
        self.runner = BlockRunner(self)
        # schedule.order: which staged gradient the CPU AdamW takes next (cpu_order.py)
        self.schedule = UpdateSchedule(self._apply_update, landed=self._grad_landed)
        self.timer = ComputeTimer(self.lanes.cuda)
        self.stats = StepStats()
        self.updater = DeviceUpdater(self)
        # g's host weights are current after this event (a device update's or a held
        # update's write-back): every load of g waits for it.
        self.host_ready = self.updater.weights_ready
        self.gpu_updates = check_gpu_updates(gpu_updates, self.hold_updates,
                                             self.lanes.cuda)
        if self.gpu_updates == "balance":
            self.updater.policy = "balance"
        if isinstance(self.gpu_updates, int) and self.gpu_updates > 0:
            self.updater.enable(self.updater.candidates()[:self.gpu_updates + 1])
        self._cpu_busy_s = 0.0
        self._cpu_params = 0
        self.step_count = 0
        self.in_train_step = False
        self._forward_params = inspect.signature(self._model.forward).parameters
        self._local = [[n[len(g.name) + 1:] if g.index else n for n in g.names]
                       for g in self.groups]
        self._buffers = self._device_buffers()
        self._dropout = any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())
        self._sq: list[torch.Tensor] = []
        self._anchor = torch.zeros((), device=self.device, requires_grad=True)
        self._other_peak: int | None = None
        # Held updates of a share of the blocks made on the device by the next load
        # (deferred.py); off by default until measured on a GPU.
        self.deferred = DeferredUpdates(self)
        self.held_gpu_updates = check_held(held_gpu_updates, self.hold_updates,
                                           self.lanes.cuda)
        if isinstance(self.held_gpu_updates, int) and self.held_gpu_updates > 0:
            self.deferred.enable(range(1, self.held_gpu_updates + 1))
        if self.gpu_memory is not None and self.lanes.cuda:
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.gpu_memory / total),
                                                       self.device)
        self.verbose = verbose
        if verbose:
            print(describe(self))

    def __new__(cls, *args, distributed: bool | None = None, **kwargs):
        # distributed=True, or None under torchrun (a process group of > 1 ranks): the
        # sharded data-parallel engine of outcore.parallel.
        if cls is Engine:
            from ..parallel.launch import use_distributed
            if use_distributed(distributed):
                from ..parallel.engine import ShardedEngine
                return super().__new__(ShardedEngine)
        return super().__new__(cls)

    def _host_state(self):
        from .storage import HostState
        return HostState(self.groups, pin=self.lanes.cuda, fill=self._fill)

    def _device_cache(self) -> DeviceCache:
        return DeviceCache(self.lanes, [g.numel for g in self.groups], self.block_slots)

    # -- the user's view ---------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The user's module, its parameters the current fp32 masters (waits for updates).
        Edits to them are seen by the next train_step, which reloads every group."""
        self.synchronize()
        self._buffers_to_model()
        self._host_changed = True
        return self._model

    def synchronize(self) -> None:
        """Wait until every pending optimizer update has been applied."""
        self.deferred.flush()
        self.schedule.wait_all()
        self.updater.synchronize()
        self._settle_times(block=True)

    def set_lr(self, lr: float) -> None:
        """Learning rate for the updates of the next train_step.

        Bound when that step's backward begins: its forward has waited for every update of
        the step before, so updates still pending now keep their own step's rate (setting
        it at once raced with them: runs with a schedule were not reproducible).
        """
        self._next_lr = check_lr(lr)

    @property
    def num_params(self) -> int:
        return self.host.numel

    def host_bytes_per_param(self) -> float:
        held = self.host.bytes() + self.opt.state_bytes() + self.stash.pool.bytes_allocated
        return held / max(1, self.num_params)

    # -- the step ------------------------------------------------------------------
    def train_step(self, batch: dict, loss_fn=None) -> float:
        """One optimizer step on `batch` (a dict of tensors, dim 0 = samples).

        Returns the batch's mean loss (a host sync at the end of the step).
        """
        t0 = time.perf_counter()
        if self._closed:
            raise OutcoreError("train_step after engine.close(): its optimizer thread has "
                               "stopped; build a new Engine (or Engine.load a checkpoint)")
        check_loss_fn(loss_fn)
        self.stash.clear()   # checkpoints a failed step's backward never took
        kwargs = forward_kwargs(self._forward_params, check_batch(batch),
                                self.edges.to_device)
        self._nonfinite_groups: list[int] = []
        self.stats.optimizer_wait_s = 0.0
        self._sq.clear()
        self.reload_if_edited()
        self.stash.limit = self._stash_limit()
        self.peaks.begin_step()   # resets the allocator's peak counters (peaks.py)
        originals = self.runner.install()
        try:
            self._forward_backward(kwargs, batch, loss_fn)
        finally:
            self.runner.uninstall(originals)
            self.in_train_step = False
        with torch.profiler.record_function("outcore.finish_step"):
            self._finish_step(t0)
        loss_value = self.edges.loss_value()  # host sync: the copy posted after the forward
        self._record(t0, loss_value)
        return loss_value

    def _forward_backward(self, kwargs, batch, loss_fn) -> torch.Tensor:
        self.in_train_step = True
        self.timer.phase(first=True)   # the step's start on the compute stream
        t = time.perf_counter()
        self.schedule.wait(0)  # host wait: rest's update from the last step
        self.stats.optimizer_wait_s += time.perf_counter() - t
        rest = self.cache.acquire_rest(self.host.master[0], self.host_ready.get(0))
        self.prefetch_forward(1)
        # One leaf per parameter (as in the blocks' backward, runner.py): views of one flat
        # leaf would each get a zero-filled rest-sized gradient, summed by autograd.
        leaves = {k: v.detach().requires_grad_(True)
                  for k, v in self.block_params(0, rest).items()}
        tensors = dict(leaves)
        tensors.update(self._buffers[0])
        with self.runner._autocast(self.runner.autocast_state()):
            try:
                out = functional_call(self._model, tensors, (), kwargs)
            except OutcoreError:
                raise   # one of the engine's own (a block's call), already one line
            except (TypeError, ValueError, KeyError, IndexError) as e:
                raise OutcoreError(f"the model's forward rejected the batch (keys "
                                   f"{sorted(batch)}): {str(e).splitlines()[0]}") from None
            dev_batch = {k: kwargs[k] if k in kwargs else self.edges.to_device(v)
                         for k, v in batch.items()}
            loss = self._loss(out, dev_batch, loss_fn)
        check_loss(loss)   # attributes only: no host sync
        self.edges.post_loss(loss)
        # Every update of the last step has been waited for by this forward, so holding
        # (clipping) now cannot starve it.
        if getattr(self, "_next_lr", None) is not None:  # no update is pending here
            self.opt.set_lr(self._next_lr)
            self._next_lr = None
        self.schedule.begin_backward(hold=self.hold_updates)
        grad0 = self._accumulate_into(leaves, rest.numel()) if rest.numel() else None
        # Copies kept for this forward that it did not use are stale once backward updates.
        self.keep.drop()
        self.timer.phase()   # backward's start
        loss.backward()
        if grad0 is not None:
            self.grad_ready(0, grad0, self.cache.rest)
        self.timer.phase()   # backward's end (rest's gradient handed over)
        return loss.detach()

    def _loss(self, out, batch, loss_fn) -> torch.Tensor:
        if loss_fn is not None:
            return loss_fn(out, batch)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if not isinstance(loss, torch.Tensor):
            raise OutcoreError("the model returned no loss: put 'labels' in the batch or "
                               "pass loss_fn=lambda output, batch: ...")
        return loss

    def _finish_step(self, t0: float) -> None:
        # last_step_skipped: the global gradient norm was not finite, no group was updated
        # (without held updates, nonfinite_check skips just the non-finite groups).
        self.last_step_skipped = False
        if not self.hold_updates:
            self.schedule.end_backward(1.0)
            return
        total = self._global_norm()
        self.last_grad_norm = total
        if not math.isfinite(total):
            pool = self.host.grad_pool
            for hbuf, hsq, done in self.schedule.drop_pending():
                # Buffer reuse: the skipped gradients' host buffers go back to the pool
                # (as _apply_update's do), once the d2h copies into them are done.
                pool.put(hbuf, after=done)
                pool.put(hsq, after=done)
            self.deferred.drop()
            self.schedule.end_backward(1.0)
            self.stats.skipped_steps += 1
            self.last_step_skipped = True
            return
        clip = self.max_grad_norm
        scale = 1.0 if clip is None else min(1.0, clip / (total + 1e-6))
        self.deferred.release(scale)
        self.schedule.end_backward(scale)

    def _global_norm(self) -> float:
        """The L2 norm over every group's gradient of this step."""
        # Host sync: held updates need the global norm before any of them may run.
        return torch.sqrt(torch.stack([s.to(self.device) for s in self._sq]).sum()).item()

    def save(self, path) -> None:
        from .checkpoint import save
        save(self, path)

    @classmethod
    def load(cls, path, model: nn.Module, **kwargs) -> "Engine":
        from ..parallel.launch import use_distributed
        if cls is Engine and use_distributed(kwargs.get("distributed")):
            from ..parallel.checkpoint import load as load_sharded
            return load_sharded(path, model, **kwargs)
        from .checkpoint import load
        return load(cls, path, model, **kwargs)

    def close(self) -> None:
        self._closed = True   # train_step refuses from here: no worker would run its updates
        self.synchronize()
        self.keep.drop()   # device memory of the kept weights goes back now
        self.schedule.close()
        self._unpin()   # the model's parameters stay usable: pageable from here on
