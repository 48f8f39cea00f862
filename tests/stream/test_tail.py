"""The recompute's skipped tail projection (stream/tail.py): same gradients as a full
recompute, and no skipping where the projection's output is read."""

import pytest
import torch
from torch import nn

from outcore.stream.tail import TailSkip


class PreNorm(nn.Module):
    """x + fc2(relu(fc1(norm(x)))): fc2's output is only added to the residual."""

    def __init__(self, d=16, extra=False):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 32), nn.Linear(32, d)
        self.fc3 = nn.Linear(d, d)
        self.extra = extra          # a value-dependent branch: fc3 after fc2 when set

    def forward(self, x):
        y = x + self.fc2(torch.relu(self.fc1(self.norm(x))))
        return self.fc3(y) if self.extra else y


class PostNorm(PreNorm):
    """norm(x + fc2(relu(fc1(x)))): the norm saves fc2's output, which must be computed."""

    def forward(self, x):
        return self.norm(x + self.fc2(torch.relu(self.fc1(x))))


def grads(block, x, gy, skip=None, g=0):
    """Gradients of <block(x), gy> w.r.t. x and the parameters (recompute through skip)."""
    block.zero_grad()
    x = x.detach().requires_grad_(True)
    out = skip.recompute(g, block, lambda: block(x)) if skip else block(x)
    out.backward(gy)
    return [x.grad.clone()] + [p.grad.clone() if p.grad is not None else None
                               for p in block.parameters()]


def same(a, b):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)


def test_tail_projection_is_skipped_with_the_same_gradients():
    torch.manual_seed(0)
    block, x, gy = PreNorm(), torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    want = grads(block, x, gy)
    skip = TailSkip()
    same(grads(block, x, gy, skip), want)          # first pass: the probe, no skipping
    assert skip.state[0] is block.fc2
    calls = []
    block.fc2.register_forward_hook(lambda m, i, o: calls.append(o.detach().clone()))
    same(grads(block, x, gy, skip), want)          # skipping: fc2 returns zeros
    assert skip.skipping() == [0] and len(calls) == 1
    assert calls[0].shape == (3, 5, 16) and not calls[0].any()   # no matmul ran
    assert "forward" not in block.fc2.__dict__     # the patch is gone after the pass


def test_a_projection_whose_output_is_saved_is_never_skipped():
    torch.manual_seed(1)
    block, x, gy = PostNorm(), torch.randn(4, 16), torch.randn(4, 16)
    want = grads(block, x, gy)
    skip = TailSkip()
    for _ in range(2):
        same(grads(block, x, gy, skip), want)
    assert skip.state[0] is False and skip.skipping() == []


def test_a_tail_that_changes_with_values_falls_back_to_a_full_recompute():
    torch.manual_seed(2)
    block, x, gy = PreNorm(), torch.randn(4, 16), torch.randn(4, 16)
    skip = TailSkip()
    grads(block, x, gy, skip)                      # probe: fc2 is the tail
    block.extra = True                             # now fc3 reads fc2's output
    want = grads(block, x, gy)
    same(grads(block, x, gy, skip), want)
    assert skip.state[0] is False


@pytest.mark.parametrize("bias", [True, False])
def test_skipped_linear_backward_under_bf16_autocast(bias):
    torch.manual_seed(3)
    block = PreNorm()
    if not bias:
        block.fc2.bias = None
    x, gy = torch.randn(2, 7, 16), torch.randn(2, 7, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = grads(block, x, gy)
        skip = TailSkip()
        grads(block, x, gy, skip)
        got = grads(block, x, gy, skip)
    assert skip.skipping() == [0]
    for u, v in zip(got, want):
        if u is not None:
            torch.testing.assert_close(u, v, rtol=2e-2, atol=2e-2)


class Scaled(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_a_linear_subclass_is_never_skipped():
    torch.manual_seed(4)
    block, x, gy = PreNorm(), torch.randn(4, 16), torch.randn(4, 16)
    block.fc2 = Scaled(32, 16)
    want = grads(block, x, gy)
    skip = TailSkip()
    for _ in range(2):
        same(grads(block, x, gy, skip), want)
    assert skip.skipping() == []


def test_disabled_never_probes():
    block = PreNorm()
    skip = TailSkip(enabled=False)
    grads(block, torch.randn(2, 16), torch.randn(2, 16), skip)
    assert skip.state == {}
