"""Running one block: forward over every micro-batch, then backward with recompute.

`BlockFn` is the autograd node of a whole block over the whole batch (batch-major order:
all micro-batches pass through block g before block g+1 is touched). Forward runs without
a graph and keeps only the block's input (the checkpoint); backward loads the weights
again, recomputes each micro-batch with a graph (less the block's last projection, whose
output the backward does not read: tail.py), and accumulates fp32 parameter gradients on
the device before handing them to the engine once.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from .split import (block_input, first_tensor, n_micro, positional_names, split_extra,
                    split_like)
from .tail import TailSkip


class BlockFn(torch.autograd.Function):
    """hidden: B x T x D (any leading batch dim) -> block(hidden): same shape."""

    @staticmethod
    def forward(ctx, runner, g: int, extra, anchor, hidden):
        # `anchor` is a scalar that requires grad, so the block's node is in the graph even
        # when its input does not require grad (the first layer of an nn.Sequential).
        ctx.runner, ctx.g, ctx.extra = runner, g, extra
        ctx.input_grad = hidden.requires_grad
        ctx.autocast = runner.autocast_state()
        # named ranges for torch.profiler traces (bench/stream.py --profile), ~1 us otherwise
        with torch.profiler.record_function(f"outcore.forward_block.{g}"):
            out, ctx.rng = runner.forward_block(g, hidden, extra)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with torch.profiler.record_function(f"outcore.backward_block.{ctx.g}"):
            grad_in = ctx.runner.backward_block(ctx.g, grad_out, ctx.extra, ctx.autocast,
                                                ctx.rng, ctx.input_grad)
        return None, None, None, None, grad_in


class BlockRunner:
    """Owns how blocks are computed; the engine owns what is where.

    engine: provides .groups, .cache, .stash, .host, .lanes, .compute_dtype,
            .micro_batch_size, .block_params(g, flat), .block_buffers(g),
            .wait_update(g), .grad_ready(g, flat_grad) and .stats.
    """

    def __init__(self, engine):
        self.e = engine
        self.tail = TailSkip()   # the recompute skips each block's last projection
        self.tuple_len: dict[int, int | None] = {}
        self.inside = -1  # the block whose real forward is running (see install)
        self._has_stats: dict[int, bool] = {}   # g -> holds running statistics (BatchNorm)
        self._names: dict[int, list[str]] = {}   # g -> its forward's positional arg names

    @property
    def prefetch_depth(self) -> int:
        """Blocks loaded ahead of the one computing: one slot computes, and of the others
        one is left to the LRU (the blocks at each end of the step stay from forward to
        backward): 1 with the default 3 slots."""
        return max(1, len(self.e.cache.slots) - 2)

    # -- routing the blocks' forwards through the runner, for one step -------------
    def install(self) -> list:
        """Route each block's forward through BlockFn; returns what uninstall() restores."""
        e, originals = self.e, []
        grp_name = {grp.index: grp.name for grp in e.groups[1:]}
        for grp in e.groups[1:]:
            mod, g = grp.module, grp.index

            def fwd(*args, _g=g, _mod=mod, **kw):
                if self.inside == _g:  # the runner's own call: the real forward
                    return type(_mod).forward(_mod, *args, **kw)
                hidden, rest = block_input(_mod, grp_name[_g], args, kw)
                out = BlockFn.apply(self, _g, (rest, kw), e._anchor, hidden)
                n = self.tuple_len.get(_g)
                return out if n is None else (out,) + (None,) * (n - 1)
            originals.append((mod, mod.__dict__.get("forward")))
            mod.forward = fwd
        return originals

    @staticmethod
    def uninstall(originals: list) -> None:
        for mod, orig in originals:
            if orig is None:
                del mod.forward
            else:
                mod.forward = orig

    # -- helpers ---------------------------------------------------------------
    def autocast_state(self):
        dt = self.e.compute_dtype
        return (self.e.lanes.device.type, dt) if dt != torch.float32 else None

    def _autocast(self, state):
        if state is None:
            return torch.autocast(self.e.lanes.device.type, enabled=False)
        return torch.autocast(state[0], dtype=state[1])

    def _stats(self, g: int) -> bool:
        """Block g has modules whose training forward updates buffers in place (BatchNorm's
        and InstanceNorm's running statistics): looked up once a block."""
        if g not in self._has_stats:
            self._has_stats[g] = any(
                isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats
                for m in self.e.groups[g].module.modules())
        return self._has_stats[g]

    def _split_extra(self, g: int, extra, batch: int, n: int, size: int) -> list:
        """Block g's other arguments as n micro-batches (Engine(shared_args=...) repeat)."""
        shared = self.e.shared_args
        if shared and g not in self._names:
            self._names[g] = positional_names(self.e.groups[g].module)
        return split_extra(extra, self._names.get(g, []), shared, batch, n, size)

    def _call(self, g: int, params: dict[str, torch.Tensor], h, extra,
              recompute: bool = False):
        """Block g on hidden h with `params` (name -> tensor) in place of its parameters.
        recompute: backward's second forward, whose in-place buffer updates go to copies
        (the first forward has made them: running statistics must move once a step)."""
        args, kwargs = extra
        mod = self.e.groups[g].module
        tensors = dict(params)
        bufs = self.e.block_buffers(g)
        if recompute and self._stats(g):
            bufs = {k: v.clone() for k, v in bufs.items()}
        tensors.update(bufs)
        self.inside = g
        try:
            out = functional_call(mod, tensors, (h, *args), kwargs)
        finally:
            self.inside = -1
        t, n = first_tensor(out)
        self.tuple_len[g] = n
        return t

    def _weights(self, g: int, backward: bool):
        """Group g's weights: (fp32 slot or None, compute-dtype view or cast; one cast per
        pass). None: the slot holds the 16-bit host copy (flow.weight_source) or the
        forward takes the copy kept on the device at g's update (keep.py)."""
        if not backward:
            kept = self.e.keep.take(g)
            if kept is not None:
                return None, kept
        src = self.e.weight_source(g, backward)
        w = self.e.cache.acquire(g, src, self.e.host_ready.get(g))
        if w.dtype != torch.float32:
            return None, w
        return w, (w if self.e.compute_dtype == torch.float32 else w.to(self.e.compute_dtype))

    # -- forward ----------------------------------------------------------------
    def forward_block(self, g: int, hidden: torch.Tensor, extra):
        e = self.e
        # Host wait for g's update of the last step, if block g-1 did not already prefetch
        # g (a model that skips or reorders blocks, like layer drop): loading g's master
        # while the CPU worker still writes it would train on half-updated weights.
        e.prefetch_forward(g)
        _, w = self._weights(g, backward=False)
        B = hidden.shape[0]
        n, size = n_micro(B, e.micro_batch_size)
        hs = split_like(hidden, B, n, size)
        xs = self._split_extra(g, extra, B, n, size)
        rng = []
        outs = []
        t = e.timer.start()
        for i in range(n):
            rng.append(e.rng_snapshot())
            outs.append(self._call(g, e.block_params(g, w), hs[i], xs[i]))
        out = outs[0] if n == 1 else torch.cat(outs, dim=0)
        e.timer.stop(t)
        e.cache.release(g)
        # Prefetch the next block while this one computes (its compute is enqueued), and
        # with block_slots > 3 the ones after it.
        e.prefetch_forward(g + 1)
        for d in range(2, self.prefetch_depth + 1):
            e.prefetch_ahead(g + d)
        e.stash.put(g, hidden)  # the checkpoint backward recomputes from
        e.peaks.mark()
        return out, rng

    # -- backward ---------------------------------------------------------------
    def backward_block(self, g: int, grad_out: torch.Tensor, extra, autocast, rng,
                       input_grad: bool = True):
        e = self.e
        hidden = e.stash.take(g)
        w32, w = self._weights(g, backward=True)
        # This block's m, v (a device-updated group) before block g-1's: backward's first
        # block has had no earlier block to start them.
        e.updater.prefetch(g)
        # Prefetch block g-1's weights and checkpoint while this block computes (and with
        # block_slots > 3 the blocks before it, their m, v too: a ring buffer each).
        e.prefetch_backward(g - 1)
        for d in range(2, self.prefetch_depth + 1):
            if g - d >= 1:
                e.prefetch_backward(g - d)
        B = hidden.shape[0]
        n, size = n_micro(B, e.micro_batch_size)
        hs = split_like(hidden, B, n, size)
        gs = split_like(grad_out, B, n, size)
        xs = self._split_extra(g, extra, B, n, size)
        ring_i, grad_w = e.grad_ring.take()
        half = e.half_grad(g, n)
        if g not in e.updater.groups:
            e.stats.cpu_grad_bytes = 2 if half else 4   # for the planner
        if half:
            # Buffer reuse: one micro-batch's gradient is bf16 already (the leaves are), so
            # the fp32 ring buffer's first half holds it as bf16 exactly, and half the bytes
            # cross to the host (flow.half_grad).
            grad_w = grad_w.view(torch.bfloat16)
        grad_w = grad_w[: w.numel()]
        grp = e.groups[g]
        # each parameter's slice of the gradient buffer, in the block's layout
        dst = [grad_w[o:o + p.numel()] for o, p in zip(grp.offsets, grp.params)]
        if grad_w.numel() > grp.numel:
            # padding past the last parameter (ranks' equal shards): the reused ring buffer
            # holds an older gradient there, which would count in the norm for clipping
            grad_w[grp.numel:].zero_()
        grads_in = []
        t = e.timer.start()
        for i in range(n):
            # one leaf per parameter, not views of one flat leaf: autograd would give each
            # view's gradient as a zero-filled flat-sized tensor and sum them (measured on
            # the H200: ~50 ms a 3B step of fills and adds)
            leaves = {k: v.detach().requires_grad_(True)
                      for k, v in e.block_params(g, w).items()}
            h = hs[i].detach().requires_grad_(input_grad)

            def run(i=i, leaves=leaves, h=h):
                e.rng_restore(rng[i])
                with torch.enable_grad(), self._autocast(autocast):
                    return self._call(g, leaves, h, xs[i], recompute=True)
            out = self.tail.recompute(g, e.groups[g].module, run)
            wrt = list(leaves.values()) + ([h] if input_grad else [])
            grads = torch.autograd.grad(out, wrt, gs[i], allow_unused=True)
            for d, gp in zip(dst, grads[:len(dst)]):
                if gp is None:                    # a parameter this forward did not use
                    if i == 0:
                        d.zero_()
                elif i == 0:
                    d.copy_(gp.reshape(-1))       # fp32 accumulation across micro-batches
                else:
                    d.add_(gp.reshape(-1))
            if input_grad:
                grads_in.append(grads[-1] if grads[-1] is not None else torch.zeros_like(h))
        e.timer.stop(t)
        e.grad_ready(g, grad_w, w32, ring_i)
        e.peaks.mark()
        if not input_grad:
            return None
        return grads_in[0] if n == 1 else torch.cat(grads_in, dim=0)
