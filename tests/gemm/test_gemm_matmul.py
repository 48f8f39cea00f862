"""outcore.matmul against a float64 reference over random shapes, layouts and options."""

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outcore
from gemm_testlib import as64, check_close, make, rounded
from outcore.gemm.matmul import matmul


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["torch", "numpy"]))
    dtype = draw(st.sampled_from(["float32", "float64"] + (["bfloat16"] if kind == "torch"
                                                            else [])))
    layouts = ["c", "f", "step"] + (["neg"] if kind == "numpy" else [])
    beta = draw(st.sampled_from([0.0, 1.0, -0.75]))
    tile = draw(st.one_of(
        st.none(), st.integers(1, 9),
        st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 4))))
    return dict(
        kind=kind, dtype=dtype, m=draw(st.integers(1, 23)), n=draw(st.integers(1, 23)),
        k=draw(st.integers(1, 29)), transa=draw(st.booleans()), transb=draw(st.booleans()),
        la=draw(st.sampled_from(layouts)), lb=draw(st.sampled_from(layouts)),
        lc=draw(st.sampled_from(["c", "f", "step"])),
        alpha=draw(st.sampled_from([1.0, 2.5, -0.5])), beta=beta,
        with_out=beta != 0 or draw(st.booleans()),
        compute=draw(st.sampled_from([None, "fp64", "fp32", "tf32", "tf32x3", "bf16"])),
        tile=tile, devices=draw(st.sampled_from(["cpu", ["cpu", "cpu"], ["cpu"] * 3])),
        seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_float64_reference(c):
    rng = np.random.default_rng(c["seed"])
    m, n, k = c["m"], c["n"], c["k"]
    sa = (k, m) if c["transa"] else (m, k)
    sb = (n, k) if c["transb"] else (k, n)
    a64 = rounded(rng.standard_normal(sa), c["dtype"])
    b64 = rounded(rng.standard_normal(sb), c["dtype"])
    c0 = rounded(rng.standard_normal((m, n)), c["dtype"])
    A = make(a64, c["kind"], c["dtype"], c["la"])
    B = make(b64, c["kind"], c["dtype"], c["lb"])
    out = make(c0, c["kind"], c["dtype"], c["lc"]) if c["with_out"] else None
    got = matmul(A, B, out, transa=c["transa"], transb=c["transb"], alpha=c["alpha"],
                 beta=c["beta"], devices=c["devices"], tile=c["tile"], compute=c["compute"])
    if out is not None:
        assert got is out
    assert isinstance(got, np.ndarray if c["kind"] == "numpy" else torch.Tensor)
    assert tuple(got.shape) == (m, n)
    compute = c["compute"] or {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16"}[c["dtype"]]
    # the output is rounded to its dtype: the tolerance is the coarser of the two
    order = ["fp64", "fp32", "tf32x3", "tf32", "bf16"]
    stored = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16"}[c["dtype"]]
    tol_compute = max(compute, stored, key=order.index)
    check_close(got, a64, b64, c0, c["alpha"], c["beta"], tol_compute, c["transa"], c["transb"])


def test_bf16_compute_rounds_inputs_and_accumulates_in_fp32():
    """compute="bf16" on fp32 data equals the float64 product of bf16-rounded inputs."""
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(30, 200, generator=g), torch.randn(200, 20, generator=g)
    got = matmul(A, B, devices="cpu", compute="bf16", tile=(8, 8, 64, 16))
    a16, b16 = as64(A.bfloat16()), as64(B.bfloat16())
    check_close(got, a16, b16, None, 1.0, 0.0, "fp32")
    assert (as64(got) - as64(A) @ as64(B)).__abs__().max() > 1e-3   # not fp32 arithmetic


def test_memmap_inputs_and_output(tmp_path):
    rng = np.random.default_rng(1)
    a64, b64, c0 = rng.standard_normal((37, 19)), rng.standard_normal((23, 19)), \
        rng.standard_normal((37, 23))
    paths = [tmp_path / f"{x}.bin" for x in "abc"]
    for p, v in zip(paths, (a64, b64, c0)):
        w = np.memmap(p, dtype=np.float64, mode="w+", shape=v.shape)
        w[:] = v
        w.flush()
        del w
    A = np.memmap(paths[0], dtype=np.float64, mode="r", shape=a64.shape)
    B = np.memmap(paths[1], dtype=np.float64, mode="r", shape=b64.shape)
    C = np.memmap(paths[2], dtype=np.float64, mode="r+", shape=c0.shape)
    got = matmul(A, B, C, transb=True, alpha=0.5, beta=2.0, devices=["cpu", "cpu"], tile=(8, 6))
    assert got is C
    on_disk = np.fromfile(paths[2], dtype=np.float64).reshape(c0.shape)
    check_close(on_disk, a64, b64, c0, 0.5, 2.0, "fp64", transb=True)
    # memmap input, new numpy output
    got = matmul(A, B, transb=True, devices="cpu", gpu_memory="8KiB")
    assert type(got) is np.ndarray
    check_close(got, a64, b64, None, 1.0, 0.0, "fp64", transb=True)


def test_beta_zero_ignores_nan_in_out_and_k_zero():
    A, B = torch.randn(5, 7), torch.randn(7, 4)
    out = torch.full((5, 4), float("nan"))
    matmul(A, B, out, devices="cpu", tile=2)
    assert torch.allclose(out, A @ B, atol=1e-5)
    out = torch.ones(5, 4)
    matmul(torch.zeros(5, 0), torch.zeros(0, 4), out, beta=3.0, devices="cpu")
    assert torch.equal(out, torch.full((5, 4), 3.0))
    assert matmul(torch.zeros(0, 3), torch.zeros(3, 4), devices="cpu").shape == (0, 4)


def test_exported_and_stats_count_every_tile():
    A, B = torch.randn(50, 40), torch.randn(40, 30)
    out, st = outcore.matmul(A, B, devices=["cpu", "cpu"], tile=(8, 8), return_stats=True)
    assert torch.allclose(out, A @ B, atol=1e-4)
    assert sum(d.tiles for d in st.devices) == 7 * 4
    assert st.flops == 2 * 50 * 40 * 30
    assert sum(d.flops for d in st.devices) == st.flops
    # every element of A and B crossed at least once, every C element came back once
    assert st.h2d_bytes >= (50 * 40 + 40 * 30) * 4
    assert st.d2h_bytes == 50 * 30 * 4
    assert "TFLOP/s" in st.summary()
    # the CPU's GEMMs are torch's: none on cuBLASLt's configured kernel, and none said to be
    assert all(d.lt_gemms == 0 for d in st.devices) and "cuBLASLt" not in st.summary()
    assert st.to_dict()["lt_gemms_per_device"] == {d.device: 0 for d in st.devices}


def test_stats_phases_order_the_hosts_share():
    """GemmStats.phases(): the host's stamps come in order and inside the wall time."""
    A, B = torch.randn(96, 64), torch.randn(64, 80)
    _, st = matmul(A, B, devices="cpu", tile=32, return_stats=True)
    ph = st.phases()
    assert 0 < ph["ready_s"] <= ph["issued_s"] <= ph["synced_s"] <= ph["wall_s"]
    assert 0 <= ph["plan_s"] < ph["ready_s"]


def test_stats_count_the_planners_search(monkeypatch):
    """GemmStats.plan_s: the seconds make_plan took, inside the wall time, and named in the
    summary where they count (a search of 50 ms here)."""
    import importlib
    import time

    # the module: `outcore.gemm.matmul` as an attribute is the function it exports
    matmul_mod = importlib.import_module("outcore.gemm.matmul")
    real = matmul_mod.make_plan

    def slow(*args, **kw):
        time.sleep(0.05)
        return real(*args, **kw)
    monkeypatch.setattr(matmul_mod, "make_plan", slow)
    A, B = torch.randn(96, 64), torch.randn(64, 80)
    out, st = matmul(A, B, devices="cpu", tile=32, return_stats=True)
    assert torch.allclose(out, A @ B, atol=1e-4)
    assert 0.05 <= st.plan_s < st.wall_s
    assert st.to_dict()["plan_s"] == st.plan_s
    assert "planning took 0.05 s" in st.summary()
