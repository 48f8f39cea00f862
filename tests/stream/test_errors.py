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
