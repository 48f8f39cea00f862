"""DecoderConfig(fused_norm=True): F.rms_norm in place of the fp32 elementwise RMSNorm
gives the same model (fp32: same losses and gradients; bf16: within rounding), and the
streaming engine trains it like plain PyTorch does."""

import copy

import pytest
import torch

import outcore
from outcore.models import decoder


def pair(**kw):
    torch.manual_seed(0)
    ref = decoder("tiny", **kw)
    fused = decoder("tiny", fused_norm=True, **kw)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def batch(vocab=256, rows=3, seq=32):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (rows, seq), generator=g)
    return {"input_ids": x, "labels": x}


def test_same_loss_and_gradients_in_fp32():
    ref, fused = pair()
    b = batch()
    la, lb = ref(**b).loss, fused(**b).loss
    la.backward()
    lb.backward()
    assert lb.item() == pytest.approx(la.item(), rel=1e-6)
    for (n, p), q in zip(ref.named_parameters(), fused.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), n


def test_close_under_bf16_autocast():
    ref, fused = pair()
    b = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        la, lb = ref(**b).loss, fused(**b).loss
    assert lb.float().item() == pytest.approx(la.float().item(), rel=2e-2)
    norm = fused.layers[0].attn_norm
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16      # the activations' dtype, not fp32


def test_engine_trains_the_fused_model_like_pytorch():
    ref, fused = pair()
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
    ref, fused = pair()
    ref(**batch())
    assert calls == []
    fused(**batch())
    assert len(calls) == 2 * fused.cfg.layers + 1
