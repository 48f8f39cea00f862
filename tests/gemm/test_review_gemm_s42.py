"""Session 42's review of matmul and gemm.Linear: argument handling and edge cases."""

import numpy as np
import pytest
import torch

from outcore.errors import OutcoreError
from outcore.gemm import Linear
from outcore.gemm.matmul import matmul
from gemm_testlib import one_line

A, B = torch.randn(6, 4), torch.randn(4, 5)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(A=torch.eye(4).to_sparse(), B=B), TypeError, "A is a sparse_coo tensor.*to_dense"),
    (dict(A=A, B=torch.eye(4, 5).to_sparse_csr()), TypeError, "B is a sparse_csr tensor"),
    (dict(A=A, B=B, transa="yes"), TypeError, "transa='yes' is not a bool"),
    (dict(A=A, B=B, transb=None), TypeError, "transb=None is not a bool"),
    (dict(A=A, B=B, transb=2), TypeError, "transb=2 is not a bool"),
    (dict(A=A, B=B, alpha=1j), TypeError, "alpha=1j is not a real number"),
    (dict(A=A, B=B, alpha="2"), TypeError, "alpha='2' is not a real number"),
    (dict(A=A, B=B, out=torch.zeros(6, 5), beta=None), TypeError, "beta=None is not a real"),
    (dict(A=A, B=B, alpha=torch.ones(2)), TypeError, "alpha=.* is not a real number"),
    (dict(A=A, B=B, compute=["fp32"]), OutcoreError, "compute=\\['fp32'\\] is not one of"),
])
def test_odd_arguments_are_one_line_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern) as e:
        matmul(devices="cpu", **kwargs)
    one_line(e)


def test_nested_tensor_is_a_one_line_error():
    with pytest.warns(UserWarning):
        nt = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(2, 4)])
    with pytest.raises(TypeError, match="A is a nested tensor") as e:
        matmul(nt, B, devices="cpu")
    one_line(e)


def test_scalar_and_flag_forms_that_stay_accepted():
    want = 2.0 * A @ B
    for alpha in (2, np.float32(2.0), np.array(2.0), torch.tensor(2.0), torch.tensor([2])):
        assert torch.allclose(matmul(A, B, alpha=alpha, devices="cpu"), want, atol=1e-5)
    got = matmul(A.t().contiguous(), B, transa=np.True_, transb=0, devices="cpu")
    assert torch.allclose(got, A @ B, atol=1e-5)


@pytest.mark.parametrize("compute", ["strassen", None])
def test_alpha_zero_reads_neither_a_nor_b(compute):
    """BLAS: alpha == 0 means out = beta * out; strassen's block sums spread NaN of A."""
    a = torch.randn(8, 8)
    a[0, 0] = float("nan")
    b = torch.randn(8, 8)
    b[3, 5] = float("inf")
    out = torch.randn(8, 8)
    want = 3.0 * out
    matmul(a, b, out, alpha=0.0, beta=3.0, compute=compute, devices="cpu")
    assert torch.equal(out, want)
    assert torch.equal(matmul(a, b, alpha=0, compute=compute, devices="cpu"),
                       torch.zeros(8, 8))


def test_an_out_made_under_inference_mode_is_written_outside_it():
    with torch.inference_mode():
        out = torch.full((6, 5), float("nan"))
    matmul(A, B, out, devices=["cpu", "cpu"], tile=2)
    assert torch.allclose(out, A @ B, atol=1e-5)
    c0 = out.clone()
    matmul(A, B, out, beta=0.5, devices="cpu")
    assert torch.allclose(out, A @ B + 0.5 * c0, atol=1e-5)


@pytest.mark.parametrize("shapes,alpha", [(((6, 0), (0, 5)), 1.0), (((6, 4), (4, 5)), 0.0)])
def test_a_memmap_out_is_flushed_when_nothing_is_multiplied(tmp_path, monkeypatch, shapes,
                                                            alpha):
    flushed = []
    monkeypatch.setattr(np.memmap, "flush", lambda self: flushed.append(self.shape))
    out = np.memmap(tmp_path / "c.bin", dtype=np.float32, mode="w+", shape=(6, 5))
    out[:] = 1.0
    a, b = (np.ones(s, dtype=np.float32) for s in shapes)
    matmul(a, b, out, alpha=alpha, beta=2.0, devices="cpu")
    assert np.all(out == 2.0) and flushed == [(6, 5)]


def test_linear_names_a_numpy_input_and_how_to_convert_it():
    layer = Linear(4, 3, devices="cpu")
    with pytest.raises(TypeError, match="not a ndarray: pass torch.as_tensor") as e:
        layer(np.ones((2, 4), dtype=np.float32))
    one_line(e)


def test_two_memmaps_of_one_file_are_checked_for_overlap(tmp_path):
    """A opened read-only and out opened for writing on the same file: different
    addresses, same bytes; out's tiles would overwrite A while it is read."""
    f = str(tmp_path / "x.bin")
    whole = np.memmap(f, dtype=np.float32, mode="w+", shape=(300, 64))
    whole[:] = np.random.default_rng(0).random((300, 64), dtype=np.float32)
    whole.flush()
    a = np.memmap(f, dtype=np.float32, mode="r", shape=(100, 64))
    b = np.random.default_rng(1).random((64, 64), dtype=np.float32)
    rows = 64 * 4
    with pytest.raises(OutcoreError, match="out overlaps A in the file") as e:
        matmul(a, b, np.memmap(f, dtype=np.float32, mode="r+", shape=(100, 64),
                               offset=50 * rows))
    one_line(e)
    view = np.memmap(f, dtype=np.float32, mode="r+", shape=(300, 64))[150:250]
    with pytest.raises(OutcoreError, match="out overlaps A in the file"):
        matmul(np.memmap(f, dtype=np.float32, mode="r", shape=(300, 64))[200:300], b, view)
    # another part of the same file: allowed, and right
    ref = np.asarray(a, dtype=np.float64) @ b
    out = np.memmap(f, dtype=np.float32, mode="r+", shape=(100, 64), offset=100 * rows)
    matmul(a, b, out)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
