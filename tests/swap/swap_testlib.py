"""Shared helpers for the swap tests: a tiny CNN and one training step, plain or swapped."""

from __future__ import annotations

import copy

import torch
from torch import nn


def tiny_cnn(seed: int = 0, channels: int = 8) -> nn.Module:
    """conv, BatchNorm, ReLU, pooling, linear: N x 3 x 16 x 16 -> N x 10."""
    torch.manual_seed(seed)
    c = channels
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.Conv2d(2 * c, 2 * c, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, 10))


def batch(n: int = 4, seed: int = 1, hw: int = 16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, hw, hw, generator=g), torch.randint(0, 10, (n,), generator=g)


def loss_of(model: nn.Module, x, y) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def twin(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def assert_same_grads(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), f"gradient of {name} differs"


def autocast_bf16_pair(plain: nn.Module, swapped: nn.Module, **swap_kw):
    """One bf16-autocast step of `plain`, and of `swapped` inside outcore.swap(**swap_kw):
    asserts equal losses and gradients; returns the swap's report."""
    import outcore
    x, y = batch(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_a = loss_of(plain, x, y)
    loss_a.backward()
    with outcore.swap(swapped, **swap_kw) as s:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_b = loss_of(swapped, x, y)
        loss_b.backward()
    assert torch.equal(loss_a, loss_b)
    assert_same_grads(plain, swapped)
    return s.report()


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    for (name, t), u in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(t, u), f"{name} differs"


def hook_counts(model: nn.Module) -> list[tuple]:
    """Every hook table of every module, by size (to compare before and after a swap)."""
    out = []
    for name, m in model.named_modules():
        out.append((name, len(m._forward_pre_hooks), len(m._forward_hooks),
                    len(m._backward_hooks), len(m._backward_pre_hooks),
                    len(getattr(m, "_forward_hooks_always_called", {})),
                    len(m._forward_pre_hooks_with_kwargs), len(m._forward_hooks_with_kwargs)))
    for p in model.parameters():
        out.append(("param", len(p._backward_hooks or {}) if hasattr(p, "_backward_hooks") else 0))
    return out


def saved_hooks_top():
    return torch._C._autograd._top_saved_tensors_default_hooks(False)
