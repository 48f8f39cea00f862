"""The decoder's kernel variants give the same model as its eager fp32 elementwise code
(fp32: same losses and gradients; bf16: within rounding), and the streaming engine trains
each like plain PyTorch does:
  fused_norm=True  F.rms_norm in place of the fp32 elementwise RMSNorm;
  compiled=True    the block's elementwise parts through torch.compile (models/kernels.py).
"""

import copy

import pytest
import torch

import outcore
from outcore.models import decoder


VARIANTS = ["fused_norm", "compiled"]


def pair(variant, **kw):
    torch.manual_seed(0)
    ref = decoder("tiny", **kw)
    fused = decoder("tiny", **{variant: True}, **kw)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def batch(vocab=256, rows=3, seq=32):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (rows, seq), generator=g)
    return {"input_ids": x, "labels": x}


@pytest.mark.parametrize("variant", VARIANTS)
def test_same_loss_and_gradients_in_fp32(variant):
    ref, fused = pair(variant)
    b = batch()
    la, lb = ref(**b).loss, fused(**b).loss
    la.backward()
    lb.backward()
    assert lb.item() == pytest.approx(la.item(), rel=1e-6)
    for (n, p), q in zip(ref.named_parameters(), fused.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), n


@pytest.mark.parametrize("variant", VARIANTS)
def test_close_under_bf16_autocast(variant):
    ref, fused = pair(variant)
    b = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        la, lb = ref(**b).loss, fused(**b).loss
    assert lb.float().item() == pytest.approx(la.float().item(), rel=2e-2)
    norm = fused.layers[0].attn_norm
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16      # the activations' dtype, not fp32


def test_compiled_kernels_equal_the_eager_functions_forward_and_backward():
    from outcore.models.kernels import Kernels
    eager, comp = Kernels(False), Kernels(True)
    g = torch.Generator().manual_seed(2)
    x, d = (torch.randn(2, 6, 16, generator=g, requires_grad=True) for _ in range(2))
    w = torch.rand(16, generator=g).requires_grad_(True)
    q = torch.randn(2, 3, 6, 8, generator=g, requires_grad=True)
    cos, sin = torch.randn(1, 1, 6, 8, generator=g), torch.randn(1, 1, 6, 8, generator=g)
    for name, args in [("rms_norm", (x, w, 1e-5)), ("add_rms_norm", (x, d, w, 1e-5)),
                       ("rotate", (q, cos, sin)), ("swiglu", (x, d))]:
        outs = []
        for k in (eager, comp):
            y = getattr(k, name)(*args)
            y = sum(t.square().sum() for t in y) if isinstance(y, tuple) else y.square().sum()
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            outs.append((y.detach(), torch.autograd.grad(y, leaves)))
        (ye, ge), (yc, gc) = outs
        assert torch.allclose(yc, ye, rtol=1e-5), name
        for a, b in zip(gc, ge):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_engine_trains_the_fused_model_like_pytorch(variant):
    ref, fused = pair(variant)
    model = copy.deepcopy(fused)
    opt = torch.optim.AdamW(fused.parameters(), lr=3e-3, eps=1e-6, weight_decay=0.1)
    eng = outcore.Engine(model, optimizer=outcore.AdamW(lr=3e-3, eps=1e-6, weight_decay=0.1),
                         device="cpu")
    for _ in range(2):
        b = batch()
        opt.zero_grad()
        want = fused(**b).loss
        want.backward()
        opt.step()
        assert eng.train_step(b) == pytest.approx(want.item(), rel=1e-5)
    for (n, p), q in zip(fused.named_parameters(), eng.model.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), n
    eng.close()


def test_the_fused_path_is_the_one_taken(monkeypatch):
    import importlib
    dec = importlib.import_module("outcore.models.decoder")   # the module, not the function
    calls = []
    real = dec.F.rms_norm
    monkeypatch.setattr(dec.F, "rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    ref, fused = pair("fused_norm")
    ref(**batch())
    assert calls == []
    fused(**batch())
    assert len(calls) == 2 * fused.cfg.layers + 1


def test_a_compiler_failure_is_one_clear_error(monkeypatch):
    from outcore.errors import OutcoreError
    from outcore.models import kernels

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no C++ compiler found\nlong details")
    monkeypatch.setattr(kernels, "BACKEND", broken_backend)
    k = kernels.Kernels(compiled=True)
    with pytest.raises(OutcoreError, match=r"could not build swiglu \(RuntimeError: no C\+\+ "
                       r"compiler found\).*compiled=False"):
        k.swiglu(torch.randn(3, 4), torch.randn(3, 4))
