"""mmacc.COL_CHUNK: a GEMM cut into column chunks (strided views of the accumulator and
of B, no copies) gives the sums of one call, through the whole product too."""

import torch

from outcore import matmul
from outcore.gemm import mmacc


def test_column_chunks_add_up_to_the_whole_gemm(monkeypatch):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(37, 64, generator=g).to(torch.bfloat16)
    b = torch.randn(64, 50, generator=g).to(torch.bfloat16)
    c0 = torch.randn(37, 50, generator=g)
    whole = c0.clone()
    mmacc.mm_acc(whole, a, b, 0.5, 2.0)
    calls = []
    real = mmacc._mm_acc

    def spy(acc, a_, b_, alpha, beta):
        calls.append((acc.shape[1], acc.stride(0)))
        return real(acc, a_, b_, alpha, beta)
    monkeypatch.setattr(mmacc, "_mm_acc", spy)
    monkeypatch.setattr(mmacc, "COL_CHUNK", 16)
    split = c0.clone()
    mmacc.mm_acc(split, a, b, 0.5, 2.0)
    assert calls == [(16, 50), (16, 50), (16, 50), (2, 50)]   # views of the one tile
    # the same sums up to fp32 rounding (the host BLAS blocks each call's columns its own way)
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=1e-5)
    calls.clear()
    mmacc.mm_acc(split, a.float(), b.float(), 1.0, 0.0)        # fp32: not a chunked dtype
    assert calls == [(50, 50)]


def test_a_product_in_column_chunks_matches_float64(monkeypatch):
    monkeypatch.setattr(mmacc, "COL_CHUNK", 24)
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(70, 90, generator=g), torch.randn(90, 100, generator=g)
    out = matmul(A, B, compute="bf16", devices="cpu", tile=(32, 64))
    ref = A.to(torch.bfloat16).double() @ B.to(torch.bfloat16).double()
    assert (out.double() - ref).abs().max() < 1e-3 * ref.abs().max()
