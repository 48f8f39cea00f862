"""The row-major -> column-major argument mapping of the cuBLASXt baseline, checked with a
column-major GEMM emulated on the CPU (cuBLASXt itself needs a GPU: test_gemm_gpu.py)."""

import pytest
import torch

from outcore.gemm.cublasxt import colmajor_args


def _cm(t: torch.Tensor, rows: int, cols: int, ld: int) -> torch.Tensor:
    """The rows x cols column-major matrix with leading dimension ld at t's first element."""
    return torch.as_strided(t, (rows, cols), (1, ld), t.storage_offset())


def _emulate(op1, op2, m, n, k, x1, ld1, x2, ld2, ldc, C):
    a = _cm(x1, m, k, ld1) if op1 == 0 else _cm(x1, k, m, ld1).t()
    b = _cm(x2, k, n, ld2) if op2 == 0 else _cm(x2, n, k, ld2).t()
    _cm(C, m, n, ldc).copy_(a @ b)


@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
def test_row_major_product_through_column_major_arguments(transa, transb):
    g = torch.Generator().manual_seed(0)
    m, n, k = 5, 7, 3
    wide = lambda r, c: torch.randn(r, c + 4, generator=g, dtype=torch.float64)[:, 2:2 + c]
    A = wide(k, m) if transa else wide(m, k)          # row pitch != row length
    B = wide(n, k) if transb else wide(k, n)
    C = torch.zeros(m, n + 3, dtype=torch.float64)[:, :n]
    _emulate(*colmajor_args(A, B, C, transa, transb), C)
    ref = (A.t() if transa else A) @ (B.t() if transb else B)
    torch.testing.assert_close(C, ref)


def test_column_major_input_is_refused():
    A = torch.randn(4, 3).t()
    with pytest.raises(ValueError, match="row-major A"):
        colmajor_args(A, torch.randn(4, 2), torch.randn(3, 2), False, False)
