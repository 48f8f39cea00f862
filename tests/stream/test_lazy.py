"""A model built on the meta device is filled straight into the host state (materialize.py)."""

import copy

import pytest
import torch
from torch import nn

import outcore
from outcore.errors import OutcoreError
from outcore.meta import meta_parameters
from outcore.models import decoder

from .models import batch_for, sequential
from .test_equivalence import EPS, LR, WD, plain_steps, rel


def lazy_tiny():
    return decoder("tiny", vocab=96, max_seq=64, lazy=True)


def weights(engine):
    return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


def test_a_lazy_decoder_holds_no_weights_and_is_filled_by_its_init_param():
    torch.manual_seed(1)
    model = lazy_tiny()
    assert all(p.is_meta for p in model.parameters())
    w = weights(outcore.Engine(model, device="cpu"))
    assert not any(t.is_meta for t in w.values())
    cfg = model.cfg
    for name, t in w.items():
        if t.dim() == 1:                       # the norms' weights
            assert torch.equal(t, torch.ones_like(t)), name
        else:
            want = 0.02 / (2 * cfg.layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) \
                else 0.02
            assert abs(t.std().item() - want) < 0.15 * want, (name, t.std().item(), want)
            assert abs(t.mean().item()) < 0.2 * want, name
    # every tensor drawn on its own: no two layers alike
    assert not torch.equal(w["layers.0.wq.weight"], w["layers.1.wq.weight"])


def test_lazy_weights_follow_the_seed_only_and_leave_the_callers_rng_alone():
    torch.manual_seed(1)
    a = weights(outcore.Engine(lazy_tiny(), device="cpu"))
    after = torch.rand(3)
    torch.manual_seed(1)
    torch.rand(7)                               # the caller's RNG is elsewhere: same weights
    b = weights(outcore.Engine(lazy_tiny(), device="cpu"))
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after)    # construction drew nothing from the caller's RNG
    assert all(torch.equal(a[n], b[n]) for n in a)
    torch.manual_seed(2)
    c = weights(outcore.Engine(lazy_tiny(), device="cpu"))
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_a_lazy_model_trains_like_plain_pytorch_from_the_same_weights():
    torch.manual_seed(1)
    engine = outcore.Engine(lazy_tiny(), device="cpu", micro_batch_size=2,
                            optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD))
    ref = copy.deepcopy(engine.model)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for("decoder", gen, rows=4) for _ in range(3)]
    want = plain_steps(ref, batches, None, None)
    got = [engine.train_step(b) for b in batches]
    assert all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want)), (got, want)
    for n, p in ref.named_parameters():
        assert rel(engine.model.get_parameter(n), p.detach()) < 1e-4, n


def test_modules_without_init_param_are_filled_by_their_reset_parameters():
    torch.manual_seed(3)
    with meta_parameters():
        model = sequential()
    w = weights(outcore.Engine(model, device="cpu"))
    for name, t in w.items():
        fan_in = model.get_parameter(name.replace("bias", "weight")).shape[1]
        bound = 1 / fan_in ** 0.5              # nn.Linear's weights and biases
        assert 0.5 * bound < t.abs().max().item() <= bound, name
    torch.manual_seed(3)
    with meta_parameters():
        again = weights(outcore.Engine(sequential(), device="cpu"))
    assert all(torch.equal(w[n], again[n]) for n in w)


def test_an_init_callable_fills_every_parameter():
    with meta_parameters():
        model = sequential()
    seen = []

    def init(name, t):
        seen.append((name, tuple(t.shape), t.dtype))
        t.fill_(0.5)
    w = weights(outcore.Engine(model, device="cpu", init=init))
    assert sorted(n for n, _, _ in seen) == sorted(w)
    assert all(d == torch.float32 for _, _, d in seen)
    assert all(torch.equal(t, torch.full_like(t, 0.5)) for t in w.values())


def test_load_puts_the_checkpoint_into_a_lazy_model(tmp_path):
    torch.manual_seed(1)
    engine = outcore.Engine(lazy_tiny(), device="cpu")
    b = batch_for("decoder", torch.Generator().manual_seed(2), rows=4)
    engine.train_step(b)
    saved = weights(engine)
    engine.save(tmp_path / "ck")
    torch.manual_seed(5)                        # other initial weights: the checkpoint's win
    loaded = outcore.Engine.load(tmp_path / "ck", lazy_tiny(), device="cpu")
    got = weights(loaded)
    assert all(torch.equal(got[n], saved[n]) for n in saved)
    assert loaded.train_step(b) == pytest.approx(engine.train_step(b), rel=1e-6)


class NoReset(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))

    def forward(self, x):
        return x @ self.w


def test_bad_lazy_models_get_one_line_errors():
    with meta_parameters():
        model = nn.Sequential(nn.Linear(4, 4), NoReset())
    with pytest.raises(OutcoreError, match=r"'1.w' is on the meta device.*Engine\(init=fn\)"):
        outcore.Engine(model, device="cpu")
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with pytest.raises(OutcoreError, match="buffer '1.running_mean' is on the meta device"):
        outcore.Engine(model, device="cpu")
    with pytest.raises(OutcoreError, match="init=.*this model's are real"):
        outcore.Engine(sequential(), device="cpu", init=lambda n, t: None)


def test_a_lazy_model_needs_room_for_its_masters_too(monkeypatch):
    """The host check counts the fp32 masters for a model on the meta device (an eager
    model already holds them): refused in one line before anything is allocated."""
    from outcore import planner
    n = sum(p.numel() for p in lazy_tiny().parameters())
    largest = max(sum(p.numel() for p in b.parameters()) for b in lazy_tiny().layers)
    staged = 4 * largest * min(8, len(lazy_tiny().layers))
    monkeypatch.setattr(planner, "host_available", lambda: 8 * n + staged)
    torch.manual_seed(1)
    outcore.Engine(decoder("tiny", vocab=96, max_seq=64), device="cpu").close()  # fits
    with pytest.raises(OutcoreError, match=r"needs .*\(fp32 masters 4 B/param, AdamW m, v"):
        outcore.Engine(lazy_tiny(), device="cpu")
    monkeypatch.setattr(planner, "host_available", lambda: 12 * n + staged)
    outcore.Engine(lazy_tiny(), device="cpu").close()


def test_a_partly_lazy_model_keeps_its_real_parameters():
    with meta_parameters():
        lazy_part = nn.Linear(16, 16)
    real = nn.Linear(8, 16)
    model = nn.Sequential(real, nn.Tanh(), lazy_part, nn.ReLU(), nn.Linear(16, 3))
    want = real.weight.detach().clone()
    w = weights(outcore.Engine(model, device="cpu", init=lambda n, t: t.fill_(0.25)))
    assert torch.equal(w["0.weight"], want)
    assert torch.equal(w["2.weight"], torch.full((16, 16), 0.25))
