"""The sharded data-parallel engine: outcore.Engine(..., distributed=True) under torchrun.

Per step, with N ranks each holding 1/N of every group's host state (shard.py):
  batch     every rank gets the same global batch (checked: batchcheck.py) and keeps its
            rows (shares.py); its loss is scaled by its share of the loss's denominator
            (label tokens that are not -100 after the causal shift when the batch has
            `labels` and no loss_fn, else rows), so the gradients summed over ranks are
            those of the whole batch's mean
  forward   block g: this rank's shard host->device, all-gather into the slot, compute
  backward  the fp32 flat gradient of g is reduce-scattered: each rank receives the sum
            over ranks of its own slice, copies it to the host and runs AdamW on its shard
  clipping  the global norm is the sum over ranks of each shard's norm^2 (one all-reduce)
  skipping  without clipping, a group whose gradient is not finite on any rank's slice is
            skipped on every rank (one scalar all-reduce a group), as in one process
  signals   SIGINT/SIGTERM reach the program's handler at the end of the same step on every
            rank (signals.py), so all ranks stop, or checkpoint, after the same step
Device-side AdamW (gpu_updates) is off: its plan is measured per rank and would diverge.
"""

from __future__ import annotations

import dataclasses
import zlib

import torch

from ..errors import OutcoreError
from ..stream.engine import Engine
from ..stream.storage import check_rebound_shape
from .batchcheck import check_same_batch
from .comm import Comm
from .launch import local_device, watchdog
from .shard import ShardedCache, ShardedHost, placeholder
from .shares import ShareMeter
from .signals import Agreement


class ShardedEngine(Engine):
    """Engine with sharded host state and data parallelism; see the module docstring.

    shares: None (equal rows), a list of N positive weights, or "measured" (rows follow
            each rank's measured compute rate: after steps 1..3 and every `measure_every`).
    label_shift: how many leading label positions the model's loss drops (1: causal LM).
    """

    def __init__(self, model, optimizer=None, device="cpu", *, shares=None,
                 measure_every: int = 20, label_shift: int = 1, **kwargs):
        self.comm = Comm(watchdog())
        self.rank, self.world = self.comm.rank, self.comm.world
        if self.comm.nccl and device in ("cuda", "auto", None):
            device = local_device()
        kwargs.pop("distributed", None)
        kwargs["gpu_updates"] = 0
        kwargs["held_gpu_updates"] = 0   # like gpu_updates: off when the ranks shard updates
        if kwargs.get("host_weight_copy", "auto") not in ("auto", False, None):
            raise OutcoreError("host_weight_copy=True is for one process: leave it off "
                               "when distributed")
        kwargs["host_weight_copy"] = False   # shards keep no 16-bit copies (shard.py)
        self.label_shift = label_shift
        self._loss_weight = 1.0
        self._snapshot = False
        self._rows_at: dict[int, int] = {}   # step -> this rank's rows (measured shares)
        # Checked before anything is built: a bad value is a one-line error on every rank.
        self.meter = ShareMeter(self.comm, shares, every=measure_every)
        super().__init__(model, optimizer, device, **kwargs)
        if self.comm.nccl and self.device.type == "cuda":
            # NCCL helpers (Comm.sum_, broadcast_object_list) use the current device: it must
            # be this rank's GPU, also when the caller initialised the process group itself.
            torch.cuda.set_device(self.device)
        self.signals = Agreement()

    # -- construction hooks ----------------------------------------------------------
    def _host_state(self):
        self._check_ranks_agree()   # before the host state is allocated
        return ShardedHost(self.groups, self.rank, self.world, pin=self.lanes.cuda,
                           fill=self._fill)

    def _check_ranks_agree(self) -> None:
        """Collective: every rank must build the same model (parameters, shapes, blocks)
        with the same options that decide the step's collectives or its arithmetic: else
        the first step's collectives mismatch (gloo aborts the process, NCCL hangs or mixes
        blocks) or ranks update their shards differently. One small all-reduce."""
        layout = repr([(g.names, [tuple(p.shape) for p in g.params]) for g in self.groups])
        options = repr((self.hold_updates, self.max_grad_norm, self.meter.mode,
                        self.meter.every, self.label_shift,
                        dataclasses.asdict(self.optimizer_config)))
        mine = [float(zlib.crc32(layout.encode())), float(sum(g.numel for g in self.groups)),
                float(len(self.groups)), float(zlib.crc32(options.encode()))]
        table = self.comm.gather_rows(mine).tolist()
        for r, row in enumerate(table):
            if row[:3] != table[0][:3]:
                raise OutcoreError(
                    f"rank {r} built another model than rank 0 ({int(row[1])} parameters in "
                    f"{int(row[2]) - 1} blocks against {int(table[0][1])} in "
                    f"{int(table[0][2]) - 1}, or other names or shapes): build the same "
                    "model, with the same blocks=, on every rank")
            if row[3] != table[0][3]:
                raise OutcoreError(
                    f"rank {r} was given other engine options than rank 0 (max_grad_norm, "
                    "skip_nonfinite, shares, measure_every, label_shift or the optimizer's): "
                    "pass the same ones on every rank")

    def _device_cache(self):
        if self.block_slots != 3:
            # the deeper prefetch of more slots would reorder this rank's all-gathers
            raise OutcoreError(f"block_slots={self.block_slots} is for one process: leave "
                               "it at 3 with distributed=True")
        return ShardedCache(self.lanes, self.host.padded, self.comm)

    # -- the user's view -------------------------------------------------------------
    @property
    def model(self):
        """Collective (every rank must call it): the full fp32 weights, gathered into the
        user's Parameters (4 bytes/param more on the host until the next train_step), and
        this rank's buffers (BatchNorm's statistics over its own rows, as save writes them).
        As with one process, edits to them (in place, or p.data = t of the same shape) are
        what the next train_step trains and what save writes."""
        self.synchronize()
        self._take_edits()   # a .model before this one may have been edited
        for g, grp in enumerate(self.groups):
            full = self.gather_group(g)
            for p, off in zip(grp.params, grp.offsets):
                p.data = full[off:off + p.numel()].view(p.shape)
        self._buffers_to_model()   # this rank's running statistics (its rows', as saved)
        self._snapshot = True
        return self._model

    def _take_edits(self) -> None:
        """After .model handed out the full weights: this rank's slice of each parameter,
        as the caller may have edited it (in place, or p.data = t of the same shape), back
        into its shard; the next step reloads every group, as the base engine does after
        .model. Edits made on one rank only stay on that rank's slices."""
        if not self._snapshot:
            return
        for g, grp in enumerate(self.groups):
            lo, hi = self.host.bounds(g)
            shard = self.host.master[g]
            for name, p, off, shape in zip(grp.names, grp.params, grp.offsets, grp.shapes):
                check_rebound_shape(name, p, shape)   # p.data = t of another shape
                a, b = max(off, lo), min(off + p.numel(), hi)
                if a < b:
                    shard[a - lo:b - lo].copy_(p.detach().reshape(-1)[a - off:b - off])
        self._host_changed = True

    def gather_group(self, g: int, which: str = "master") -> torch.Tensor:
        """Collective: group g's full padded flat buffer (master, exp_avg or exp_avg_sq) on
        the host of every rank."""
        src = {"master": self.host.master, "exp_avg": self.opt.m, "exp_avg_sq": self.opt.v}
        shard = src[which][g]
        dev = self.device if self.comm.nccl else torch.device("cpu")
        full = torch.zeros(self.host.padded[g], dtype=torch.float32, device=dev)
        if full.numel():
            full.chunk(self.world)[self.rank].copy_(shard)
            self.comm.all_gather(full)
        return full.cpu()

    def batch_rows(self, batch_size: int) -> tuple[int, int]:
        """(start, rows) of this rank's slice of a global batch of `batch_size` rows."""
        rows = self.meter.rows(batch_size)
        return sum(rows[:self.rank]), rows[self.rank]

    # -- the step ----------------------------------------------------------------------
    def train_step(self, batch: dict, loss_fn=None) -> float:
        """One step on the GLOBAL batch (every rank passes the same one); returns the
        whole batch's mean loss (one all-reduce, which also agrees on signals)."""
        self.signals.wrap()
        if self._snapshot:  # drop the gathered copy made by .model, keeping its edits
            self._take_edits()
            for grp in self.groups:
                for p in grp.params:
                    p.data = placeholder(p)
            self._snapshot = False
        sizes = {v.shape[0] for v in batch.values()
                 if isinstance(v, torch.Tensor) and v.dim()} if isinstance(batch, dict) else set()
        if len(sizes) != 1:
            return super().train_step(batch, loss_fn)  # let the base engine explain
        B = sizes.pop()
        check_same_batch(self.comm, batch)   # before anything of the step has run
        start, n = self.batch_rows(B)
        local = {k: v[start:start + n] if isinstance(v, torch.Tensor) and v.dim() else v
                 for k, v in batch.items()}
        labels = batch.get("labels")
        if loss_fn is None and isinstance(labels, torch.Tensor) and labels.dim() >= 2:
            s = self.label_shift
            mine = int((local["labels"][:, s:] != -100).sum())
            total = int((labels[:, s:] != -100).sum())
            # no label token in the whole batch: the loss is the model's (NaN for a mean
            # over none), as in one process
            self._loss_weight = mine / total if total else n / B
        else:
            self._loss_weight = n / B
        part = super().train_step(local, loss_fn)
        # Host sync (collective): every rank's loss part and signal notes in one all-reduce:
        # row r is rank r's [loss part, SIGINT noted, SIGTERM noted]
        rows = torch.zeros(self.world, 3, dtype=torch.float64)
        rows[self.rank] = torch.tensor([part, *self.signals.notes()], dtype=torch.float64)
        rows = self.comm.sum_(rows)
        loss = float(rows[:, 0].sum())
        self._observe_speed(n)
        self.stats.history[-1]["loss"] = loss
        self.stats.history[-1]["rows"] = n
        self.signals.deliver(rows[:, 1:].amax(0).tolist())   # the same on every rank
        return loss

    def _observe_speed(self, n: int) -> None:
        """Hand the meter the compute time of the newest step whose time is known, with
        THAT step's rows: on a GPU stats.compute_s is read once the step's events have run,
        usually a step late (0 before any), and the rows may have changed since."""
        self._rows_at[self.step_count] = n
        timed = self.step_count - self.timer.pending
        rows = self._rows_at.get(timed, 0)
        for k in [k for k in self._rows_at if k < timed]:
            del self._rows_at[k]
        self.meter.observe(rows, self.stats.compute_s if rows and timed >= 1 else 0.0)

    def _loss(self, out, batch, loss_fn) -> torch.Tensor:
        loss = super()._loss(out, batch, loss_fn)
        if self._loss_weight == 0:
            # This rank's rows hold no label token (other ranks' do): its part of the whole
            # batch's mean is 0. The model's own mean over no token is NaN (0/0), and NaN * 0
            # is NaN: it made the step's loss NaN. Its gradient is 0 (ignored tokens get none).
            return torch.nan_to_num(loss) * 0.0
        return loss * self._loss_weight

    def grad_ready(self, g: int, grad: torch.Tensor, w32=None, ring_i=None) -> None:
        # grad: P_g, this rank's part -> P_g / N: every rank's part of this rank's slice.
        part = self.comm.reduce_scatter(grad)
        if ring_i is not None and part.untyped_storage().data_ptr() == \
                grad.untyped_storage().data_ptr():
            # `part` is (a view of) the ring buffer itself (one rank, or gloo's all-reduce):
            # the base gives the buffer back only after its d2h copy has read it.
            super().grad_ready(g, part, w32, ring_i)
            return
        if ring_i is not None:
            # Buffer reuse: the collective has read `grad` once the current stream passes
            # this point (a synchronous collective makes the current stream wait for it).
            self.grad_ring.give(ring_i, self.lanes.event())
        super().grad_ready(g, part, w32)

    def _group_sq(self, grad: torch.Tensor) -> torch.Tensor:
        """Without held updates a group whose squared norm is not finite is skipped
        (flow.nonfinite_check); judged on this rank's slice alone, a NaN in one slice left
        the other ranks' slices of the group updated. So the slices' squared norms are
        summed over the ranks (one scalar all-reduce, on the device with NCCL: no host
        sync) and every rank skips the whole group, as one process does. With held
        updates each slice's own goes into the global norm (_global_norm sums them)."""
        sq = super()._group_sq(grad)
        if self.world > 1 and not self.hold_updates:
            self.comm.sum_(sq)
        return sq

    def _global_norm(self) -> float:
        local = torch.stack([s.to(self.device) for s in self._sq]).sum().reshape(1)
        if not self.comm.nccl:
            local = local.cpu()
        # Host sync: held updates need the global norm (sum over ranks) before any update.
        return float(torch.sqrt(self.comm.sum_(local.double())).item())

    def close(self) -> None:
        super().close()
        self.signals.unwrap()

    def save(self, path) -> None:
        """Collective: every rank writes its shard into `path` (see parallel/checkpoint.py)."""
        from .checkpoint import save
        self.synchronize()
        self._take_edits()   # weights edited through .model are what is saved
        save(self, path)
