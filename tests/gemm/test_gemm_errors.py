"""Bad input: one-line ValueError/TypeError saying what to change."""

import numpy as np
import pytest
import torch

from gemm_testlib import fake_stats
from outcore.errors import OutcoreError
from outcore.gemm.matmul import matmul

A, B = torch.randn(6, 4), torch.randn(4, 5)


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and len(msg) < 300
    return msg


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
