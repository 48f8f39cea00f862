"""Session 43's review of the gemm internals: the CPU's band beside GPUs (band.py), run on
the CPU by faking the device list (the GPUs' tiles then run on CPU workers)."""

import importlib

import pytest
import torch

from outcore.gemm import band as band_mod
from outcore.gemm.plan import make_plan

mm = importlib.import_module("outcore.gemm.matmul")   # the module, not the function


@pytest.fixture
def gpu_and_cpu(monkeypatch):
    """devices="0,cpu" without a GPU: matmul plans for cuda:0 plus the CPU's band, and
    execute() runs the GPU's job on a CPU worker (the band runs as it would). Returns a
    function setting the GPU's budget; its dict gets the band matmul ran ("band")."""
    seen = {}
    real = mm.execute

    def on_cpu(job, devices, stats, progress=False, **kw):
        seen["band"] = kw.get("band")
        real(job, [torch.device("cpu")] * len(devices), stats, progress, **kw)
    monkeypatch.setattr(mm, "resolve_devices", lambda d: [torch.device("cuda", 0),
                                                          torch.device("cpu")])
    monkeypatch.setattr(mm, "execute", on_cpu)
    # a fast host (no rate probe): the band is sized large
    threads = band_mod.band_threads(1)
    monkeypatch.setattr(band_mod, "_SEEN", {(dt, threads): 1e15 for dt in
                                            (torch.float32, torch.float64)})

    def budget(nbytes):
        monkeypatch.setattr(mm, "resolve_budget", lambda g, d: nbytes)
        return seen
    return budget


def test_cpu_beside_a_gpu_on_a_product_the_gpu_cannot_hold(gpu_and_cpu):
    """The out-of-core case: the lone GPU's plan does not cache everything, so the planner
    gives it no time estimate (est_seconds None); sizing the band divided None by the GPU
    count (TypeError) before any work."""
    budget = 256 << 10
    seen = gpu_and_cpu(budget)
    m = n = k = 256
    assert make_plan(m, n, k, host_dtype=torch.float32, compute="fp32", budget=budget,
                     device_type="cuda").est_seconds is None
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    C0 = torch.randn(m, n, generator=g)
    out = C0.clone()
    _, st = mm.matmul(A, B, out, alpha=0.5, beta=2.0, devices="0,cpu", return_stats=True)
    want = 0.5 * A.double() @ B.double() + 2.0 * C0.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
    assert seen["band"] is not None and st.devices[-1].flops > 0   # the CPU took rows


def test_fp64_compute_on_fp32_data_stays_fp64_in_the_cpu_band(gpu_and_cpu):
    """compute="fp64" on float32 matrices: the GPUs multiply in fp64 and round once into C;
    the band multiplied in C's dtype, fp32, and its rows came out 8x less exact (one-signed
    sums 4096 deep: 4.6e-7 relative against 6e-8)."""
    gpu_and_cpu(1 << 30)
    g = torch.Generator().manual_seed(0)
    A, B = torch.rand(256, 4096, generator=g), torch.rand(4096, 16, generator=g)
    out, st = mm.matmul(A, B, devices="0,cpu", compute="fp64", return_stats=True)
    want = A.double() @ B.double()
    rel = ((out.double() - want).abs() / want.abs()).max().item()
    assert rel <= 2.0 ** -24 * 1.01, rel      # C's own rounding, nothing more
    assert "the CPU sits out (fp64 on the host needs float64 data)" in st.plan


def test_tf32x3_limit_as_documented():
    """split.py's docstring: values within 0.03% of fp32's largest and infinities come out
    NaN under tf32x3 (hi rounds to infinity); fp32 gives the finite product. If this
    starts to fail, the limit is gone: update split.py's docstring and the README."""
    import numpy as np
    from outcore.gemm.matmul import matmul
    A = torch.tensor([[3.4025e38, 1.0]])
    B = torch.tensor([[1e-10], [2.0]])
    assert torch.isfinite(matmul(A, B, devices="cpu", compute="fp32")).all()
    assert torch.isnan(matmul(A, B, devices="cpu", compute="tf32x3")).all()
    small = np.float32(3.0e38)   # below the rounding edge: fine
    got = matmul(torch.tensor([[small, 1.0]]), B, devices="cpu", compute="tf32x3")
    assert torch.isfinite(got).all()


def test_the_cpu_listed_twice_beside_a_gpu_is_refused(monkeypatch):
    """Beside GPUs the CPU is one band on every free core: "0,cpu,cpu" used to run as
    "0,cpu" without a word; it is now a one-line error saying to list the CPU once."""
    monkeypatch.setattr(mm, "resolve_devices", lambda d: [torch.device("cuda", 0),
                                                          torch.device("cpu"),
                                                          torch.device("cpu")])
    A, B = torch.ones(8, 8), torch.ones(8, 8)
    with pytest.raises(ValueError, match=r"lists the CPU 2 times beside GPUs: list 'cpu' once"):
        mm.matmul(A, B, devices="0,cpu,cpu")
