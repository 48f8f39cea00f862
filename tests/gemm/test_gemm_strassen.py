"""compute="strassen" (one Strassen-Winograd level) against a float64 reference on the CPU."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemm_testlib import as64, make, rounded
from outcore.errors import OutcoreError
from outcore.gemm import strassen
from outcore.gemm.matmul import matmul

EPS = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}


def check_normwise(got, a64, b64, c0, alpha, beta, dtype, transa=False, transb=False):
    """Strassen's error bound is norm-wise: |error| <= c u k max|op(A)| max|op(B)| (+ C's
    rounding); c = 64 is loose for one level, and a wrong quadrant is off by O(1)."""
    oa, ob = (a64.T if transa else a64), (b64.T if transb else b64)
    ref = alpha * (oa @ ob) + (beta * c0 if beta != 0 else 0)
    k = oa.shape[1]
    scale = abs(alpha) * k * np.abs(oa).max(initial=0) * np.abs(ob).max(initial=0)
    scale += abs(beta) * (np.abs(c0).max() if beta != 0 else 0) + np.abs(ref).max(initial=0)
    err = np.abs(as64(got) - ref).max(initial=0)
    assert err <= 64 * EPS[dtype] * scale + 1e-30, f"error {err:.3g}, scale {scale:.3g}"


@pytest.fixture
def small_quadrants(monkeypatch):
    """Let small budgets cut small products into super-tiles and K blocks, and cut their
    C12 into STRIPS strips."""
    monkeypatch.setattr(strassen, "MIN_HALF", 1)
    monkeypatch.setattr(strassen, "STRIP_MIN", 1)


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["torch", "numpy"]))
    beta = draw(st.sampled_from([0.0, 1.0, -0.75]))
    return dict(
        kind=kind, dtype=draw(st.sampled_from(["float32", "float64"])),
        m=draw(st.integers(1, 40)), n=draw(st.integers(1, 40)), k=draw(st.integers(1, 40)),
        transa=draw(st.booleans()), transb=draw(st.booleans()),
        la=draw(st.sampled_from(["c", "f", "step"])), lb=draw(st.sampled_from(["c", "f", "step"])),
        lc=draw(st.sampled_from(["c", "f", "step"])),
        alpha=draw(st.sampled_from([1.0, 2.5, -0.5])), beta=beta,
        with_out=beta != 0 or draw(st.booleans()),
        budget=draw(st.sampled_from([None, 24 << 10, 40 << 10])),
        devices=draw(st.sampled_from(["cpu", ["cpu", "cpu"]])),
        seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases())
def test_matches_float64_reference(small_quadrants, c):
    rng = np.random.default_rng(c["seed"])
    m, n, k = c["m"], c["n"], c["k"]
    a64 = rounded(rng.standard_normal((k, m) if c["transa"] else (m, k)), c["dtype"])
    b64 = rounded(rng.standard_normal((n, k) if c["transb"] else (k, n)), c["dtype"])
    c0 = rounded(rng.standard_normal((m, n)), c["dtype"])
    A = make(a64, c["kind"], c["dtype"], c["la"])
    B = make(b64, c["kind"], c["dtype"], c["lb"])
    out = make(c0, c["kind"], c["dtype"], c["lc"]) if c["with_out"] else None
    got = matmul(A, B, out, transa=c["transa"], transb=c["transb"], alpha=c["alpha"],
                 beta=c["beta"], devices=c["devices"], gpu_memory=c["budget"],
                 compute="strassen")
    if out is not None:
        assert got is out
    assert tuple(got.shape) == (m, n)
    check_normwise(got, a64, b64, c0, c["alpha"], c["beta"], c["dtype"], c["transa"],
                   c["transb"])


def test_super_tiles_and_k_blocks_with_beta_and_memmaps(small_quadrants, tmp_path):
    """A budget that forces several super-tiles and K blocks; memmap inputs and output."""
    rng = np.random.default_rng(3)
    a64, b64, c0 = (rng.standard_normal(s) for s in ((61, 77), (53, 77), (61, 53)))
    paths = [tmp_path / f"{x}.bin" for x in "abc"]
    for p, v in zip(paths, (a64, b64, c0)):
        w = np.memmap(p, dtype=np.float64, mode="w+", shape=v.shape)
        w[:] = v
        w.flush()
    A = np.memmap(paths[0], dtype=np.float64, mode="r", shape=a64.shape)
    B = np.memmap(paths[1], dtype=np.float64, mode="r", shape=b64.shape)
    C = np.memmap(paths[2], dtype=np.float64, mode="r+", shape=c0.shape)
    budget = 64 << 10
    plan = strassen.make_strassen_plan(61, 53, 77, 8, budget, 2, beta_zero=False)
    assert len(plan.tiles()) >= 2 and len(plan.k_spans) >= 2, plan.describe()
    assert plan.device_bytes() <= budget
    got, stats = matmul(A, B, C, transb=True, alpha=0.5, beta=2.0, devices=["cpu", "cpu"],
                        gpu_memory=budget, compute="strassen", return_stats=True)
    assert got is C
    on_disk = np.fromfile(paths[2], dtype=np.float64).reshape(c0.shape)
    check_normwise(on_disk, a64, b64, c0, 0.5, 2.0, "float64", transb=True)
    assert sum(d.tiles for d in stats.devices) == len(plan.tiles())
    assert stats.plan.startswith("strassen")


@pytest.mark.parametrize("strip_min,strips", [(1, strassen.STRIPS), (32 * 16 // 3, 3),
                                               (32 * 16 + 1, 1)])
def test_seven_gemms_of_eight_and_every_output_once(strip_min, strips, monkeypatch):
    """One super-tile, one K block: 7 quadrant products (the first two in copy pieces, the
    last in row strips of STRIP_MIN elements at least), 7/8 of the classical FLOPs; each
    element of C comes back once."""
    monkeypatch.setattr(strassen, "STRIP_MIN", strip_min)
    assert strassen.c12_strips(32, 16) == strips
    A, B = torch.randn(64, 48), torch.randn(48, 32)
    got, stats = matmul(A, B, devices="cpu", compute="strassen", return_stats=True)
    torch.testing.assert_close(got, A @ B, rtol=1e-5, atol=1e-4)
    d = stats.devices[0]
    assert d.flops == pytest.approx(7 / 8 * stats.flops)
    assert d.gemms == 2 * 1 + 4 + strips
    assert d.d2h_bytes == 64 * 32 * 4
    assert d.h2d_bytes == (64 * 48 + 48 * 32) * 4


def test_differs_from_the_classical_rounding():
    """Not the classical product in disguise: its rounding differs (same data, fp32)."""
    g = torch.Generator().manual_seed(5)
    A, B = torch.rand(128, 128, generator=g), torch.rand(128, 128, generator=g)
    s = matmul(A, B, devices="cpu", compute="strassen")
    c = matmul(A, B, devices="cpu", compute="fp32")
    assert not torch.equal(s, c)
    torch.testing.assert_close(s, c, rtol=1e-4, atol=1e-4)


def test_bad_input_says_what_to_change():
    A, B = torch.randn(600, 600), torch.randn(600, 600)
    with pytest.raises(OutcoreError, match="raise gpu_memory or use compute='fp32'"):
        matmul(A, B, devices="cpu", compute="strassen", gpu_memory="64KiB")
    with pytest.raises(OutcoreError, match="drop tile="):
        matmul(A, B, devices="cpu", compute="strassen", tile=64)
    with pytest.raises(OutcoreError, match="float32 or float64"):
        matmul(A.bfloat16(), B.bfloat16(), devices="cpu", compute="strassen")


def test_gemms_by_copy_piece(small_quadrants, monkeypatch):
    """Copy pieces of 2 then 4 deep: M1 (and, where PIECEWISE, M2 and M7 with S3's and
    T3's sums) run a GEMM per piece; odd sizes, transposes, K blocks, an old C."""
    from outcore.gemm import strassen_worker
    monkeypatch.setattr(strassen, "PIECE", 4)
    monkeypatch.setattr(strassen, "FIRST_PIECE", 2)
    rng = np.random.default_rng(9)
    for m, n, k, ta, tb, budget in ((37, 29, 41, False, False, None),
                                    (30, 33, 27, True, False, 40 << 10),
                                    (25, 40, 35, False, True, None),
                                    (41, 23, 39, True, True, 32 << 10)):
        a64 = rng.standard_normal((k, m) if ta else (m, k))
        b64 = rng.standard_normal((n, k) if tb else (k, n))
        c0 = rng.standard_normal((m, n))
        gemms = {}
        for piecewise in (False, True):
            monkeypatch.setattr(strassen_worker, "PIECEWISE", piecewise)
            C = torch.from_numpy(c0.copy())
            _, st = matmul(torch.from_numpy(a64), torch.from_numpy(b64), C, transa=ta,
                           transb=tb, alpha=0.75, beta=-1.5, devices="cpu", gpu_memory=budget,
                           compute="strassen", return_stats=True)
            check_normwise(C.numpy(), a64, b64, c0, 0.75, -1.5, "float64", ta, tb)
            gemms[piecewise] = st.devices[0].gemms
        # M1 by pieces either way; M2 and M7 too where PIECEWISE
        assert gemms[True] > gemms[False] > 7 + strassen.STRIPS - 1, gemms


def test_a_linear_layer_under_strassen_matches_torch():
    """gemm.Linear(compute="strassen"): forward, dx and dW (three layouts) against
    torch.nn.Linear on the same weights, in float64."""
    from outcore.gemm import Linear
    g = torch.Generator().manual_seed(4)
    layer = Linear(37, 29, dtype=torch.float64, devices="cpu", compute="strassen")
    ref = torch.nn.Linear(37, 29, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        ref.bias.copy_(layer.bias)
    x = torch.randn(45, 37, dtype=torch.float64, generator=g)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(45, 29, dtype=torch.float64, generator=g)
    (layer(xa) * dy).sum().backward()
    (ref(xb) * dy).sum().backward()
    torch.testing.assert_close(layer(x), ref(x), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad)
