"""The step time `outcore plan` predicts on a GPU: the engine's own step model fed with
rates measured on this machine.

Until session 38 the plan put a step at the largest of three totals: 8 x params x tokens at
a 4096^2 matmul's rate, the weights' copies, and the CPU AdamW at its rate on 2M
parameters (in cache). On the H200 that said 0.59 s for 3b at 16k tokens (measured 0.85)
and 1.17 s for 7b (measured 1.82): the blocks do not run at a square matmul's rate, the
CPU AdamW on a real model's state runs at host-memory speed, and copies slow it further.
Here instead:
  compute   one real block of the reference decoder timed on the device (its checkpointed
            forward, then the recompute and backward) for a micro-batch, scaled to the
            step, plus the head at the matmul rate (a Hugging Face model, whose block is
            not built here, falls back to 8 x params x tokens at the matmul rate)
  CPU AdamW measured on 32M parameters (out of cache) alone and while pinned copies run
            both ways (Calibration.adamw, adamw_loaded): the step is given as the range
            between the two, the host's copies deciding where in it a run lands
  the step  without held updates: stream/simulate.py's block-by-block step on the device
            groups stream/balance.choose picks (the engine's planner), the groups limited
            to what the budget holds beside the plan's working set (DeviceUpdater.affordable);
            with held updates (clipping, the trainer's default): backward (its compute or
            its gradients' copies out), then a forward whose blocks wait for the CPU AdamW
            that starts when backward ends; with --held-gpu-updates the first of them
            update on the device by their load instead (stream/deferred.py)
"""

from __future__ import annotations

import time
import warnings

import torch

from .stream.balance import BACKWARD_SHARE, HEAD, LINK_BPS, Rates, choose
from .stream.deferred import MAX_SHARE
from .stream.simulate import simulate

SLOTS = 3          # the engine's block slots (stream/plan.py fixed_device_bytes)
TIMED_TOKENS = 8192   # at most this many tokens of one micro-batch through the timed block
# ... and fewer where one timed pass (8 x the block's params x tokens) would take longer
# than this at the calibrated matmul rate: on a CPU (0.42 TFLOP/s on the 2-core CI machine)
# `outcore plan --model 70b` took 7 min 51 s, nearly all of it timing a block at 8192
# tokens, twice. A GPU keeps all 8192 (a 70b block: 0.08 s at 700 TFLOP/s). Not under
# MIN_TIMED_TOKENS: a 70b block on that CPU ran 19.4 ms a token at 512 and 19.9 at 2048,
# but 24.1 at 128 (25 s for the two passes at 512).
TIMED_SECONDS = 2.0
MIN_TIMED_TOKENS = 512


def timed_tokens(params: int, tokens: int, flops: float | None) -> int:
    """How many of a micro-batch's `tokens` go through a block of `params` when it is
    timed, on a device whose matmul runs at `flops` (None: not known, TIMED_TOKENS)."""
    cap = TIMED_TOKENS
    if flops:
        cap = min(cap, max(MIN_TIMED_TOKENS, int(TIMED_SECONDS * flops / (8 * params))))
    return max(1, min(tokens, cap))


def block_seconds(cfg, device: str, dtype: torch.dtype, tokens: int, seq: int,
                  flops: float | None = None) -> float:
    """Seconds per token of one reference-decoder block (DecoderConfig cfg) on `device`:
    a no-grad forward (the checkpointed pass) plus a forward and backward (the recompute
    and the gradients), for timed_tokens(...) of the micro-batch's `tokens` in sequences of
    `seq` (shorter when fewer tokens are timed)."""
    from .models.decoder import Block, rope_tables
    # Built on the meta device, then allocated in `dtype` where it runs and filled: no fp32
    # copy on the host and no per-layer init (a 70b block is 855M params). The values only
    # need to be ordinary numbers (no NaN or denormals to slow a CPU).
    with torch.device("meta"):
        block = Block(cfg)
    block = block.to(dtype=dtype).to_empty(device=device)
    with torch.no_grad():
        for p in block.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)   # the norms' weights
    timed = timed_tokens(sum(p.numel() for p in block.parameters()), tokens, flops)
    seq = max(1, min(seq, timed))
    rows = max(1, timed // seq)
    x = torch.randn(rows, seq, cfg.dim, device=device, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(cfg, seq, device, dtype)
    dy = torch.randn_like(x)

    def one():
        with torch.no_grad():
            block(x, cos, sin)
        with warnings.catch_warnings():
            # autograd's CUDA thread makes its first cuBLAS handle here and torch warns that
            # it had to set the primary context: harmless, and `outcore plan` printed it
            # under its verdict on every GPU run (sessions 38-49)
            warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there "
                                    "was no current CUDA context")
            block(x, cos, sin).backward(dy)

    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    one()
    sync()   # host sync: the warm-up (kernel selection) stays out of the timing
    reps = 3 if device.startswith("cuda") else 1
    t = time.perf_counter()
    for _ in range(reps):
        one()
    sync()   # host sync: the timing must cover the device's work
    return (time.perf_counter() - t) / reps / (rows * seq)


def compute_seconds(shape, tokens: int, flops: float, block_s_per_token: float | None) -> float:
    """One step's device compute (forward, recompute, backward of every block and the head)."""
    if block_s_per_token is None:
        return 8 * shape.params * tokens / flops
    head = 6 * shape.dim * shape.vocab * tokens / flops
    return shape.layers * block_s_per_token * tokens + head


def device_groups_room(plan) -> tuple[bool, bool]:
    """(rest, blocks): can the budget hold rest's m, v (8 B/param), and the ring of two
    blocks' m|v (16 B/param of a block, more with 16-bit copies) that block updates use,
    beside the plan's slots and working set (DeviceUpdater.affordable's rule)."""
    if plan.gpu_limit is None:
        return True, True
    room = plan.usable_gpu_bytes - plan.device_bytes
    s = plan.shape
    rest = 8 * s.rest_params <= room
    room -= 8 * s.rest_params if rest else 0
    ring = 16 * s.block_params + (4 * s.block_params if plan.host_copy else 0)
    return rest, ring <= room


def streamed_step(plan, compute_s: float, cpu_rate: float) -> tuple[float, int]:
    """(seconds, device groups) of a step without held updates, as the engine's balance
    planner would place the AdamW (simulate.py's step)."""
    s = plan.shape
    numels = [s.rest_params] + [s.block_params] * s.layers
    rest, blocks = device_groups_room(plan)
    order = ([0] if rest else []) + (list(range(1, len(numels))) if blocks else [])
    one_micro = plan.micro_tokens >= plan.tokens_per_step
    rates = Rates(compute_s, cpu_rate, LINK_BPS)

    def model(d: set[int]) -> float:
        return simulate(numels, d, SLOTS, rates, cpu_load_bytes=2 if plan.host_copy else 4,
                        cpu_grad_bytes=2 if (plan.host_copy and one_micro) else 4,
                        copies=plan.host_copy, prefetch=SLOTS - 1)

    groups = choose(numels, order, set(), "all" if plan.host_copy else None, SLOTS, rates,
                    step=model, floor=min(HEAD, len(order)))
    return model(groups), len(groups)


def held_step(plan, compute_s: float, cpu_rate: float) -> tuple[float, int]:
    """(seconds, blocks updated by their load) of a step with held updates: the CPU
    AdamW starts when backward ends (the norm is known), rest first, then the blocks in
    the forward's order; the forward's first k blocks update on the device as they load,
    their m, v and gradient crossing with the weights (12 B/param more, deferred.py): k as
    plan.held_gpu_updates says (0, the trainer's default; N; "auto": see below). A block
    computes once its update is done and its bytes are in (the loads queue on one link
    from backward's end); backward takes its compute or its gradients' copies out."""
    s = plan.shape
    n = s.layers
    held = plan.held_gpu_updates
    # "auto": the engine's feedback (deferred.plan) moves blocks from 1 on up to MAX_SHARE
    # of them once the forward waits for the CPU, which on the H200 was at once, to the cap
    # (session 39: blocks 1-9 of 16 at 1b, 1-16 of 28 at 3b)
    k = int(MAX_SHARE * n) if held == "auto" else min(int(held or 0), n)
    # backward: its compute, or every gradient's copy out to the host where that is longer
    # (session 39: at 3b and 4096 tokens 13.5 GB of fp32 gradients against 0.15 s of compute)
    one_micro = plan.micro_tokens >= plan.tokens_per_step
    grad_b = 2 if (plan.host_copy and one_micro) else 4
    backward = max(BACKWARD_SHARE * compute_s, grad_b * s.params / LINK_BPS)
    per_block = (1 - BACKWARD_SHARE) * compute_s / max(1, n)
    load = (2 if plan.host_copy else 4) * s.block_params / LINK_BPS
    cpu = s.rest_params / cpu_rate         # rest: the forward's first need
    t, link = cpu, 0.0
    for b in range(1, n + 1):
        link += load + (12 * s.block_params / LINK_BPS if b <= k else 0.0)
        if b > k:
            cpu += s.block_params / cpu_rate
        t = max(t, link, cpu if b > k else 0.0) + per_block
    return backward + t, k


def predict(plan, compute_s: float, rates: list[float]) -> dict:
    """The step at each CPU AdamW rate in `rates` (params/s): {"step": [s, ...],
    "groups": [n, ...], "held": bool}."""
    fn = held_step if plan.held_grads else streamed_step
    out = [fn(plan, compute_s, r) for r in rates]
    return {"step": [o[0] for o in out], "groups": [o[1] for o in out],
            "held": plan.held_grads}
