"""The CPU's band of C's last rows beside the tile workers (gemm/band.py), on the CPU."""

import numpy as np
import pytest
import torch

from outcore.gemm import band as band_mod
from outcore.gemm.band import ALIGN, MIN_ROWS, Band, band_rows, cpu_rate
from outcore.gemm.hostmat import HostMatrix
from outcore.gemm.matmul import execute
from outcore.gemm.plan import make_plan
from outcore.gemm.stats import DeviceStats, GemmStats
from outcore.gemm.worker import GemmJob


def _plan(m, n, k, ta=False, tb=False, tile=8):
    return make_plan(m, n, k, host_dtype=torch.float32, compute="fp32", budget=64 << 10,
                     tile=tile, device_type="cpu", layout=(ta, tb))


def _band(A, B, C, r0, ta=False, tb=False, alpha=1.0, beta=0.0) -> Band:
    """The host's band C[r0:] of the product A, B -> C (the whole product's job made for a
    CPU worker, as matmul makes it for the GPUs)."""
    a, b, c = HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(C, "out")
    m, n = c.shape
    k = b.shape[1] if tb else b.shape[0]
    return Band(GemmJob(_plan(m, n, k, ta, tb), a, b, c, ta, tb, alpha, beta), r0, threads=1)


def test_band_rows_balance_the_predicted_times():
    m = n = k = 16384
    gpu_s, cpu = 0.176, 1.0e12          # fp32-16384 on one H200 and its host's CPU
    rows = band_rows(m, n, k, gpu_s, cpu)
    assert rows % ALIGN == 0 and MIN_ROWS <= rows < m
    cpu_s = 2.0 * rows * n * k / cpu
    gpu_rest = gpu_s * (m - rows) / m
    # the band ends within SAFETY of the GPUs' share, and one ALIGN more would pass it
    assert cpu_s <= band_mod.SAFETY * gpu_rest
    assert 2.0 * (rows + ALIGN) * n * k / cpu > band_mod.SAFETY * gpu_s * (m - rows - ALIGN) / m
    # a faster CPU takes more rows; a CPU too slow for MIN_ROWS takes none
    assert band_rows(m, n, k, gpu_s, 2 * cpu) > rows
    assert band_rows(m, n, k, gpu_s, 1e9) == 0
    assert band_rows(0, n, k, gpu_s, cpu) == 0


def test_cpu_rate_is_probed_once_then_taken_from_the_last_band(monkeypatch):
    monkeypatch.setattr(band_mod, "_SEEN", {})
    r = cpu_rate(torch.float32, 1)
    assert r > 1e8
    assert cpu_rate(torch.float32, 1) == r      # the probe is remembered
    A, B, C = torch.randn(2000, 600), torch.randn(600, 600), torch.zeros(2000, 600)
    st = DeviceStats("cpu")
    _band(A, B, C, 0).run(st)                   # over 0.01 s: timed
    seen = st.flops / (st.t_synced - st.t_ready)
    assert cpu_rate(torch.float32, 1) == pytest.approx(seen)
    assert cpu_rate(torch.float64, 1) != seen   # per dtype


def _ref(A, B, C, ta, tb, alpha, beta):
    a = A.double().T if ta else A.double()
    b = B.double().T if tb else B.double()
    return alpha * a @ b + beta * C.double()


@pytest.mark.parametrize("ta,tb,alpha,beta,band", [
    (False, False, 1.0, 0.0, 16), (True, False, 0.5, 2.0, 23), (False, True, -1.0, 1.0, 40),
    (True, True, 2.0, 0.0, 1)])
def test_tiles_above_and_the_band_below_make_the_whole_product(ta, tb, alpha, beta, band):
    g = torch.Generator().manual_seed(0)
    m, n, k = 61, 37, 45
    A = torch.randn(*((k, m) if ta else (m, k)), generator=g)
    B = torch.randn(*((n, k) if tb else (k, n)), generator=g)
    C = torch.randn(m, n, generator=g)
    C[m - band:] = float("nan") if beta == 0 else C[m - band:]   # beta = 0 never reads C
    want = _ref(A, B, torch.nan_to_num(C), ta, tb, alpha, beta)
    b = _band(A, B, C, m - band, ta, tb, alpha, beta)
    st = GemmStats(m, n, k, "fp32", plan="", devices=[DeviceStats("cpu"), DeviceStats("band")])
    execute(b.job_above(_plan(m - band, n, k, ta, tb)), [torch.device("cpu")], st, band=b)
    torch.testing.assert_close(C.double(), want, rtol=1e-5, atol=1e-4)
    assert st.devices[1].flops == 2.0 * band * n * k
    assert st.devices[0].flops == 2.0 * (m - band) * n * k


def test_the_band_reads_numpy_and_memmaps_and_gives_way_to_numpy_only_views(tmp_path):
    g = np.random.default_rng(1)
    A = g.standard_normal((30, 20)).astype(np.float32)
    B = np.lib.format.open_memmap(tmp_path / "b.npy", mode="w+", dtype=np.float32,
                                  shape=(20, 25))
    B[...] = g.standard_normal((20, 25))
    C = np.zeros((30, 25), np.float32)
    _band(A, B, C, 10).run(DeviceStats("cpu"))
    np.testing.assert_allclose(C[10:], A[10:] @ B, rtol=1e-5, atol=1e-5)
    assert not C[:10].any()            # rows above the band are the devices'
    assert _band(A[::-1], B, C, 10).views() is None   # negative strides: the devices take all


def test_a_failing_band_raises_in_the_caller():
    A, B, C = torch.randn(20, 8), torch.randn(8, 6), torch.zeros(20, 6)
    b = _band(A, B, C, 12)

    def boom(stats, tick=None):
        raise RuntimeError("band failed")
    b.run = boom
    st = GemmStats(20, 6, 8, "fp32", plan="", devices=[DeviceStats("cpu"), DeviceStats("b")])
    with pytest.raises(RuntimeError, match="band failed"):
        execute(b.job_above(_plan(12, 6, 8, tile=4)), [torch.device("cpu")], st, band=b)
    empty = _band(A, B, C, 20)                    # no rows for the host: the devices' job is
    assert empty.job_above(None) is empty.whole   # the whole product's, unchanged
