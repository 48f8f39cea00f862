"""The cuBLASLt fp32 path's operand mapping (CPU): what it would hand cuBLASLt computes the
product torch computes, for every layout the worker passes; and where it must stand aside."""

import pytest
import torch

from outcore.gemm import ltmm


def _colmajor(x: torch.Tensor, d: ltmm.Operand) -> torch.Tensor:
    """The matrix cuBLASLt reads for operand `d` over x's storage, after its op."""
    stored = torch.as_strided(x, (d.rows, d.cols), (1, d.ld), x.storage_offset())
    return stored.t() if d.op == 1 else stored


def _views(m, n, k, ta, tb, pad):
    """a (m x k) and b (k x n) as the worker slices them: row-major panels or transposed
    ones, each a slice of a wider block (pad extra columns)."""
    g = torch.Generator().manual_seed(m + 7 * n + 13 * k + ta + 2 * tb)
    if ta:
        a = torch.randn(k, m + pad, generator=g, dtype=torch.float64)[:, pad:].t()
    else:
        a = torch.randn(m, k + pad, generator=g, dtype=torch.float64)[:, pad:]
    if tb:
        b = torch.randn(n, k + pad, generator=g, dtype=torch.float64)[:, :k].t()
    else:
        b = torch.randn(k, n + pad, generator=g, dtype=torch.float64)[:, :n]
    return a, b


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("pad", [0, 3])
def test_the_operands_compute_the_product(ta, tb, pad):
    m, n, k = 300, 270, 290
    a, b = _views(m, n, k, ta, tb, pad)
    acc = torch.zeros(m, n + pad, dtype=torch.float64)[:, :n]
    assert (ltmm.problem_key(acc, a, b) is None) == tb   # b column-contiguous: cuBLAS's
    lb, la, ldc = ltmm.operands(acc, a, b)
    # cuBLASLt computes D (n x m, column-major, ld ldc) = op(B-side) @ op(A-side)
    d = _colmajor(b, lb) @ _colmajor(a, la)
    assert d.shape == (n, m) and ldc == n + pad
    torch.testing.assert_close(d.t(), a @ b)


def test_layouts_it_cannot_take():
    x = torch.zeros(512, 512)
    assert ltmm.lt_operand(x[:, ::2]) is None                    # neither stride is 1
    assert ltmm.operands(torch.zeros(128, 512), torch.zeros(128, 512), x) is None  # small m
    acc_t = torch.zeros(512, 512).t()                             # C must be row-major
    assert ltmm.operands(acc_t, x, x) is None
    assert ltmm.operands(x, x, x) is not None


def test_it_stands_aside_off_the_gpu_and_for_other_dtypes():
    a, b, acc = torch.ones(512, 512), torch.ones(512, 512), torch.zeros(512, 512)
    before = ltmm.calls
    assert not ltmm.addmm(acc, a, b, 1.0, 0.0)
    assert not ltmm.addmm(acc.double(), a.double(), b.double(), 1.0, 0.0)
    assert ltmm.calls == before and acc.abs().sum() == 0
