"""The copy kernel (outcore.gemm.kcopy) on a GPU, skipped without CUDA or Triton: regions
of pinned host matrices in and out exactly, and products that take it match float64."""

import pytest
import torch

from gemm_testlib import check_close

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from outcore.gemm import copies, kcopy  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.memory import pin_, unpin_  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("registered", [True, False])
def test_regions_cross_exactly_both_ways(dtype, registered):
    g = torch.Generator().manual_seed(1)
    host = torch.randn(1500, 3000, generator=g).to(dtype)
    host = pin_(host) if registered else host.pin_memory()   # cudaHostRegister / Alloc
    try:
        region = host[7:1407, 33:2081]          # rows narrower than the matrix, odd offsets
        dev = torch.empty(region.shape, dtype=dtype, device="cuda")
        s = torch.cuda.current_stream()
        assert kcopy.kcopy2d(dev, region, s)
        back = torch.zeros_like(host).pin_memory()
        assert kcopy.kcopy2d(back[100:1500, 900:2948], dev, s)
        s.synchronize()
        assert torch.equal(dev.cpu(), region)
        want = torch.zeros_like(host)
        want[100:1500, 900:2948] = region
        assert torch.equal(back, want)          # nothing outside the region was written
    finally:
        if registered:
            unpin_(host)


def test_pageable_host_memory_is_refused():
    host = torch.randn(64, 300)
    dev = torch.empty(64, 100, device="cuda")
    assert not kcopy.kcopy2d(dev, host[:, :100], torch.cuda.current_stream())


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_products_through_the_copy_kernel_match_float64(compute, ta, tb, monkeypatch):
    monkeypatch.setitem(copies.KCOPY_ROW_MAX, compute, 1 << 20)   # every narrow region
    g = torch.Generator().manual_seed(2)
    m, n, k = 1100, 900, 1300
    A = torch.randn(*((k, m) if ta else (m, k)), generator=g)
    B = torch.randn(*((n, k) if tb else (k, n)), generator=g)
    C = torch.randn(m, n, generator=g)
    A, B, C = (pin_(x) for x in (A, B, C))
    try:
        C0 = C.clone()
        _, st = matmul(A, B, C, alpha=0.5, beta=2.0, transa=ta, transb=tb, devices=0,
                       compute=compute, tile=(256, 384), return_stats=True)
        assert st.devices[0].kcopy_bytes > 0
        a = A.double().numpy()
        b = B.double().numpy()
        check_close(C, a.T if ta else a, b.T if tb else b, C0.double().numpy(), 0.5, 2.0,
                    compute)
    finally:
        for x in (A, B, C):
            unpin_(x)
