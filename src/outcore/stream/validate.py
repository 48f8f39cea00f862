"""Checks on what the user hands the engine, each failing with a one-line OutcoreError."""

from __future__ import annotations

import inspect
import numbers

import torch
from torch import nn

from .. import planner
from ..errors import OutcoreError
from ..units import fmt_bytes
from .optimizer import AdamW


def resolve_device(device) -> torch.device:
    """"cpu" | "cuda" | "cuda:N" | torch.device -> torch.device, checked to exist."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OutcoreError(f"device={device!r} is not a device: use 'cpu', 'cuda' or "
                           "'cuda:N'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise OutcoreError(f"device={device!r} but CUDA is not available here: use "
                               "device='cpu'")
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx >= torch.cuda.device_count():
            raise OutcoreError(f"device={device!r} but only {torch.cuda.device_count()} "
                               "GPU(s) exist")
        dev = torch.device("cuda", idx)
    elif dev.type != "cpu":
        raise OutcoreError(f"device={device!r} is not supported: use 'cpu' or 'cuda[:N]'")
    return dev


def check_model(model) -> None:
    """An nn.Module whose parameters all train: the engine runs AdamW (weight decay too) on
    every parameter it streams, so a frozen one would change."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"Engine takes an nn.Module, not {type(model).__name__}: build the "
                        "model first (for example outcore.models.decoder('1b'))")
    if next(model.parameters(), None) is None:
        raise OutcoreError(f"{type(model).__name__} has no parameters: nothing to train")
    wide = [n for n, p in model.named_parameters() if p.dtype == torch.float64]
    if wide:
        raise OutcoreError(f"parameter {wide[0]!r} is float64: the engine keeps fp32 master "
                           "weights and would train it in float32; cast the model with "
                           "model.float() to accept that")
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise OutcoreError(f"parameter {frozen[0]!r} has requires_grad=False ({len(frozen)} "
                           "frozen in all): the engine trains every parameter, so register "
                           "frozen tensors as buffers or set requires_grad=True")


def check_optimizer(optimizer) -> AdamW:
    """Engine(optimizer=...): an outcore.AdamW instance (None: its defaults)."""
    if optimizer is None:
        return AdamW()
    if isinstance(optimizer, AdamW):
        return optimizer
    what = "the class outcore.AdamW" if optimizer is AdamW else type(optimizer).__name__
    raise TypeError(f"optimizer={what}: pass outcore.AdamW(lr=..., betas=..., eps=..., "
                    "weight_decay=...), the engine runs AdamW on its own host state")


def check_step_options(micro_batch_size, max_grad_norm, skip_nonfinite) -> None:
    """Engine(micro_batch_size=..., max_grad_norm=..., skip_nonfinite=...)."""
    if micro_batch_size is not None and (not isinstance(micro_batch_size, int)
                                         or isinstance(micro_batch_size, bool)
                                         or micro_batch_size < 1):
        raise OutcoreError(f"micro_batch_size={micro_batch_size!r} must be a positive int "
                           "or None")
    if max_grad_norm is not None and (not isinstance(max_grad_norm, numbers.Real)
                                      or isinstance(max_grad_norm, bool)
                                      or not max_grad_norm > 0):   # nan fails too
        raise OutcoreError(f"max_grad_norm={max_grad_norm!r} must be a number > 0 or None")
    if skip_nonfinite not in (None, False, True):   # "no" would count as True
        raise OutcoreError(f"skip_nonfinite={skip_nonfinite!r}: use True or False")


def check_lr(lr) -> float:
    """engine.set_lr(lr): a finite number >= 0 (the worker thread would fail on another)."""
    if (not isinstance(lr, numbers.Real) or isinstance(lr, bool)
            or not 0 <= lr < float("inf")):
        raise OutcoreError(f"set_lr({lr!r}): the learning rate must be a finite number >= 0")
    return float(lr)


def check_loss_fn(loss_fn) -> None:
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn={type(loss_fn).__name__}: pass a function "
                        "loss_fn(output, batch) -> scalar tensor, or None for output.loss")


def check_loss(loss) -> None:
    """What backward can start from: one real number with a graph to the parameters."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"has shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else \
            f"is a {type(loss).__name__}"
        raise OutcoreError(f"the loss {what}, not a tensor of one number: make loss_fn "
                           "return a scalar tensor (for example with .mean())")
    if not loss.dtype.is_floating_point:
        raise OutcoreError(f"the loss is a {loss.dtype} tensor: make loss_fn return a real "
                           "floating-point scalar computed from the model's output")
    if not loss.requires_grad:
        raise OutcoreError("the loss does not depend on the model's parameters (no grad_fn): "
                           "compute it from the output without .detach(), .item() or "
                           "torch.no_grad()")


def check_batch(batch) -> dict:
    """A non-empty dict of tensors sharing dim 0, with at least one row."""
    if not isinstance(batch, dict) or not batch:
        raise OutcoreError("train_step takes a non-empty dict of tensors, such as "
                           "{'input_ids': ..., 'labels': ...}")
    sizes = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            if v.dim() == 0:
                raise OutcoreError(f"batch[{k!r}] is a scalar: every entry needs a batch "
                                   "dimension first")
            sizes[k] = v.shape[0]
    if len(set(sizes.values())) > 1:
        raise OutcoreError(f"batch entries disagree on the batch size (dim 0): {sizes}")
    if not sizes:
        raise OutcoreError("the batch holds no tensors")
    if 0 in sizes.values():
        raise OutcoreError(f"the batch has no rows (dim 0 is 0: {sizes}): skip empty "
                           "batches, a step on one would still apply weight decay")
    return batch


def forward_kwargs(params, batch: dict, to_device) -> dict:
    """The entries of `batch` that the model's forward accepts, each through `to_device`
    (StepEdges.to_device: tensors moved to the compute device).

    params: inspect.signature(model.forward).parameters. All entries pass when forward
    takes **kwargs. Required arguments missing from the batch are an error. Hugging Face
    models get use_cache=False (a KV cache is useless in training and costs memory).
    """
    var_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    required = [n for n in names if params[n].default is inspect.Parameter.empty]
    missing = [n for n in required if n not in batch]
    if missing:
        raise OutcoreError(f"the batch lacks {missing} that the model's forward requires "
                           f"(batch has {sorted(batch)})")
    out = {}
    for k, v in batch.items():
        if k in names or var_kw:
            out[k] = to_device(v)
    if not out:
        raise OutcoreError(f"no batch entry matches the model's forward arguments {names}: "
                           f"batch has {sorted(batch)}")
    if "use_cache" in names and "use_cache" not in out:
        out["use_cache"] = False
    return out


def check_copy_option(engine, value, held_gpu_updates) -> str | None:
    """Engine(host_weight_copy=...): False (None: no copies), True or "all" (every block's
    copy, refreshed by the CPU AdamW too), "fused" (as "all", the CPU AdamW writing the copy
    in its own pass: cast_kernel.py) or "device" (only the device-updated blocks load their
    copy, which the device writes; the CPU AdamW casts nothing). 16-bit compute, one
    process, no held device updates."""
    if value is False or value is None:
        return None
    mode = "all" if value in (True, "fused") else value
    if mode not in ("all", "device"):
        raise OutcoreError(f"host_weight_copy={value!r}: use False, True (or 'all': every "
                           "block), 'fused' (every block, cast in the CPU AdamW's pass) or "
                           "'device' (the device-updated blocks only)")
    if engine.compute_dtype.itemsize != 2:
        raise OutcoreError(f"host_weight_copy={value!r} keeps 16-bit copies for a 16-bit "
                           f"compute dtype, not {engine.compute_dtype}: use compute_dtype="
                           "torch.bfloat16 or leave host_weight_copy off")
    if held_gpu_updates not in (None, 0, "off"):
        raise OutcoreError("host_weight_copy=True cannot be combined with held_gpu_updates "
                           "(those updates need the fp32 weights at every load)")
    return mode


# Host bytes per parameter host_weight_copy="auto" leaves free beyond the state and the
# copies: the pinned pools, CUDA and torch (a process measured 14.8-15.5 B/param against
# its 12 of state on the H200: bench/stream.py's HOST_BYTES_PER_PARAM).
AUTO_COPY_MARGIN = 4


def resolve_copy_option(engine, value, held_gpu_updates, staged: int):
    """Engine(host_weight_copy="auto"), the default: "fused" where it measured faster
    (session 10, H200, 3b-16k: 0.869 s a step against 0.912 s without copies, one run,
    `stream-h200-s10.json`) and can run: a CUDA device, bf16 compute, one process, no held
    device updates, host memory for the copies with AUTO_COPY_MARGIN B/param to spare, and
    the one-pass kernel built (cast_kernel.py); else False (no copies). Any other value is
    returned as given (check_copy_option checks it)."""
    if value != "auto":
        return value
    if (engine.device.type != "cuda" or engine.compute_dtype != torch.bfloat16
            or getattr(engine, "world", 1) > 1 or held_gpu_updates not in (None, 0, "off")):
        return False
    try:
        check_host_room(engine.groups, engine.hold_updates, True, staged,
                        margin=AUTO_COPY_MARGIN, lazy=bool(getattr(engine, "_fill", None)))
    except OutcoreError:
        return False   # room for the state, not for the copies too: none
    from .cast_kernel import load
    return "fused" if load(quiet=True) is not None else False


def resolve_staged_cap(groups, hold_updates: bool, copies: bool, floor: int,
                       shards: int = 1, lazy: bool = False) -> int | None:
    """Engine.max_staged_grads's default: how many blocks' gradients may wait in pinned host
    memory for the CPU AdamW before backward waits. None (no cap) where the host has room
    for every block's at once beside the state, the copies and AUTO_COPY_MARGIN B/param to
    spare; else the most that fit, but never fewer than `floor` (check_host_room refuses
    the engine if even those do not fit). Backward waiting at a cap counts as optimizer wait
    and made the device-update planner move AdamW to the device; without one the CPU works
    its backlog off into the next forward. Session 30 on the H200 (3b-16k, three rounds in
    rotated orders, `stream-h200-ab-s30{a,b,c}-*.json`): no cap 0.888, 0.872 and 0.880 s a
    step against 0.951, 0.867 and 0.910 with 8. A sharded engine's rank (shards > 1) keeps
    `floor`: the ranks of one host each weigh their share against the whole host's free
    memory, and the parallel runs were measured with 8."""
    blocks = len(groups) - 1
    if hold_updates or shards > 1 or planner.host_available() is None or blocks <= floor:
        return floor

    def fits(staged: int) -> bool:
        try:
            check_host_room(groups, hold_updates, copies, staged, shards,
                            margin=AUTO_COPY_MARGIN, lazy=lazy)
            return True
        except OutcoreError:
            return False
    if fits(blocks):
        return None
    return next((c for c in range(blocks - 1, floor, -1) if fits(c)), floor)


def check_host_room(groups, hold_updates: bool, copies: bool, staged: int,
                    shards: int = 1, margin: int = 0, lazy: bool = False) -> None:
    """Refuse, before allocating, when the host cannot hold what the engine adds to the
    model already in its memory: AdamW's m and v (8 B/param), the gradients held for
    clipping (4 B/param) or else up to `staged` blocks' gradients waiting for the CPU
    AdamW, and 16-bit copies of the blocks (2 B/param). A necessary condition only (pinned
    pools and the CUDA runtime come on top): it turns the plain cases of the OOM killer
    into a one-line error. shards: a rank of a sharded engine holds 1/shards of it.
    margin: B/param more to ask for (host_weight_copy="auto"'s spare room). lazy: the
    model is on the meta device, so the fp32 masters (4 B/param) are to come too."""
    available = planner.host_available()
    if available is None:
        return
    n = sum(g.numel for g in groups)
    blocks = [g.numel for g in groups[1:]]
    grads = 4 * n if hold_updates else 4 * max(blocks, default=0) * min(staged, len(blocks))
    state = (12 if lazy else 8) * n
    need = (state + grads + (2 * sum(blocks) if copies else 0) + margin * n) // shards
    if need > available:
        raise OutcoreError(
            f"the engine needs {fmt_bytes(need)} more host memory for {n / 1e9:.2f}B params "
            f"({'fp32 masters 4 B/param, ' if lazy else ''}AdamW m, v 8 B/param"
            f"{', gradients held for clipping 4' if hold_updates else ''}"
            f"{', 16-bit copies 2' if copies else ''}) but {fmt_bytes(available)} is "
            "available: use a smaller model, free host memory or use a larger machine "
            "(outcore plan --model ... --host-memory ... shows the numbers)")
