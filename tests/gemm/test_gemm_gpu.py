"""GPU checks (skipped without CUDA): direct 2-D DMA, staging, conversion, several GPUs,
the prologue schedule and the cuBLASXt baseline, all against float64."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from gemm_testlib import check_close

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from outcore.gemm import band as band_mod, cudacopy  # noqa: E402
from outcore.gemm.cublasxt import CublasXt  # noqa: E402
from outcore.gemm.hostmat import HostMatrix  # noqa: E402
from outcore.gemm.matmul import execute, matmul  # noqa: E402
from outcore.gemm.plan import make_plan  # noqa: E402
from outcore.gemm.stats import DeviceStats, GemmStats  # noqa: E402
from outcore.gemm.worker import GemmJob  # noqa: E402
from outcore.memory import pin_, unpin_  # noqa: E402


_PINNED: list[torch.Tensor] = []   # what _data pinned, unregistered after each test


@pytest.fixture(autouse=True)
def _unpin_after():
    """A matrix of 4 MiB or more is registered in place; freed while still registered, its
    addresses make a later registration in this process fail ('already mapped')."""
    yield
    while _PINNED:
        unpin_(_PINNED.pop())


def _data(m, n, k, pinned, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    A, B, C = (torch.randn(*s, generator=g).to(dtype) for s in ((m, k), (k, n), (m, n)))
    if pinned:   # pin_ returns a pinned copy of a small tensor: use what it returns
        A, B, C = (pin_(x) for x in (A, B, C))
        _PINNED.extend((A, B, C))
    return A, B, C


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("compute", ["fp32", "tf32", "tf32x3", "bf16", "fp64"])
def test_gpu_matches_float64(pinned, compute):
    A, B, C = _data(1000, 700, 900, pinned)
    C0 = C.clone()
    matmul(A, B, C, alpha=0.5, beta=2.0, devices=0, compute=compute, tile=(256, 192))
    check_close(C, A.double().numpy(), B.double().numpy(), C0.double().numpy(), 0.5, 2.0,
                {"tf32": "bf16", "tf32x3": "fp32", "fp64": "fp32"}.get(compute, compute))
    if pinned:
        assert cudacopy.available() is True   # strided tiles of pinned matrices: 2-D DMA
        for x in (A, B, C):
            unpin_(x)


def test_gpu_transposes_strides_and_cache_limit():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(900, 1400, generator=g)[:, ::2]          # strided: staged
    B = pin_(torch.randn(800, 700, generator=g))             # pinned, used transposed
    out, st = matmul(A, B, transb=True, devices=0, gpu_memory="6MiB", tile=256,
                     return_stats=True)
    check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32",
                transb=True)
    assert st.devices[0].device_bytes <= 6 << 20
    unpin_(B)


def test_prologue_schedule_on_the_gpu():
    A, B, C = _data(1024, 768, 2048, True)
    plan = make_plan(1024, 768, 2048, host_dtype=torch.float32, compute="bf16", budget=1 << 30,
                     tile=(256, 256, 2048, 256))
    plan = replace(plan, prologue=3, n_acc=plan.n_tiles)
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(C, "C"), False,
                  False, 1.0, 0.0)
    st = GemmStats(1024, 768, 2048, "bf16", "", devices=[DeviceStats("cuda:0")])
    execute(job, [torch.device("cuda", 0)], st)
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "bf16")
    assert st.devices[0].block_misses == plan.mt + plan.nt


@pytest.mark.parametrize("pinned", [True, False])
def test_b_rows_on_the_gpu(pinned):
    """A transposed B's panels whole by rows too (plan.b_rows), with A's (the NT shape of
    a Linear layer's forward in bf16), against float64."""
    A, _, _ = _data(2048, 1536, 3072, pinned)          # A: 2048 x 3072
    Bt = torch.randn(1536, 3072, generator=torch.Generator().manual_seed(1))
    if pinned:                                        # stored N x K: op(B) = Bt.T
        Bt = pin_(Bt)
        _PINNED.append(Bt)
    plan = make_plan(2048, 1536, 3072, host_dtype=torch.float32, compute="bf16",
                     budget=1 << 30, tile=(1024, 512, 3072, 512), layout=(False, True))
    plan = replace(plan, a_rows=True, b_rows=True)
    out = torch.empty(2048, 1536)
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(Bt, "B"), HostMatrix(out, "C"),
                  False, True, 1.0, 0.0)
    st = GemmStats(2048, 1536, 3072, "bf16", "", devices=[DeviceStats("cuda:0")])
    execute(job, [torch.device("cuda", 0)], st)
    check_close(out, A.double().numpy(), Bt.double().numpy(), None, 1.0, 0.0, "bf16",
                transb=True)


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("compute", ["bf16", "fp32"])
def test_a_rows_on_the_gpu(pinned, compute):
    """A's panels whole in chunks of rows (plan.a_rows): converted through the landing
    buffers (bf16) or copied straight (fp32), from pinned and from pageable host memory,
    the last tile's strips with blocks of their own rows."""
    A, B, C = _data(3072, 768, 2048, pinned)
    plan = make_plan(3072, 768, 2048, host_dtype=torch.float32, compute=compute,
                     budget=1 << 30, tile=(1024, 768, 2048, 256))
    plan = replace(plan, a_rows=True)
    assert plan.strips == 2 and plan.row_chunk(2048) == 128
    job = GemmJob(plan, HostMatrix(A, "A"), HostMatrix(B, "B"), HostMatrix(C, "C"), False,
                  False, 1.0, 0.0)
    st = GemmStats(3072, 768, 2048, compute, "", devices=[DeviceStats("cuda:0")])
    execute(job, [torch.device("cuda", 0)], st)
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, compute)
    assert st.devices[0].h2d_bytes == (3072 + 768) * 2048 * 4


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_share_the_tiles():
    A, B, C = _data(2048, 2048, 512, True)
    _, st = matmul(A, B, C, devices=[0, 1], tile=256, return_stats=True)
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
    assert all(d.tiles > 0 for d in st.devices)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_strassen_on_two_gpus_splits_the_super_tiles():
    """compute="strassen" on two GPUs: a super-tile each (odd sizes, beta), both GPUs'
    results within a few times cuBLAS's fp32 error of the whole product."""
    A, B, C = _data(2049, 1537, 1031, True)
    C0 = C.clone()
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = A.double() @ B.double() + 0.5 * C0.double()
    worst = ((A.cuda() @ B.cuda() + 0.5 * C0.cuda()).cpu().double() - ref).abs().max().item()
    _, st = matmul(A, B, C, beta=0.5, devices=[0, 1], compute="strassen", return_stats=True)
    assert st.plan.startswith("strassen") and all(d.tiles > 0 for d in st.devices), st.plan
    assert (C.double() - ref).abs().max().item() <= 6 * worst


@pytest.mark.parametrize("transa", [False, True])
def test_the_cpu_beside_a_gpu_takes_a_band_of_rows(transa, monkeypatch):
    # the band's size follows the host's measured rate, which moves with the machine's
    # load (session 15: no band at all for the second case once the first one's band had
    # run slowly); a fixed rate makes the split, not the correctness, deterministic here
    monkeypatch.setattr(band_mod, "_SEEN", {(torch.float32, band_mod.band_threads(1)): 5e12})
    g = torch.Generator().manual_seed(3)
    m = n = k = 8192
    A = torch.randn(k, m, generator=g).T if transa else torch.randn(m, k, generator=g)
    B, C = torch.randn(k, n, generator=g), torch.randn(m, n, generator=g)
    C0 = C.clone()
    _, st = matmul(A, B, C, alpha=0.5, beta=2.0, devices="0,cpu", return_stats=True)
    gpu, cpu = st.devices
    assert cpu.device == "cpu" and cpu.flops > 0 and gpu.flops + cpu.flops == st.flops
    assert "the CPU: C's last" in st.plan
    band = int(cpu.flops / (2 * n * k))
    for r in (slice(0, 64), slice(m - band - 32, m - band + 32), slice(m - 64, m)):
        check_close(C[r], A[r].double().numpy(), B.double().numpy(), C0[r].double().numpy(),
                    0.5, 2.0, "fp32")
    # bf16 on the host would be emulated far below the GPU's rate: the GPU takes it all
    out, st = matmul(A[:512], B[:, :512], devices="0,cpu", compute="bf16", return_stats=True)
    assert st.devices[1].flops == 0 and "the CPU sits out" in st.plan
    check_close(out, A[:512].double().numpy(), B[:, :512].double().numpy(), None, 1.0, 0.0,
                "bf16")


def test_the_cpu_band_beside_a_gpu_on_a_product_out_of_core(monkeypatch):
    """A product the GPU's plan cannot hold whole has no estimate (est_seconds None): sizing
    the CPU's band from it crashed (session 43's review); fp64 on float32 data keeps the
    CPU out (its band multiplied in fp32)."""
    monkeypatch.setattr(band_mod, "_SEEN", {(torch.float32, band_mod.band_threads(1)): 5e12})
    n = 8192   # A and B 256 MiB each, against 256 MiB
    A, B, C = _data(n, n, n, pinned=False, seed=5)
    C0 = C.clone()
    _, st = matmul(A, B, C, beta=1.0, devices="0,cpu", gpu_memory="256MiB", return_stats=True)
    gpu, cpu = st.devices
    assert cpu.flops > 0 and gpu.flops > 0 and gpu.flops + cpu.flops == st.flops
    for r in (slice(0, 64), slice(n - 64, n)):
        check_close(C[r], A[r].double().numpy(), B.double().numpy(), C0[r].double().numpy(),
                    1.0, 1.0, "fp32")
    out, st = matmul(A[:512], B, devices="0,cpu", compute="fp64", return_stats=True)
    assert st.devices[1].flops == 0 and "fp64 on the host needs float64 data" in st.plan
    # fp64 arithmetic rounded once into float32 C: half an ulp of each entry, nothing more
    # (an fp32 product's error is ~100x that here: sums 8192 deep)
    want = A[:512].double() @ B.double()
    rel = ((out.double() - want).abs() / want.abs().clamp_min(1e-30)).max().item()
    assert rel <= 2.0 ** -24 * 1.01, rel


def test_numpy_memmap_on_the_gpu(tmp_path):
    rng = np.random.default_rng(2)
    a = np.memmap(tmp_path / "a", dtype=np.float64, mode="w+", shape=(300, 200))
    a[:] = rng.standard_normal(a.shape)
    b = rng.standard_normal((200, 100))
    got = matmul(a, b, devices=0, tile=64)
    check_close(got, np.asarray(a), b, None, 1.0, 0.0, "fp64")


@pytest.mark.parametrize("transa,transb", [(False, False), (False, True), (True, False)])
def test_cublasxt_baseline(transa, transb):
    g = torch.Generator().manual_seed(3)
    A = pin_(torch.randn(*((300, 500) if transa else (500, 300)), generator=g))
    B = pin_(torch.randn(*((400, 300) if transb else (300, 400)), generator=g))
    C = pin_(torch.zeros(500, 400))
    with CublasXt([0], block_dim=256) as xt:
        xt.gemm(A, B, C, transa=transa, transb=transb)
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32",
                transa, transb)
    for x in (A, B, C):
        unpin_(x)


def test_peak_reserved_memory_stays_within_gpu_memory():
    """gpu_memory bounds what the allocator reserves during the product (the plan's buffers
    and the cuBLAS workspaces beside them): gemm_linear's 8 GiB run reserved 8.63 GB."""
    A, B, C = _data(8192, 8192, 8192, pinned=True)   # 256 MiB each: registered in place
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    budget = 1 << 30
    matmul(A, B, C, devices=0, compute="fp32", gpu_memory=budget)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_reserved() - base <= budget


def test_a_linear_layers_three_products_stay_within_gpu_memory():
    """gemm.Linear's step is three products with three plans (NT, NN, TN). Allocated buffer
    by buffer, their sizes left cached segments the next plan could not reuse: the 8 GiB
    run of bench/gemm_linear.py reserved 8.63 GB (7.68 GB allocated). One arena per
    product (gemm/arena.py) keeps the reserved peak within the budget."""
    from outcore.gemm import Linear
    torch.manual_seed(0)
    budget = 256 << 20
    layer = Linear(4096, 4096, gpu_memory=budget, devices=0)   # 64 MiB weight
    x = torch.randn(3000, 4096, requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    for _ in range(2):
        layer(x).square().mean().backward()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_reserved() - base <= budget
    ref = torch.nn.functional.linear(x.detach(), layer.weight.detach(), layer.bias.detach())
    torch.testing.assert_close(layer(x).detach(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_the_cublaslt_fp32_path_matches_float64(ta, tb):
    """ltmm.addmm on slices like the worker's (transposed blocks, a piece of the depth):
    used on the GPUs it was measured on, exact to fp32 against float64, beta 0 and 1."""
    from outcore.gemm import ltmm
    g = torch.Generator().manual_seed(3)
    m, n, k, kk = 640, 768, 1024, 512
    a = torch.randn(k, m, generator=g).t() if ta else torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g).t() if tb else torch.randn(k, n, generator=g)
    c0 = torch.randn(m, n, generator=g)
    a_d, b_d = a.cuda(), b.cuda()              # .cuda() keeps the transposed strides
    acc = torch.full((m, n), float("nan"), device="cuda")
    before = ltmm.calls
    expect = ltmm.ENABLED and torch.cuda.get_device_capability() in ltmm.CAPABILITIES \
        and not tb                             # b column-contiguous: cuBLAS's own pick
    assert torch.get_float32_matmul_precision() == "highest"
    ran0 = ltmm.addmm(acc, a_d[:, :kk], b_d[:kk], 0.5, 0.0)     # NaN in acc is not read
    if not ran0:
        acc.zero_().addmm_(a_d[:, :kk], b_d[:kk], alpha=0.5)
    acc1 = c0.cuda()
    ran1 = ltmm.addmm(acc1, a_d[:, kk:], b_d[kk:], 1.0, 1.0)
    if not ran1:
        acc1.addmm_(a_d[:, kk:], b_d[kk:])
    assert ran0 == ran1 == expect and ltmm.calls == before + 2 * expect
    a64, b64 = a.double(), b.double()
    for got, ref in ((acc, 0.5 * a64[:, :kk] @ b64[:kk]),
                     (acc1, c0.double() + a64[:, kk:] @ b64[kk:])):
        err = (got.cpu().double() - ref).abs().max() / ref.abs().max()
        assert err < 2e-6, err


def test_outcore_fp32_products_take_the_cublaslt_path_where_measured():
    from outcore.gemm import ltmm
    A, B, C = _data(1024, 1280, 1536, pinned=False)
    before = ltmm.calls
    _, stats = matmul(A, B, C, devices=0, compute="fp32", tile=(512, 640), return_stats=True)
    check_close(C, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")
    used = ltmm.calls - before
    assert stats.devices[0].lt_gemms == used
    if ltmm.ENABLED and torch.cuda.get_device_capability() in ltmm.CAPABILITIES:
        assert used == stats.devices[0].gemms > 0 and "configured kernel" in stats.summary()
    else:
        assert used == 0
    matmul(A, B, C, devices=0, compute="tf32", tile=(512, 640))   # TF32: cuBLAS's own pick
    assert ltmm.calls - before == used


@pytest.mark.parametrize("light", [True, False])
def test_lanes_on_switches_the_current_stream_and_back(light):
    """Lanes.on makes its stream current for the enclosed work (nested too) and puts the
    one before back, by set_stream (light, the gemm worker's) or torch's context."""
    from outcore import transfer
    L = transfer.Lanes(torch.device("cuda", 0), light=light)
    before = torch.cuda.current_stream()
    with L.on(L.h2d):
        assert torch.cuda.current_stream() == L.h2d
        x = torch.ones(1 << 20, device="cuda")   # enqueued on h2d
        with L.on(L.d2h):
            assert torch.cuda.current_stream() == L.d2h
        assert torch.cuda.current_stream() == L.h2d
    assert torch.cuda.current_stream() == before
    L.h2d.synchronize()
    assert float(x.sum()) == float(1 << 20)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_tf32x3_is_near_the_fp32_gemms_error_where_tf32_is_far(ta, tb):
    """Against float64: compute="tf32x3" through outcore within a few times the error of
    cuBLAS's fp32 GEMM of the whole product in memory (torch.mm; 0.6-2.9x for this
    product in session 25's x3-shapes-h200.json with split.BIG_CHUNK 1024; 512 since),
    where tf32 is far coarser; K 4096-deep blocks and a budget that evicts, so blocks are
    split again as they come back."""
    g = torch.Generator().manual_seed(7)
    m, n, k = 1024, 768, 16384
    A = pin_(torch.rand(*((k, m) if ta else (m, k)), generator=g) * 2 - 1)
    B = pin_(torch.rand(*((n, k) if tb else (k, n)), generator=g) * 2 - 1)
    _PINNED.extend((A, B))
    a, b = A.cuda(), B.cuda()
    oa, ob = (a.t() if ta else a), (b.t() if tb else b)
    ref, scale = oa.double() @ ob.double(), oa.double().abs() @ ob.double().abs()

    def rel(out) -> float:
        return ((out.cuda().double() - ref).abs() / scale).max().item()
    torch.backends.cuda.matmul.allow_tf32 = False
    err = {"sgemm": rel(oa @ ob)}
    for compute in ("fp32", "tf32", "tf32x3"):
        out, st = matmul(A, B, transa=ta, transb=tb, devices=0, compute=compute,
                         gpu_memory="96MiB", tile=(512, 512, 4096), return_stats=True)
        err[compute] = rel(out)
    assert st.devices[0].block_misses > 4 * (2 + 2), st.devices[0]   # blocks loaded again
    assert err["tf32x3"] <= 4 * err["sgemm"], err
    assert err["tf32"] > 30 * err["tf32x3"], err


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_host_paths_of_session_27_give_the_same_bits_as_the_old_ones(compute, monkeypatch):
    """Streams kept per device and the arena's snapshot skipped after its predecessor
    (session 27) against new streams and a snapshot every product: the same plan runs the
    same GEMMs, so the products agree bit for bit, and match float64. The second product
    in a row asks no snapshot."""
    from outcore.gemm import arena, worker
    A, B, C = _data(1500, 1100, 1300, True)
    kw = dict(devices=0, compute=compute, tile=(512, 384))
    new = matmul(A, B, C, **kw).clone()
    snaps = []
    real = arena.largest_free_block
    monkeypatch.setattr(arena, "largest_free_block", lambda d: snaps.append(d) or real(d))
    again = matmul(A, B, C, **kw).clone()            # the kept streams, a second time
    assert snaps == []
    monkeypatch.setattr(worker, "REUSE_STREAMS", False)
    monkeypatch.setattr(arena, "SKIP_SNAPSHOT", False)
    old = matmul(A, B, C, **kw)
    assert torch.equal(new, old) and torch.equal(new, again)
    check_close(new, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, compute)


def test_two_threads_share_a_devices_kept_streams():
    """Two products on one GPU at once (worker.REUSE_STREAMS: the same copy streams),
    each right against float64."""
    import threading
    runs = [_data(900, 700, 800, True, seed=s) for s in (1, 2)]
    outs: list = [None, None]

    def one(i):
        A, B, C = runs[i]
        outs[i] = matmul(A, B, C, devices=0, compute="fp32", tile=(256, 256))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (A, B, _), out in zip(runs, outs):
        check_close(out, A.double().numpy(), B.double().numpy(), None, 1.0, 0.0, "fp32")


@pytest.mark.parametrize("piecewise", [False, True])
@pytest.mark.parametrize("ta,tb,pinned", [(False, False, True), (True, False, False),
                                          (False, True, True), (True, True, False)])
def test_strassen_on_the_gpu_is_near_the_fp32_gemms_error(ta, tb, pinned, piecewise,
                                                          monkeypatch):
    """compute="strassen" on the GPU (odd sizes, transposes, pinned and pageable, alpha and
    beta): its largest error against float64 within a few times that of cuBLAS's fp32 GEMM
    of the whole product (one level: about 2-3x); with a budget that cuts it into
    super-tiles and K blocks, the same within the budget's reserved peak. M2 and M7 whole
    and by copy pieces (strassen_worker.PIECEWISE), pieces of 512 after a first of 256, C12
    in strips."""
    from outcore.gemm import strassen, strassen_worker
    monkeypatch.setattr(strassen_worker, "PIECEWISE", piecewise)
    monkeypatch.setattr(strassen, "PIECE", 512)
    monkeypatch.setattr(strassen, "FIRST_PIECE", 256)
    monkeypatch.setattr(strassen, "STRIP_MIN", 1 << 18)   # C12 in strips here too
    g = torch.Generator().manual_seed(11)
    m, n, k = 3001, 2047, 2561
    A = torch.rand(*((k, m) if ta else (m, k)), generator=g) * 2 - 1
    B = torch.rand(*((n, k) if tb else (k, n)), generator=g) * 2 - 1
    C0 = torch.rand(m, n, generator=g) * 2 - 1
    if pinned:
        A, B = pin_(A), pin_(B)
        _PINNED.extend((A, B))
    a, b = A.cuda(), B.cuda()
    oa, ob = (a.t() if ta else a), (b.t() if tb else b)
    ref = 0.5 * (oa.double() @ ob.double()) + 2.0 * C0.cuda().double()
    torch.backends.cuda.matmul.allow_tf32 = False
    sgemm = (0.5 * (oa @ ob) + 2.0 * C0.cuda()).double()
    worst = (sgemm - ref).abs().max().item()
    for budget, pieces in ((None, 1), (48 << 20, 2)):
        C = C0.clone()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_reserved()
        _, st = matmul(A, B, C, transa=ta, transb=tb, alpha=0.5, beta=2.0, devices=0,
                       compute="strassen", gpu_memory=budget, return_stats=True)
        torch.cuda.synchronize()
        if budget is not None:
            assert torch.cuda.max_memory_reserved() - base <= budget
        assert st.devices[0].tiles >= pieces and st.plan.startswith("strassen"), st.plan
        err = (C.cuda().double() - ref).abs().max().item()
        assert err <= 6 * worst, (err, worst, st.plan)
