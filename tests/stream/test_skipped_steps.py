"""A skipped (non-finite) step gives its gradients' host buffers back to the pool."""

import pytest
import torch

import outcore
from outcore.models import decoder


@pytest.mark.parametrize("clip", [1.0, None])
def test_nan_steps_keep_host_memory_flat(clip):
    torch.manual_seed(0)
    eng = outcore.Engine(decoder("tiny", vocab=96, max_seq=64), device="cpu",
                         max_grad_norm=clip, skip_nonfinite=True)
    x = torch.randint(0, 96, (2, 16))
    batch = {"input_ids": x, "labels": x}
    nan = lambda out, b: out.loss * float("nan")  # noqa: E731
    eng.train_step(batch)  # a good step: the pool holds one step's gradients
    held = eng.host.grad_pool.bytes_allocated
    per_param = eng.host_bytes_per_param()
    for _ in range(4):
        eng.train_step(batch, loss_fn=nan)
        assert eng.last_step_skipped
        assert eng.host.grad_pool.bytes_allocated == held
    eng.train_step(batch)
    assert not eng.last_step_skipped
    assert eng.host.grad_pool.bytes_allocated == held
    assert eng.host_bytes_per_param() == per_param
    eng.close()
