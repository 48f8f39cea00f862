"""The CUDA path: copies on the d2h/h2d streams, pinned host runs, device budget, peak memory.
Runs only with a GPU (the CPU tests cover the same logic through force_copy)."""

import pytest
import torch
from torch import nn

import outcore

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def cnn(c: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Flatten(2), Mean(), nn.Linear(c, 10)).cuda()


class Mean(nn.Module):
    def forward(self, x):
        return x.mean(-1)


@pytest.fixture(autouse=True)
def deterministic():
    old = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old


def data(n=16, hw=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randn(n, 3, hw, hw, device="cuda", generator=g),
            torch.randint(0, 10, (n,), device="cuda", generator=g))


def grads(model, x, y, **swap_kw):
    model.zero_grad(set_to_none=True)
    if swap_kw:
        with outcore.swap(model, **swap_kw) as s:
            nn.functional.cross_entropy(model(x), y).backward()
        torch.cuda.synchronize()
        return [p.grad.clone() for p in model.parameters()], s.report()
    nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()], None


@pytest.mark.parametrize("kw", [dict(min_swap_bytes=1),
                                dict(min_swap_bytes=1, prefetch_bytes=1),
                                dict(min_swap_bytes=1, swap_params=True),
                                dict(gpu_memory="1GiB", min_swap_bytes=1, reserve_bytes=0)])
def test_cuda_gradients_equal_plain(kw):
    x, y = data()
    ref, _ = grads(cnn(), x, y)
    again, _ = grads(cnn(), x, y)
    assert all(torch.equal(a, b) for a, b in zip(ref, again)), "plain CUDA run not deterministic"
    got, rep = grads(cnn(), x, y, **kw)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    if "gpu_memory" not in kw:
        assert rep.offloaded_tensors > 0 and rep.bytes_to_device == rep.bytes_to_host
        assert rep.copy_s > 0 and 0 <= rep.hidden_fraction <= 1


def test_cuda_autocast_bf16_equal_plain():
    x, y = data()
    outs = []
    for kw in (None, dict(min_swap_bytes=1)):
        model = cnn()
        ctx = outcore.swap(model, **kw) if kw else None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if ctx:
            ctx.close()
        outs.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def deep(c: int = 64, n: int = 8) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, c, 3, stride=2, padding=1)]
    for _ in range(n):
        layers += [nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(2), Mean(), nn.Linear(c, 10)).cuda()


def test_cuda_swapping_lowers_peak_memory():
    x, y = data(32, 96)
    peaks = []
    for kw in (None, dict(min_swap_bytes="1MiB", prefetch_bytes="40MiB")):
        model = deep()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads(model, x, y, **(kw or {}))
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del model
    assert peaks[1] < 0.6 * peaks[0]


def test_cuda_budget_keeps_what_fits():
    x, y = data(32, 96)
    model = cnn(64)
    with outcore.swap(model, gpu_memory="64GiB") as s:
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
    assert s.report().offloaded_tensors == 0 and s.report().kept_tensors > 0
    free = torch.cuda.memory_allocated() + 300 * 2**20
    with outcore.swap(model, gpu_memory=free, reserve_bytes=0, prefetch_bytes="64MiB") as s:
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
    r = s.report()
    assert r.offloaded_tensors > 0 and r.kept_tensors > 0 and r.prefetched_tensors > 0


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),            # foreach on CUDA
    lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)])
def test_cuda_parameter_swapping_over_optimizer_steps(make_opt):
    x, y = data()
    plain, swapped = cnn(), cnn()
    opts = make_opt(plain.parameters()), make_opt(swapped.parameters())
    s = outcore.swap(swapped, min_swap_bytes=1, swap_params=True)
    for _ in range(3):
        for m, opt in zip((plain, swapped), opts):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    s.close()
    for a, b in zip(plain.state_dict().values(), swapped.state_dict().values()):
        assert torch.equal(a, b)
    nbytes = sum(p.numel() * p.element_size() for p in swapped.parameters())
    assert s.report().param_bytes_to_host == 3 * nbytes   # every step changed them


class _Checkpointed(nn.Module):
    """An MLP trunk under non-reentrant activation checkpointing, a head after it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
        self.head = nn.Linear(256, 8)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return self.head(checkpoint(self.trunk, x, use_reentrant=False))


def _transformer() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)


@pytest.mark.parametrize("make", [_Checkpointed, _transformer])
def test_cuda_parameter_swapping_of_checkpointed_and_attention_models(make):
    """Session 42's swap_params cases on the streams: a recomputation inside backward keeps
    the weights it fetched, nn.MultiheadAttention moves with its out_proj."""
    x = torch.randn(16, 12, 256 if make is _Checkpointed else 128, device="cuda")
    plain, swapped = make().cuda(), make().cuda()
    plain(x).square().sum().backward()
    with outcore.swap(swapped, min_swap_bytes=1, swap_params=True) as s:
        swapped(x).square().sum().backward()
    torch.cuda.synchronize()
    for (n, a), b in zip(plain.named_parameters(), swapped.parameters()):
        # (attention's fused backward may add in another order from run to run)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=n)
    assert s.report().param_bytes_to_host > 0


def _segment_of(t: torch.Tensor) -> dict:
    for seg in torch.cuda.memory._snapshot()["segments"]:
        if seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"]:
            return seg
    raise AssertionError("no allocator segment holds the tensor")


def test_expandable_segments_while_open_and_not_after(monkeypatch):
    """swap/allocator.py on the real allocator: a segment made while a swap is open is
    expandable, one made after it closed is not, and training under it matches."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    model, x, y = cnn(), *data()
    with outcore.swap(model, gpu_memory="64GiB") as s:
        assert s.segments.held
        big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
        assert _segment_of(big)["is_expandable"] is True
        del big
        nn.functional.cross_entropy(model(x), y).backward()
    torch.cuda.empty_cache()
    after = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    assert _segment_of(after)["is_expandable"] is False
