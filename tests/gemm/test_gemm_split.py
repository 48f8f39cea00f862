"""compute="tf32x3" (gemm/split.py): operands split into TF32 hi and lo parts as they land,
three GEMMs per product; with GEMMs that read their operands as TF32 (emulated here, on
the CPU, with fp32 sums rounded to nearest) the result as exact as fp32's."""

import numpy as np
import pytest
import torch

from gemm_testlib import as64, check_close, make
from outcore.gemm import loads
from outcore.gemm import split as split_mod
from outcore.gemm.matmul import matmul
from outcore.gemm.plan import make_plan

TF32_LOW_BITS = (1 << 13) - 1


def tf32_truncated(x: torch.Tensor) -> torch.Tensor:
    """x as a TF32 tensor core reads it where it drops the low 13 mantissa bits."""
    return (x.contiguous().view(torch.int32) & ~TF32_LOW_BITS).view(torch.float32)


def test_split_parts_are_tf32_and_add_up_exactly():
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(64, 130, generator=g) * torch.logspace(-30, 30, 130)
    wide[0, :4] = torch.tensor([0.0, -0.0, 1e-40, -3e-42])      # zeros and subnormals
    x = wide[:, 1::2]                                             # strided, as a K piece
    before = x.clone()
    lo = torch.empty(64, 65)
    split_mod.split_(x, lo)
    hi_bits = x.contiguous().view(torch.int32)
    assert not (hi_bits & TF32_LOW_BITS).any()                    # hi is a TF32 value
    assert torch.equal(x.double() + lo.double(), before.double())  # nothing lost
    normal = before.abs() >= torch.finfo(torch.float32).tiny      # subnormals: fewer bits
    assert (lo.abs() <= before.abs() * 2.0**-11)[normal].all()    # rounded to nearest
    assert torch.equal(wide[:, 0::2], wide[:, 0::2])              # untouched columns
    # a tie (exactly half a TF32 ulp above 1) rounds away from zero
    t = torch.tensor([1 + 2.0**-11, -(1 + 2.0**-11)])
    tl = torch.empty(2)
    split_mod.split_(t, tl)
    assert t.tolist() == [1 + 2.0**-10, -(1 + 2.0**-10)]
    assert tl.tolist() == [-2.0**-11, 2.0**-11]


def test_lo_part_is_the_same_region_of_the_lo_buffer():
    buf = torch.arange(40.0)
    view, lo = buf[:20].view(4, 5), buf[20:].view(4, 5)
    part = view[1:3, 2:5]
    assert torch.equal(split_mod.lo_part(view, lo, part), lo[1:3, 2:5])


@pytest.fixture
def emulated_tf32(monkeypatch):
    """The split path's GEMMs read their operands as TF32 (truncated, the coarser of the
    two readings a tensor core may make), as on a GPU, so the CPU shows what the lo parts
    are worth."""
    real = split_mod.mm_acc

    def mm_tf32(acc, a, b, alpha, beta):
        return real(acc, tf32_truncated(a), tf32_truncated(b), alpha, beta)
    monkeypatch.setattr(split_mod, "mm_acc", mm_tf32)


@pytest.mark.parametrize("transa,transb,layout", [(False, False, "c"), (True, False, "f"),
                                                  (False, True, "step"), (True, True, "c")])
def test_tf32x3_is_fp32_accurate_where_gemms_read_tf32(emulated_tf32, transa, transb, layout):
    rng = np.random.default_rng(3)
    m, n, k = 70, 50, 300
    a64 = rng.standard_normal((k, m) if transa else (m, k)).astype(np.float32).astype(float)
    b64 = rng.standard_normal((n, k) if transb else (k, n)).astype(np.float32).astype(float)
    c64 = rng.standard_normal((m, n)).astype(np.float32).astype(float)
    A, B = make(a64, "torch", "float32", layout), make(b64, "torch", "float32", layout)
    C = make(c64, "torch", "float32", "c")
    # small tiles and pieces: many blocks, each split piece by piece; a tight budget evicts
    got = matmul(A, B, C.clone(), transa=transa, transb=transb, alpha=-1.5, beta=0.5,
                 devices=["cpu", "cpu"], compute="tf32x3", tile=(16, 24, 64, 16),
                 gpu_memory="64KiB")
    check_close(got, a64, b64, c64, -1.5, 0.5, "fp32", transa, transb)
    # the hi parts alone (one GEMM of TF32 values) are far from fp32
    oa, ob = (a64.T if transa else a64), (b64.T if transb else b64)
    hi_only = as64(tf32_truncated(torch.from_numpy(oa).float()) @
                   tf32_truncated(torch.from_numpy(ob).float()))
    assert np.abs(hi_only - oa @ ob).max() > 100 * np.abs(as64(got) - (
        -1.5 * oa @ ob + 0.5 * c64)).max()


def test_tf32x3_without_its_lo_parts_fails_the_fp32_check(emulated_tf32, monkeypatch):
    """The check above can fail: a split that leaves lo at zero is TF32-accurate only."""
    monkeypatch.setattr(loads, "split_", lambda hi, lo: (lo.zero_(), hi.copy_(
        tf32_truncated(hi))))
    rng = np.random.default_rng(4)
    a64, b64 = rng.standard_normal((40, 200)), rng.standard_normal((200, 30))
    A, B = torch.from_numpy(a64).float(), torch.from_numpy(b64).float()
    got = matmul(A, B, devices="cpu", compute="tf32x3", tile=(16, 16, 64, 32))
    with pytest.raises(AssertionError):
        check_close(got, as64(A), as64(B), None, 1.0, 0.0, "fp32")


def test_plan_counts_both_parts_of_the_cache():
    kw = dict(host_dtype=torch.float32, budget=1 << 30, device_type="cpu", tile=(64, 64, 256))
    one, two = make_plan(512, 512, 4096, compute="fp32", **kw), \
        make_plan(512, 512, 4096, compute="tf32x3", **kw)
    assert two.splits and not one.splits
    assert two.device_bytes() - one.device_bytes() == (512 + 512) * 4096 * 4   # all cached
    tight = dict(kw, budget=3 << 20)
    assert make_plan(512, 512, 4096, compute="tf32x3", **tight).n_slots < make_plan(
        512, 512, 4096, compute="fp32", **tight).n_slots


def test_tf32x3_keeps_the_budget_and_reports_its_compute():
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(96, 512, generator=g), torch.randn(512, 80, generator=g)
    out, st = matmul(A, B, devices="cpu", compute="tf32x3", gpu_memory="256KiB", tile=32,
                     return_stats=True)
    check_close(out, as64(A), as64(B), None, 1.0, 0.0, "fp32")
    assert st.compute == "tf32x3"
    assert st.devices[0].device_bytes <= 256 << 10
