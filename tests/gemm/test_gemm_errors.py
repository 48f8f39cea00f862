"""Bad input: one-line ValueError/TypeError saying what to change."""

import warnings

import numpy as np
import pytest
import torch

from gemm_testlib import fake_stats, one_line
from outcore.errors import OutcoreError
from outcore.gemm.matmul import matmul

A, B = torch.randn(6, 4), torch.randn(4, 5)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    (dict(A=torch.randn(6, 3), B=B), OutcoreError, "inner sizes 3 and 4 differ.*transa/transb"),
    (dict(A=A, B=B, transb=True), OutcoreError, "op\\(B\\) is 5x4"),
    (dict(A=torch.randn(2, 6, 4), B=B), OutcoreError, "3-d.*reshape"),
    (dict(A=A, B=torch.randn(4)), OutcoreError, "1-d"),
    (dict(A=A, B=B, out=torch.empty(5, 6)), OutcoreError, "out has shape \\(5, 6\\).*\\(6, 5\\)"),
    (dict(A=A, B=B, out=torch.empty(6, 5, dtype=torch.float64)), TypeError,
     "out has dtype torch.float64.*pass an out of dtype torch.float32"),
    (dict(A=A, B=B.double()), TypeError, "same dtype"),
    (dict(A=A.half(), B=B.half()), TypeError, "float16.*torch.float32"),
    (dict(A=A.numpy().astype(np.int64), B=B.numpy()), TypeError, "int64.*float32"),
    (dict(A=[[1.0]], B=B), TypeError, "list.*torch.Tensor"),
    (dict(A=A, B=B, beta=1.0), OutcoreError, "beta=1.0 needs an out"),
    (dict(A=A, B=B, compute="fp16"), OutcoreError, "compute='fp16' is not one of"),
    (dict(A=A, B=B, devices="cuda:7"), OutcoreError, "does not exist"),
    (dict(A=A, B=B, devices="tpu"), OutcoreError, "not a device"),
    (dict(A=A, B=B, devices=[]), OutcoreError, "devices is empty"),
    (dict(A=A, B=B, gpu_memory="lots"), OutcoreError, "does not parse as a size"),
    (dict(A=A, B=B, tile=(4, 0)), OutcoreError, "tile=\\(4, 0\\) is not valid"),
    (dict(A=A, B=B, devices="cpu", gpu_memory=64, tile=4), OutcoreError,
     "too small for one 4x4 tile.*raise gpu_memory or pass a smaller tile"),
])
def test_bad_input_raises_one_line_error(kwargs, exc, pattern):
    kwargs.setdefault("devices", "cpu")
    with pytest.raises(exc, match=pattern) as e:
        matmul(**kwargs)
    one_line(e)
    assert isinstance(e.value, (ValueError, TypeError))


def test_out_overlapping_an_input_and_read_only_out(tmp_path):
    X = torch.randn(6, 6)
    with pytest.raises(OutcoreError, match="out overlaps A") as e:
        matmul(X, torch.randn(6, 6), out=X, devices="cpu")
    one_line(e)
    p = tmp_path / "c.bin"
    np.zeros((6, 5), dtype=np.float32).tofile(p)
    ro = np.memmap(p, dtype=np.float32, mode="r", shape=(6, 5))
    with pytest.raises(OutcoreError, match="read-only.*'r\\+'"):
        matmul(A.numpy(), B.numpy(), out=ro, devices="cpu")


def test_tensor_over_a_read_only_memmap_is_refused_not_a_segfault(tmp_path):
    """torch.from_numpy of a mode-'r' memmap: a store into it would kill the process."""
    p = tmp_path / "c.bin"
    np.zeros((6, 5), dtype=np.float32).tofile(p)
    ro = np.memmap(p, dtype=np.float32, mode="r", shape=(6, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's "not writable" warning
        t = torch.from_numpy(ro)
    with pytest.raises(OutcoreError, match=r"read-only.*'r\+'") as e:
        matmul(A, B, out=t, devices="cpu")
    one_line(e)
    rw = torch.from_numpy(np.memmap(p, dtype=np.float32, mode="r+", shape=(6, 5)))
    matmul(A, B, out=rw, devices="cpu")   # the same file opened for writing works
    torch.testing.assert_close(rw, A @ B)


def test_gpu_tensor_is_a_type_error_naming_the_fix():
    meta = torch.empty(6, 4, device="meta")
    with pytest.raises(TypeError, match="A is on meta.*A.cpu\\(\\)"):
        matmul(meta, B, devices="cpu")


def test_a_budget_too_small_names_the_margin_taken_from_it(monkeypatch):
    """On a GPU matmul keeps part of a given gpu_memory for cuBLAS workspaces; when the
    rest is too small the message says both numbers."""
    import importlib
    mm = importlib.import_module("outcore.gemm.matmul")   # the module, not the function
    monkeypatch.setattr(mm, "resolve_budget", lambda given, devs: 100)
    with pytest.raises(OutcoreError) as e:
        matmul(A, B, devices="cpu", gpu_memory="1KiB", tile=4)
    msg = one_line(e)
    assert "too small" in msg and "gpu_memory=1.0 KiB given, less 924 B kept" in msg


def test_default_budget_counts_the_allocators_cached_memory_as_free(monkeypatch):
    """gpu_memory=None: the budget is the same whether the last product's arena is still
    cached by torch's allocator or handed back to the driver (so the plan is the same)."""
    import torch
    from outcore.gemm.validate import resolve_budget
    dev = [torch.device("cuda", 0)]
    gib = 1 << 30
    state = {"free": 100 * gib, "reserved": 0, "allocated": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (state["free"], 140 * gib))
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict",
                        lambda d=None: fake_stats(state["reserved"], state["allocated"]))
    before = resolve_budget(None, dev)
    state.update(free=76 * gib, reserved=26 * gib, allocated=2 * gib)   # 24 GiB cached
    assert resolve_budget(None, dev) == before
    state.update(reserved=26 * gib, allocated=26 * gib)                 # in use: less
    assert resolve_budget(None, dev) < before
    # a few MiB more or less free (a cuBLAS workspace): the same budget, so the same
    # remembered plan
    state.update(free=100 * gib - (3 << 20), reserved=0, allocated=0)
    assert resolve_budget(None, dev) == before


@pytest.mark.parametrize("out,pattern", [
    (torch.zeros(1, 5).expand(6, 5), "strides \\(0, 4\\).*elements are distinct"),
    (np.lib.stride_tricks.as_strided(np.zeros((6, 5), np.float32), (6, 5), (8, 4)),
     "strides \\(8, 4\\)"),
])
def test_an_out_whose_elements_share_memory_is_refused(out, pattern):
    a, b = (A.numpy(), B.numpy()) if isinstance(out, np.ndarray) else (A, B)
    with pytest.raises(OutcoreError, match=pattern) as e:
        matmul(a, b, out, devices="cpu")
    one_line(e)


def test_distinct_strided_outs_are_still_taken():
    for out in (torch.zeros(5, 6).t(), torch.zeros(12, 10)[::2, ::2], torch.zeros(1, 5)):
        a = A[:out.shape[0]]
        matmul(a, B, out, devices="cpu")
        assert torch.allclose(out, a @ B, atol=1e-6)


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(gpu_memory=float("inf")), "positive, finite"),
    (dict(gpu_memory=float("nan")), "positive, finite"),
    (dict(gpu_memory="1e400"), "positive, finite"),
    (dict(tile=4.0), "tile=4.0 is not valid"),
    (dict(tile="8"), "tile='8' is not valid"),
    (dict(devices=1.5), "devices=1.5 is not a device"),
])
def test_odd_budget_tile_and_devices_values_are_refused(kwargs, pattern):
    with pytest.raises(OutcoreError, match=pattern) as e:
        matmul(A, B, **{"devices": "cpu", **kwargs})
    one_line(e)


def test_numpy_integers_are_a_tile_and_a_device_count():
    out = matmul(A, B, devices="cpu", tile=np.int64(4))
    assert torch.allclose(out, A @ B, atol=1e-6)


def test_an_out_that_requires_grad_is_written_as_data_also_when_k_is_0():
    out = torch.ones(3, 4, requires_grad=True)
    matmul(torch.zeros(3, 0), torch.zeros(0, 4), out, beta=2.0, devices="cpu")
    assert torch.equal(out.detach(), torch.full((3, 4), 2.0)) and out.requires_grad
    out2 = torch.ones(3, 4, requires_grad=True)
    matmul(torch.ones(3, 2), torch.ones(2, 4), out2, beta=2.0, devices="cpu")
    assert torch.equal(out2.detach(), torch.full((3, 4), 4.0))


def test_inference_mode_reaches_every_worker_thread():
    """torch keeps inference mode per thread: the tiles of an out made under it are
    written by worker threads, which must enter it too."""
    a, b = torch.randn(40, 30), torch.randn(30, 50)
    with torch.inference_mode():
        got = matmul(a, b, devices=["cpu", "cpu", "cpu"], tile=8)
        out = torch.zeros(40, 50)
        matmul(a, b, out, devices=["cpu", "cpu"], tile=16, beta=0.0)
    assert torch.allclose(got, a @ b, atol=1e-5) and torch.allclose(out, a @ b, atol=1e-5)
