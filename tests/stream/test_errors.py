"""Bad input: each a clear one-line OutcoreError."""

import pytest
import torch
from torch import nn

import outcore
from outcore import OutcoreError
from outcore.units import parse_bytes

from .models import make


def one_line(e):
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300
    return msg


def test_batch_missing_what_the_model_needs():
    eng = outcore.Engine(make("sequential"), device="cpu")
    with pytest.raises(OutcoreError) as e:
        eng.train_step({"x": torch.randn(2, 8)}, loss_fn=lambda o, b: o.sum())
    assert "input" in one_line(e)
    eng.close()


def test_a_loss_that_is_not_one_number():
    eng = outcore.Engine(make("sequential"), device="cpu")
    b = {"input": torch.randn(2, 8), "y": torch.randn(2, 3)}
    with pytest.raises(OutcoreError) as e:
        eng.train_step(b, loss_fn=lambda o, b: (o - b["y"]) ** 2)
    assert "(2, 3)" in one_line(e) and ".mean()" in one_line(e)
    with pytest.raises(OutcoreError, match="float"):
        eng.train_step(b, loss_fn=lambda o, b: 1.5)
    # the engine is still usable after the bad calls
    assert eng.train_step(b, loss_fn=lambda o, b: ((o - b["y"]) ** 2).mean()) > 0
    eng.close()


def test_batch_without_labels_and_no_loss_fn():
    eng = outcore.Engine(make("decoder"), device="cpu")
    with pytest.raises(OutcoreError) as e:
        eng.train_step({"input_ids": torch.randint(0, 96, (2, 8))})
    assert "labels" in one_line(e)
    with pytest.raises(OutcoreError):
        eng.train_step({})
    with pytest.raises(OutcoreError):
        eng.train_step({"input_ids": torch.zeros(2, 8, dtype=torch.long),
                        "labels": torch.zeros(3, 8, dtype=torch.long)})
    eng.close()


def test_model_that_cannot_be_split():
    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x)
    with pytest.raises(OutcoreError) as e:
        outcore.Engine(Flat(), device="cpu")
    assert "blocks=" in one_line(e)
    with pytest.raises(OutcoreError) as e:
        outcore.Engine(make("decoder"), device="cpu", blocks="model.nothing")
    assert "nothing" in one_line(e)


@pytest.mark.parametrize("bad", ["16 gigs", "GiB", "-1GiB", "12XB", ""])
def test_gpu_memory_that_does_not_parse(bad):
    with pytest.raises(OutcoreError) as e:
        outcore.Engine(make("decoder"), device="cpu", gpu_memory=bad)
    assert "gpu_memory" in one_line(e)


def test_parse_bytes():
    assert parse_bytes("16GiB") == 16 * 1024**3
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes(4096) == 4096
    assert parse_bytes(None) is None


def test_budget_too_small_for_a_block():
    with pytest.raises(OutcoreError) as e:
        outcore.Engine(outcore.models.decoder("small"), device="cpu", gpu_memory="1MiB")
    assert "does not fit" in one_line(e)


def test_other_bad_arguments():
    for kw in [dict(device="tpu"), dict(micro_batch_size=0), dict(max_grad_norm=-1.0),
               dict(compute_dtype=torch.int8)]:
        with pytest.raises(OutcoreError):
            outcore.Engine(make("decoder"), **kw)
    with pytest.raises(OutcoreError):
        outcore.AdamW(lr=-1)


class _InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p):
        return p.sum() * 0.0

    @staticmethod
    def backward(ctx, g):
        return torch.full((2,), float("inf"))


class _Poisoned(nn.Module):
    """Identity on its input; the gradient of its own parameter is inf."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return x + _InfGrad.apply(self.p)


@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_gradient_in_one_block(skip):
    """Held updates (skip_nonfinite) skip the whole step; otherwise only that block is."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3), _Poisoned())
    before = [p.detach().clone() for p in model.parameters()]
    eng = outcore.Engine(model, device="cpu", skip_nonfinite=skip)
    batch = {"input": torch.randn(4, 8), "y": torch.randint(0, 3, (4,))}
    eng.train_step(batch, loss_fn=lambda o, b: nn.functional.cross_entropy(o, b["y"]))
    after = list(eng.model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert torch.equal(after[-1], before[-1])  # the poisoned block never moves
    changed = [not torch.equal(a, b) for a, b in zip(after[:-1], before[:-1])]
    assert eng.last_step_skipped is skip
    assert (not any(changed)) if skip else all(changed)
    eng.close()
