"""outcore.memory.host_empty: huge-page-advised host tensors (CPU)."""

import gc

import pytest
import torch

from outcore.memory import host_empty
from outcore.memory.hostalloc import HUGE_PAGE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_large_tensors_are_aligned_contiguous_and_writable(dtype):
    t = host_empty((1024, 3000), dtype)
    assert t.shape == (1024, 3000) and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    t.copy_(torch.arange(t.numel()).view(t.shape).to(dtype))
    assert torch.equal(t[7], torch.arange(7 * 3000, 8 * 3000).to(dtype))


def test_a_view_keeps_the_mapping_alive():
    t = host_empty(1 << 20)
    t.fill_(3.0)
    view = t[100:200]
    del t
    gc.collect()
    junk = [torch.full((1 << 20,), 7.0) for _ in range(4)]   # would reuse freed pages
    assert torch.equal(view, torch.full((100,), 3.0))
    del junk


def test_small_tensors_and_int_shapes():
    small = host_empty(10)
    assert small.shape == (10,) and small.dtype == torch.float32
    assert host_empty((0, 5)).shape == (0, 5)
