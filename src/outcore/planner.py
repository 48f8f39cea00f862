"""`outcore plan` and the check `outcore train` runs first: will this model fit, and how fast.

Nothing large is allocated: the model is built with its parameters on the meta device and
split into groups exactly as the engine will split it; the device bytes use the engine's
own formula (stream/plan.py fixed_device_bytes). Step time comes from a quick calibration
of this machine (calibration.py).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from .calibration import Calibration
from .errors import OutcoreError
from .units import fmt_bytes

USABLE_GPU_SHARE = 0.92   # of a GPU budget, as the engine fills it (stream/accounting.py)


@dataclass
class ModelShape:
    """A model's parameter counts as the engine groups them (rest + N blocks)."""

    name: str
    params: int
    block_params: int       # the largest block
    rest_params: int        # embeddings, final norm, head (resident on the device)
    layers: int
    dim: int
    vocab: int


def model_shape(model: str) -> ModelShape:
    """Shape of a reference size (outcore.models.SIZES) or a local HF checkpoint dir."""
    from .hf import empty_model, is_hf_dir, meta_parameters
    from .models import SIZES, decoder
    from .stream.blocks import build_groups, find_blocks
    if model in SIZES:
        with meta_parameters():
            m = decoder(model)
        dim, vocab = SIZES[model].dim, SIZES[model].vocab
    elif is_hf_dir(model):
        m = empty_model(model)
        c = m.config
        dim = getattr(c, "hidden_size", None) or getattr(c, "n_embd", 0)
        vocab = c.vocab_size
    else:
        raise unknown_model(model)
    path, container = find_blocks(m, None)
    groups = build_groups(m, path, container)
    numels = [g.numel for g in groups]
    return ModelShape(Path(model).name if is_hf_dir(model) else model, sum(numels),
                      max(numels[1:], default=0), numels[0], len(numels) - 1, dim, vocab)


def unknown_model(model: str) -> OutcoreError:
    """The one-line error for a --model that is neither a reference size nor a Hugging Face
    checkpoint directory: what is wrong with it and what to pass instead."""
    from .models import SIZES
    sizes = ", ".join(SIZES)
    p = Path(model).expanduser()
    if p.exists() or os.sep in model or model.startswith((".", "~")):
        what = ("no such directory" if not p.exists() else "a file, not a directory"
                if not p.is_dir() else "has no config.json")
        return OutcoreError(f"--model {model!r}: {what}: pass a Hugging Face checkpoint "
                            f"directory (config.json, safetensors shards, tokenizer files) or "
                            f"a reference size ({sizes})")
    close = [s for s in SIZES if s == model.lower()] or \
        difflib.get_close_matches(model.lower(), list(SIZES), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return OutcoreError(f"--model {model!r} is neither a reference size nor a Hugging Face "
                        f"checkpoint directory: {hint}pass one of {sizes}, or a directory")


@dataclass
class Plan:
    shape: ModelShape
    tokens_per_step: int
    micro_tokens: int
    host_bytes_per_param: int
    host_state_bytes: int
    host_limit: int | None
    device_fixed_bytes: int
    device_work_bytes: int
    checkpoint_bytes: int   # block-boundary activations: on the device while they fit
    gpu_limit: int | None
    step_s: dict | None = None
    held_grads: bool = True    # clipping: gradients held on the host until the norm is known
    host_copy: bool = False    # 16-bit copies of the weights on the host
    staged_grad_bytes: int = 0   # without clipping: gradients waiting for the CPU AdamW
    # with clipping: blocks updated on the device by their next load (Engine's
    # held_gpu_updates: 0, the trainer's default; "auto"; or that many blocks)
    held_gpu_updates: int | str = 0

    @property
    def device_bytes(self) -> int:
        return self.device_fixed_bytes + self.device_work_bytes

    @property
    def spill_bytes(self) -> int:
        """Activation checkpoints the device budget cannot hold: they go to host memory."""
        return max(0, self.checkpoint_bytes - self._device_room())

    @property
    def host_need_bytes(self) -> int:
        return self.host_state_bytes + self.spill_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_limit is None or self.host_need_bytes <= self.host_limit

    @property
    def usable_gpu_bytes(self) -> int | None:
        """The share of the budget the engine plans to fill (stream/accounting.py: 8% is
        left to the allocator's rounding and fragmentation)."""
        return None if self.gpu_limit is None else int(self.gpu_limit * USABLE_GPU_SHARE)

    @property
    def fits_device(self) -> bool:
        return self.gpu_limit is None or self.device_bytes <= self.usable_gpu_bytes

    @property
    def fits(self) -> bool:
        return self.fits_host and self.fits_device

    def _device_room(self) -> int:
        if self.gpu_limit is None:
            return 0
        return max(0, self.usable_gpu_bytes - self.device_bytes)

    def refusal(self, micro_flag: str = "--micro-batch-size",
                tokens_flag: str = "--batch-size or --seq-len") -> str | None:
        """One line with the numbers when it cannot fit, else None. micro_flag, tokens_flag:
        the options that set the micro-batch and the step's tokens (`train`'s by default;
        `outcore plan` passes its own)."""
        s = self.shape
        if not self.fits_host:
            state = (f"{s.name} ({s.params / 1e9:.2f}B params) needs "
                     f"{fmt_bytes(self.host_state_bytes)} of host memory "
                     f"({self.host_bytes_per_param} B/param)")
            if not self.spill_bytes:
                return (f"{state} but {fmt_bytes(self.host_limit)} is available: use a "
                        "smaller model or more host memory")
            where = "the GPU budget cannot hold" if self.gpu_limit else "kept in host memory"
            gpu = ", raise --gpu-memory" if self.gpu_limit else ""
            fix = (f"lower {tokens_flag} (fewer checkpoints){gpu} or use more host memory"
                   if self.host_state_bytes <= self.host_limit else
                   "use a smaller model or more host memory")
            return (f"{state} and {fmt_bytes(self.spill_bytes)} more for the activation "
                    f"checkpoints {where} ({fmt_bytes(self.host_need_bytes)} in all) but "
                    f"{fmt_bytes(self.host_limit)} is available: {fix}")
        if not self.fits_device:
            return (f"{s.name} needs {fmt_bytes(self.device_bytes)} on the GPU "
                    f"({fmt_bytes(self.device_fixed_bytes)} blocks in flight + resident, "
                    f"{fmt_bytes(self.device_work_bytes)} for a micro-batch of "
                    f"{self.micro_tokens} tokens) but the engine fills "
                    f"{USABLE_GPU_SHARE:.0%} of the {fmt_bytes(self.gpu_limit)} budget "
                    f"({fmt_bytes(self.usable_gpu_bytes)}; the rest is the allocator's): "
                    f"lower {micro_flag} or raise --gpu-memory")
        return None

    def _step_line(self) -> str:
        t, n = self.step_s, self.tokens_per_step
        lo, hi = min(t["step"]), max(t["step"])
        how = "one block timed" if t["timed_block"] else "at the matmul rate"
        span = f"~{lo:.3f} s" if hi - lo < 0.0005 else f"~{lo:.3f}-{hi:.3f} s"
        rate = f"{n / hi:,.0f}" if hi - lo < 0.0005 else f"{n / hi:,.0f}-{n / lo:,.0f}"
        bound = "compute" if hi <= 1.05 * t["compute"] else "the host (CPU AdamW and copies)"
        line = f"step ({n:,} tokens): compute {t['compute']:.3f} s ({how}), "
        if "rates" not in t:
            return (line + f"CPU AdamW {t['optimizer']:.3f} s after it -> {span} "
                    f"({rate} tokens/s; bound by {bound})")
        r = " and ".join(f"{x / 1e9:.2f}" for x in t["rates"])
        g = "/".join(str(x) for x in t["groups"])
        where = (f"{g} blocks updated as they load (held updates: clipping)" if t["held"]
                 else f"AdamW of {g} groups on the GPU")
        if t["held"] and not self.held_gpu_updates:
            where = "every update on the CPU after backward (clipping; see --held-gpu-updates)"
        return (line + f"CPU AdamW at {r} G params/s (alone, under copies), {where} -> "
                f"{span} ({rate} tokens/s; bound by {bound})")

    def lines(self) -> list[str]:
        s = self.shape
        dev = "fits" if self.fits_device else "DOES NOT FIT"
        host = "fits" if self.fits_host else "DOES NOT FIT"
        on_dev = min(self.checkpoint_bytes, self._device_room()) if self.gpu_limit else 0
        if s.params < 1e6:   # whole counts: rounded to 0.1M the sum on the line was off
            counts = (f"{s.params:,} params = {s.layers} blocks of {s.block_params:,} + "
                      f"{s.rest_params:,}")
        else:
            counts = (f"{s.params / 1e6:,.1f}M params = {s.layers} blocks of "
                      f"{s.block_params / 1e6:,.2f}M + {s.rest_params / 1e6:,.2f}M")
        out = [
            f"model {s.name}: {counts} resident (embeddings, head)",
            f"host:   {self.host_bytes_per_param} B/param (fp32 master 4 + AdamW m,v 8"
            f"{' + held gradients 4 for clipping' if self.held_grads else ''}"
            f"{' + 16-bit weight copies 2' if self.host_copy else ''})"
            + (f" + {fmt_bytes(self.staged_grad_bytes)} of gradients waiting for the CPU "
               f"AdamW ({self.staged_grad_bytes // max(1, 4 * s.block_params)} blocks'; "
               "the engine stages more where the host has room)"
               if self.staged_grad_bytes else "")
            + f" = {fmt_bytes(self.host_state_bytes)}"
            + (f" + {fmt_bytes(self.spill_bytes)} of activation checkpoints = "
               f"{fmt_bytes(self.host_need_bytes)}" if self.spill_bytes else "")
            + (f" of {fmt_bytes(self.host_limit)}: {host}" if self.host_limit else ""),
            f"device: 3 block slots + resident = {fmt_bytes(self.device_fixed_bytes)}, "
            f"micro-batch work ({self.micro_tokens} tokens) ~{fmt_bytes(self.device_work_bytes)}"
            + (f" = {fmt_bytes(self.device_bytes)} of {fmt_bytes(self.usable_gpu_bytes)} "
               f"({USABLE_GPU_SHARE:.0%} of {fmt_bytes(self.gpu_limit)}): {dev}"
               if self.gpu_limit else ""),
            f"activation checkpoints: {fmt_bytes(self.checkpoint_bytes)} per step "
            f"({fmt_bytes(on_dev)} on the device, the rest in pinned host memory)",
        ]
        if self.step_s:
            out.append(self._step_line())
        out.append(f"verdict: {'fits' if self.fits else 'DOES NOT FIT'}")
        return out


def make_plan(shape: ModelShape, *, tokens_per_step: int, micro_tokens: int | None = None,
              gpu_limit: int | None = None, host_limit: int | None = None, clip: bool = True,
              compute_itemsize: int = 2, calib: Calibration | None = None,
              host_copy: bool = False, block_s_per_token: float | None = None,
              held_gpu_updates: int | str = 0) -> Plan:
    """Bytes (and with `calib`, seconds) of one step.

    host_copy: the engine keeps 16-bit copies of the weights on the host (+2 B/param) and
    loads them instead of the fp32 masters (2 B/param a pass, not 4).

    micro_tokens None: the whole step when it fits `gpu_limit`, else the largest halving
    of it (down to one 1024-token piece) whose working set fits.

    block_s_per_token: one block's measured compute (plan_step.block_seconds); None: the
    compute at the calibrated matmul rate.
    """
    fake = SimpleNamespace(groups=[SimpleNamespace(numel=shape.rest_params)] +
                           [SimpleNamespace(numel=shape.block_params)] * shape.layers,
                           compute_dtype=torch.bfloat16 if compute_itemsize == 2 else torch.float32)
    from .stream.plan import fixed_device_bytes
    fixed = fixed_device_bytes(fake)
    c = compute_itemsize

    def work_bytes(m: int) -> int:
        # One block's forward graph for a micro-batch (~34 x dim bytes per token at 16
        # bits, Korthikanti et al.) plus fp32 logits, their softmax and gradient for the
        # head (the reference decoder computes its loss in 4096-token chunks).
        return int(m * shape.dim * 34 * c / 2) + min(m, 4096) * shape.vocab * 4 * 3

    # a micro-batch is a slice of the step: never more tokens than the step has
    micro = min(micro_tokens or tokens_per_step, tokens_per_step)
    if micro_tokens is None and gpu_limit is not None:
        usable = int(gpu_limit * USABLE_GPU_SHARE)   # what Plan.fits_device checks
        while micro > 1024 and fixed + work_bytes(micro) > usable:
            micro = max(1024, micro // 2)
    work = work_bytes(micro)
    ckpt = tokens_per_step * shape.dim * c * shape.layers
    bpp = (16 if clip else 12) + (2 if host_copy else 0)
    from .stream.engine import STAGED_GRADS
    staged = 0 if clip else min(STAGED_GRADS, shape.layers) * shape.block_params * 4
    plan = Plan(shape, tokens_per_step, micro, bpp, bpp * shape.params + staged, host_limit,
                fixed, work, ckpt, gpu_limit, held_grads=clip, host_copy=host_copy,
                staged_grad_bytes=staged, held_gpu_updates=held_gpu_updates if clip else 0)
    if calib is not None:
        plan.step_s = step_estimate(plan, calib, block_s_per_token)
    return plan


def step_estimate(plan: Plan, calib: Calibration, block_s_per_token: float | None) -> dict:
    """Seconds of one step (plan_step.py). On a GPU: the engine's step model at the CPU
    AdamW's rate alone and under copies (a range); on the CPU: compute, then the AdamW."""
    from .plan_step import compute_seconds, predict
    s = plan.shape
    compute = compute_seconds(s, plan.tokens_per_step, calib.flops, block_s_per_token)
    opt = s.params / calib.adamw
    est = {"compute": compute, "optimizer": opt, "timed_block": block_s_per_token is not None}
    if not calib.h2d:   # the CPU does both, one after the other
        return {**est, "step": [compute + opt], "groups": [0], "held": plan.held_grads}
    rates = sorted({calib.adamw, calib.adamw_loaded or calib.adamw}, reverse=True)
    return {**est, **predict(plan, compute, rates), "rates": rates}


def host_available() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), None where that file does not exist."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
