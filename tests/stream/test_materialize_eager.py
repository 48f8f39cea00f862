"""An eager decoder is built lazily and then filled as the engine fills a lazy one
(meta.materialize): the same weights, drawn on a pool of threads, not twice."""

import torch
from torch import nn

import outcore
from outcore.meta import materialize, meta_parameters
from outcore.models import decoder

from .models import sequential


def tiny(**kw):
    return decoder("tiny", vocab=96, max_seq=64, **kw)


def test_an_eager_decoder_holds_what_the_engine_fills_a_lazy_one_with():
    torch.manual_seed(1)
    eager = tiny()
    assert not any(p.is_meta for p in eager.parameters())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in eager.parameters())
    torch.manual_seed(1)
    engine = outcore.Engine(tiny(lazy=True), device="cpu")
    filled = {n: p.detach() for n, p in engine.model.named_parameters()}
    assert sorted(filled) == sorted(n for n, _ in eager.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.equal(p.detach(), filled[name]), name
    engine.close()


def test_eager_weights_follow_the_seed_and_draw_nothing_from_the_callers_rng():
    torch.manual_seed(4)
    a = tiny()
    after = torch.rand(3)
    torch.manual_seed(4)
    b = tiny()
    assert torch.equal(torch.rand(3), after)   # the caller's RNG is where it was
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    torch.manual_seed(5)
    assert not torch.equal(tiny().embed.weight, a.embed.weight)
    # the decoder's init: norms ones, 2-D weights normal(0, 0.02), wo / w2 scaled down
    assert torch.equal(a.norm.weight, torch.ones_like(a.norm.weight))
    assert abs(a.layers[0].wq.weight.std().item() - 0.02) < 0.002
    scaled = 0.02 / (2 * a.cfg.layers) ** 0.5
    assert abs(a.layers[0].wo.weight.std().item() - scaled) < 0.1 * scaled
    assert not torch.equal(a.layers[0].wq.weight, a.layers[1].wq.weight)


def test_inside_meta_parameters_a_decoder_stays_on_meta():
    """The planner sizes models this way: nothing may be allocated."""
    with meta_parameters():
        m = decoder("7b")
    assert all(p.is_meta for p in m.parameters())


def test_under_a_device_context_torch_builds_it_there():
    with torch.device("meta"):
        m = tiny()
    assert all(p.is_meta for p in m.parameters())
    with torch.device("cpu"):
        m = tiny()
    assert not any(p.is_meta for p in m.parameters())


def test_tied_embeddings_stay_tied():
    torch.manual_seed(2)
    m = tiny(tie_embeddings=True)
    assert m.head.weight is m.embed.weight and not m.embed.weight.is_meta
    assert m.embed.weight.std().item() > 0.01


def test_materialize_fills_other_modules_by_their_reset_parameters_and_keeps_real_ones():
    torch.manual_seed(3)
    with meta_parameters():
        model = sequential()
    real = nn.Linear(3, 3)
    want = real.weight.detach().clone()
    model.append(real)
    params = list(model.parameters())
    assert materialize(model) is model
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]   # same objects
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(real.weight, want)
    bound = 1 / 8 ** 0.5                       # nn.Linear(8, 16)'s kaiming bound
    assert 0.5 * bound < model[0].weight.abs().max().item() <= bound
    torch.manual_seed(3)
    with meta_parameters():
        again = materialize(sequential())
    assert all(torch.equal(x, y) for x, y in zip(again.parameters(), model.parameters()))


def test_materialize_keeps_a_parameters_dtype():
    with meta_parameters():
        m = nn.Linear(4, 4).to(torch.bfloat16)
    materialize(m, init=lambda name, t: t.fill_(0.5))
    assert m.weight.dtype == torch.bfloat16
    assert torch.equal(m.weight, torch.full((4, 4), 0.5, dtype=torch.bfloat16))
