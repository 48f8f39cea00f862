"""`outcore plan`'s step estimate (plan_step.py): the engine's step model on measured rates."""

import pytest
import torch

from outcore.models import SIZES
from outcore.plan_step import (block_seconds, compute_seconds, device_groups_room,
                               held_step, streamed_step)
from outcore.calibration import Calibration
from outcore.planner import make_plan, model_shape

GIB = 1 << 30


def _plan(size="3b", tokens=16384, gpu=int(14.5 * GIB), clip=False, copy=True, held=0):
    return make_plan(model_shape(size), tokens_per_step=tokens, gpu_limit=gpu,
                     host_limit=None, clip=clip, host_copy=copy, held_gpu_updates=held)


def test_a_slower_cpu_moves_more_adamw_to_the_gpu_and_lengthens_the_step():
    p = _plan()
    fast, n_fast = streamed_step(p, 0.7, 4.3e9)
    slow, n_slow = streamed_step(p, 0.7, 2.5e9)
    assert 0.7 <= fast < slow
    assert n_slow > n_fast >= 1
    # with no room for a ring of block states, at most rest updates on the GPU
    tight = _plan("7b")
    assert device_groups_room(tight) == (True, False)
    assert streamed_step(tight, 1.4, 2.5e9)[1] <= 1


def test_a_fast_cpu_leaves_a_compute_bound_step():
    p = _plan()
    step, _ = streamed_step(p, 5.0, 50e9)
    assert step < 5.0 * 1.05


def test_held_updates_wait_for_backward_then_share_the_blocks():
    from outcore.stream.balance import LINK_BPS
    from outcore.stream.deferred import MAX_SHARE
    p = _plan("1b", tokens=4096, clip=True, copy=False, held="auto")
    s = p.shape
    k = int(MAX_SHARE * s.layers)   # "auto": the engine's feedback moves blocks to its cap
    # an unlimited CPU: backward (its compute or its gradients out), then a forward that
    # waits only for its loads, the held blocks' m, v and gradient crossing with them
    backward = max(0.2 * 0.7, 4 * s.params / LINK_BPS)
    loads = (k * 16 + (s.layers - k) * 4) * s.block_params / LINK_BPS
    free, k_free = held_step(p, 0.2, 1e18)
    assert k_free == k and free == pytest.approx(backward + loads + 0.2 * 0.3 / s.layers)
    # the trainer's default (held_gpu_updates off): every update on the CPU, the forward's
    # last block after the whole AdamW
    all_cpu = backward + s.params / 2.5e9 + 0.2 * 0.3 / s.layers
    off, k_off = held_step(_plan("1b", tokens=4096, clip=True, copy=False), 0.2, 2.5e9)
    assert k_off == 0 and off == pytest.approx(all_cpu)
    step, k_auto = held_step(p, 0.2, 2.5e9)
    assert k_auto == k and free <= step < off   # the GPU takes a share: shorter than all-CPU
    assert held_step(_plan("1b", tokens=4096, clip=True, copy=False, held=3), 0.2, 2.5e9)[1] == 3
    # 16-bit copies: a single micro-batch's gradients cross in bf16 (half the copy out)
    big = _plan("3b", tokens=4096, clip=True, copy=True)
    assert held_step(big, 0.01, 1e18)[0] < held_step(_plan("3b", tokens=4096, clip=True,
                                                           copy=False), 0.01, 1e18)[0]


def test_compute_falls_back_to_the_matmul_rate():
    s = model_shape("125m")
    assert compute_seconds(s, 1024, 1e12, None) == 8 * s.params * 1024 / 1e12
    timed = compute_seconds(s, 1024, 1e12, 1e-6)
    assert timed == s.layers * 1e-6 * 1024 + 6 * s.dim * s.vocab * 1024 / 1e12


def test_one_block_is_timed_on_the_cpu():
    t = block_seconds(SIZES["tiny"], "cpu", torch.float32, tokens=512, seq=128)
    assert 0 < t < 1


def test_a_slow_device_times_fewer_tokens():
    """A 70b block (855.6M params): all 8192 tokens at a GPU's rate, 512 on a CPU's (8192
    took minutes there); never more than the micro-batch."""
    from outcore.plan_step import MIN_TIMED_TOKENS, TIMED_TOKENS, timed_tokens
    big = 855_654_400
    assert timed_tokens(big, 65536, 700e12) == TIMED_TOKENS == 8192
    assert timed_tokens(big, 65536, 0.4e12) == MIN_TIMED_TOKENS == 512
    assert timed_tokens(big, 65536, None) == 8192
    assert timed_tokens(202_383_360, 65536, 4e12) == 4941   # 2 s at 8 x params x tokens
    assert timed_tokens(big, 100, 700e12) == 100


def test_the_timed_block_runs_the_capped_tokens_in_the_compute_dtype(monkeypatch):
    from outcore.models.decoder import Block
    seen = []
    forward = Block.forward

    def spy(self, x, cos, sin):
        seen.append((tuple(x.shape), self.wq.weight.dtype, self.wq.weight.device.type))
        return forward(self, x, cos, sin)
    monkeypatch.setattr(Block, "forward", spy)
    cfg = SIZES["tiny"]
    params = sum(p.numel() for p in Block(cfg).parameters())
    flops = 600 * 8 * params / 2.0   # 600 tokens in TIMED_SECONDS
    t = block_seconds(cfg, "cpu", torch.bfloat16, tokens=4096, seq=128, flops=flops)
    assert t > 0 and seen and all(s == ((4, 128, cfg.dim), torch.bfloat16, "cpu") for s in seen)


def test_the_plan_prints_a_range_on_a_gpu_calibration():
    calib = Calibration("cuda", flops=700e12, host_copy=50e9, h2d=50e9, adamw=4.3e9,
                        adamw_loaded=2.5e9)
    p = make_plan(model_shape("3b"), tokens_per_step=16384, gpu_limit=int(14.5 * GIB),
                  host_limit=None, clip=False, host_copy=True, calib=calib,
                  block_s_per_token=1.3e-6)
    lo, hi = p.step_s["step"]
    assert lo < hi and p.step_s["rates"] == [4.3e9, 2.5e9]
    line = next(x for x in p.lines() if x.startswith("step ("))
    assert "(one block timed)" in line and "4.30 and 2.50 G params/s" in line
    assert f"~{lo:.3f}-{hi:.3f} s" in line and "groups on the GPU" in line
    held = make_plan(model_shape("3b"), tokens_per_step=16384, gpu_limit=int(14.5 * GIB),
                     host_limit=None, clip=True, calib=calib, held_gpu_updates="auto")
    assert "blocks updated as they load (held updates" in "\n".join(held.lines())
    assert "(at the matmul rate)" in "\n".join(held.lines())
    off = make_plan(model_shape("3b"), tokens_per_step=16384, gpu_limit=int(14.5 * GIB),
                    host_limit=None, clip=True, calib=calib)
    assert "every update on the CPU after backward" in "\n".join(off.lines())
    assert "16/16 blocks updated as they load" in "\n".join(held.lines())   # 0.6 x 28


def test_plan_takes_host_copies_as_train_decides():
    """`outcore plan --host-weight-copy auto` (the default) resolves as the trainer's
    Engine(host_weight_copy="auto") does: a GPU, bf16, no held GPU updates, host room."""
    from outcore.plan_cli import _copies
    s = model_shape("1b")
    bf16, fp32 = torch.bfloat16, torch.float32
    assert _copies("auto", "cuda", bf16, 0, s, None, True)
    assert _copies("auto", "cuda:0", bf16, 0, s, 22 * s.params, True)       # 16 + 2 + 4
    assert not _copies("auto", "cuda", bf16, 0, s, 21 * s.params, True)     # no room to spare
    assert not _copies("auto", "cuda", bf16, "auto", s, None, True)         # held GPU updates
    assert not _copies("auto", "cpu", bf16, 0, s, None, True)
    assert not _copies("auto", "cuda", fp32, 0, s, None, True)
    assert _copies("on", "cpu", bf16, 0, s, None, True) and not _copies("on", "cpu", fp32, 0, s,
                                                                         None, True)
    assert not _copies("off", "cuda", bf16, 0, s, None, True)
