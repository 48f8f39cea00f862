"""Several steps of outcore equal the same steps of plain PyTorch, for every model family."""

import copy

import pytest
import torch

import outcore

from .models import batch_for, blocks_for, loss_fn_for, make

FAMILIES = ["decoder", "llama", "qwen2", "mistral", "gpt2", "list", "sequential"]
LR, EPS, WD = 3e-3, 1e-6, 0.1


def plain_steps(model, batches, loss_fn, clip):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=WD)
    losses = []
    for b in batches:
        opt.zero_grad()
        if loss_fn is None:
            loss = model(**b).loss
        else:
            loss = loss_fn(model(b["x"] if "x" in b else b["input"]), b)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def model_ref_batches(family, steps=3):
    """(model, its deep copy, batches): the same start for outcore and plain PyTorch."""
    torch.manual_seed(1)
    model = make(family)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    return model, ref, [batch_for(family, gen) for _ in range(steps)]


def assert_params_match(engine, ref):
    """Every parameter tensor within 1e-4 relative of plain PyTorch's."""
    ours = dict(engine.model.named_parameters())
    for name, p in ref.named_parameters():
        assert rel(ours[name].detach(), p.detach()) < 1e-4, name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("micro,clip", [(None, None), (2, 0.05)])
def test_matches_plain_pytorch(family, micro, clip):
    model, ref, batches = model_ref_batches(family)
    want = plain_steps(ref, batches, loss_fn_for(family), clip)
    engine = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                            device="cpu", micro_batch_size=micro, max_grad_norm=clip,
                            blocks=blocks_for(family))
    got = [engine.train_step(b, loss_fn=loss_fn_for(family)) for b in batches]
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-5 * abs(w), (got, want)
    assert_params_match(engine, ref)
    assert engine.step_count == 3
    engine.close()


def test_clipping_is_active_in_the_comparison():
    """The clip threshold used above really changes the result (so the test can fail)."""
    torch.manual_seed(1)
    a, b = make("decoder"), None
    b = copy.deepcopy(a)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for("decoder", gen) for _ in range(2)]
    plain_steps(a, batches, None, 0.05)
    plain_steps(b, batches, None, None)
    diffs = [rel(p, q) for p, q in zip(a.parameters(), b.parameters())]
    assert max(diffs) > 1e-3


def test_tied_weights_stay_tied():
    model = make("gpt2")
    engine = outcore.Engine(model, device="cpu")
    gen = torch.Generator().manual_seed(0)
    engine.train_step(batch_for("gpt2", gen))
    m = engine.model
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
    engine.close()


def test_bf16_compute_trains_close_to_fp32():
    torch.manual_seed(3)
    model = make("decoder")
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(4)
    b = batch_for("decoder", gen)
    want = plain_steps(ref, [b], None, None)[0]
    engine = outcore.Engine(model, device="cpu", compute_dtype=torch.bfloat16)
    got = engine.train_step(b)
    assert abs(got - want) < 0.05 * abs(want)
    assert all(p.dtype == torch.float32 for p in engine.model.parameters())
    engine.close()


@pytest.mark.parametrize("family,groups", [("decoder", [0, 1, 2]), ("gpt2", [0, 1, 2]),
                                           ("decoder", [0, 1, 3])])
def test_device_side_updates_match(family, groups):
    """Groups updated by the device path (m, v streamed) equal torch's AdamW too, whether
    they end backward together or alternate with CPU-updated blocks (order 'interleave')."""
    model, ref, batches = model_ref_batches(family)
    want = plain_steps(ref, batches, None, None)
    engine = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                            device="cpu", micro_batch_size=2, gpu_updates=0)
    engine.updater.enable(groups)
    assert engine.updater.groups == set(groups)
    got = [engine.train_step(b) for b in batches]
    assert got == pytest.approx(want, rel=1e-5)
    assert_params_match(engine, ref)
    engine.close()


@pytest.mark.parametrize("which", ["all", "last3"])
def test_device_side_updates_from_the_top_of_backward_match(which):
    """Three or more device-updated blocks from backward's first block on: the m, v ring of
    two buffers once gave the third block's m, v the buffer still holding the second's
    (the first block's were taken late, at its update): wrong updates on the CPU, NaN on
    the H200."""
    from outcore.models import decoder
    torch.manual_seed(1)
    model = decoder("tiny", vocab=96, max_seq=64, layers=6)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(2)
    batches = [batch_for("decoder", gen) for _ in range(3)]
    want = plain_steps(ref, batches, None, None)
    engine = outcore.Engine(model, optimizer=outcore.AdamW(lr=LR, eps=EPS, weight_decay=WD),
                            device="cpu", gpu_updates=0)
    n = len(engine.groups)
    engine.updater.enable(list(range(n)) if which == "all" else [n - 3, n - 2, n - 1])
    got = [engine.train_step(b) for b in batches]
    assert got == pytest.approx(want, rel=1e-5)
    assert_params_match(engine, ref)
    engine.close()
