"""outcore.gemm.Linear's init: torch.nn.Linear's distribution; a large weight drawn on a
pool of threads (draws.RowBlocks), decided by torch.manual_seed whatever the thread count."""

import math

import pytest
import torch
from torch import nn

from outcore.draws import RowBlocks
from outcore.gemm import Linear
from outcore.gemm import linear as linear_mod


def layer(n_in=300, n_out=200, **kw):
    return Linear(n_in, n_out, pin=False, **kw)


def test_a_small_weight_is_torchs_own_init_value_for_value():
    torch.manual_seed(7)
    got = layer()
    torch.manual_seed(7)
    want = nn.Linear(300, 200)
    assert torch.equal(got.weight, want.weight) and torch.equal(got.bias, want.bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_large_weight_is_drawn_in_parallel_from_torchs_seed(monkeypatch, dtype):
    monkeypatch.setattr(linear_mod, "PARALLEL_INIT", 1000)
    monkeypatch.setattr(RowBlocks, "CHUNK", 3000)   # blocks of 10 rows: 20 of them
    torch.manual_seed(3)
    a = layer(dtype=dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)      # the pool's size: the values must not follow it
        torch.manual_seed(3)
        b = layer(dtype=dtype)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    torch.manual_seed(4)
    assert not torch.equal(layer(dtype=dtype).weight, a.weight)
    w = a.weight.detach().double()
    bound = 1 / math.sqrt(300)
    assert w.abs().max().item() <= bound and w.abs().max().item() > 0.99 * bound
    assert abs(w.std().item() - bound / math.sqrt(3)) < 0.02 * bound   # uniform's std
    assert abs(w.mean().item()) < 0.02 * bound
    assert not torch.equal(a.weight[0], a.weight[1])   # rows drawn apart


def test_the_parallel_draw_differs_from_torchs_but_not_in_distribution(monkeypatch):
    torch.manual_seed(5)
    serial = layer().weight.detach().clone()
    monkeypatch.setattr(linear_mod, "PARALLEL_INIT", 1000)
    torch.manual_seed(5)
    par = layer().weight.detach()
    assert not torch.equal(serial, par)
    assert abs(serial.std().item() - par.std().item()) < 0.03 * serial.std().item()
