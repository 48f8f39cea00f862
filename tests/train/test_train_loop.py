"""The loop's knobs: NaN/inf skipping, gradient accumulation, logs, keep-last."""

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from outcore import train
from outcore.config import TrainConfig
from outcore.errors import OutcoreError


@pytest.fixture
def corpus(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("".join(f"sample {i}: lorem ipsum dolor {i % 7}\n" for i in range(200)))
    return f


def _cfg(tmp_path, corpus, **kw):
    base = dict(model="tiny", data=str(corpus), seq_len=32, batch_size=4, max_steps=4,
                warmup_steps=1, output_dir=str(tmp_path / "run"), tensorboard=False,
                device="cpu", generate_tokens=0)
    return TrainConfig(**{**base, **kw})


def _poison(bad_steps, how="loss"):
    """loss_fn making the loss (or only its gradient) non-finite on the given 1-based steps."""
    calls = []

    def loss_fn(out, batch):
        calls.append(1)  # one call per step: the engine splits micro-batches inside blocks
        loss = out.loss
        if len(calls) in bad_steps:
            if how == "loss":
                return loss * float("nan")
            loss.register_hook(lambda g: g * float("inf"))  # finite loss, inf gradients
        return loss
    return loss_fn


def _rows(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("how", ["loss", "grad"])
def test_nonfinite_steps_are_skipped(tmp_path, corpus, how):
    cfg = _cfg(tmp_path, corpus, save_every=2)
    s = train.run(cfg, loss_fn=_poison({3, 4}, how))
    assert s["skipped_steps"] == 2 and s["steps"] == 4
    out = tmp_path / "run"
    final = load_file(str(out / "final/outcore/master.safetensors"))
    at2 = load_file(str(out / "checkpoints/step-00000002/outcore/master.safetensors"))
    for k in final:  # the skipped steps changed nothing
        assert torch.isfinite(final[k]).all() and torch.equal(final[k], at2[k]), k
    assert [r["skipped"] for r in _rows(out)] == [0, 0, 1, 1]


def test_nonfinite_loss_without_clipping(tmp_path, corpus):
    s = train.run(_cfg(tmp_path, corpus, max_grad_norm=None, max_steps=3),
                  loss_fn=_poison({2}), return_model=True)
    assert s["skipped_steps"] == 1
    assert all(torch.isfinite(p).all() for p in s["model"].parameters())


def test_too_many_bad_steps_stop_the_run(tmp_path, corpus):
    with pytest.raises(OutcoreError, match="2 steps in a row had a non-finite") as e:
        train.run(_cfg(tmp_path, corpus, max_steps=6, max_bad_steps=2),
                  loss_fn=_poison({2, 3, 4, 5, 6}))
    assert "at step 3" in str(e.value) and "\n" not in str(e.value)


def test_grad_accum_equals_the_bigger_batch(tmp_path, corpus):
    # Adam eps 1e-6, as in the parallel equivalence tests: with 1e-8 an element whose
    # gradient is near zero turns the sums' last-bit differences into whole updates
    a = train.run(_cfg(tmp_path / "a", corpus, batch_size=2, grad_accum=3, max_steps=3,
                       eps=1e-6), return_model=True)["model"]
    b = train.run(_cfg(tmp_path / "b", corpus, batch_size=6, max_steps=3, eps=1e-6),
                  return_model=True)["model"]
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert (p - q).norm() <= 1e-5 * q.norm(), n


def test_logs_and_keep_last(tmp_path, corpus):
    cfg = _cfg(tmp_path, corpus, save_every=1, keep_last=2, tensorboard=True)
    train.run(cfg)
    out = tmp_path / "run"
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["lr"] > 0 and r["grad_norm"] > 0 and r["tokens_per_s"] > 0
               and 0 < r["mfu"] and r["host_rss_bytes"] > 0 for r in rows)
    assert rows[0]["lr"] == pytest.approx(train.lr_at(cfg, 0))
    # the time split per step (on the CPU every figure is the row's own step)
    assert all(0 < r["compute_s"] <= r["step_s"] and r["copy_wait_s"] >= 0
               and 0 <= r["optimizer_wait_s"] <= r["step_s"] for r in rows)
    with open(out / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    kept = sorted(d.name for d in (out / "checkpoints").iterdir())
    assert kept == ["step-00000002", "step-00000003"]
    assert (out / "final/trainer.json").is_file()


def test_resume_refuses_other_data(tmp_path, corpus):
    train.run(_cfg(tmp_path, corpus, max_steps=2))
    other = tmp_path / "other.txt"
    other.write_text("different text " * 100)
    with pytest.raises(OutcoreError, match="trained on other data"):
        train.run(_cfg(tmp_path, other, max_steps=3, resume=True))
    with pytest.raises(OutcoreError, match="same --batch-size x --grad-accum"):
        train.run(_cfg(tmp_path, corpus, max_steps=3, resume=True, batch_size=2))


def test_host_weight_copy_trains_the_same_model(tmp_path, corpus):
    """--host-weight-copy (bf16 compute, clipping held updates): the same weights as
    without it; with fp32 compute it is a one-line error."""
    kw = dict(compute_dtype="bfloat16", max_steps=3)
    a = train.run(_cfg(tmp_path / "a", corpus, host_weight_copy=True, **kw),
                  return_model=True)["model"]
    b = train.run(_cfg(tmp_path / "b", corpus, **kw), return_model=True)["model"]
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(OutcoreError, match="16-bit compute dtype"):
        train.run(_cfg(tmp_path / "c", corpus, host_weight_copy=True, max_steps=1))


def test_no_skip_nonfinite_lets_updates_start_block_by_block(tmp_path, corpus, monkeypatch):
    """--max-grad-norm 0 --no-skip-nonfinite: the engine is built without held updates (so
    on a GPU part of AdamW may run there), trains, and a non-finite step leaves the
    weights finite."""
    made = []
    real = train.Engine

    def spy(*a, **kw):
        made.append(kw)
        return real(*a, **kw)
    monkeypatch.setattr(train, "Engine", spy)
    s = train.run(_cfg(tmp_path, corpus, max_grad_norm=None, skip_nonfinite=False,
                       max_steps=4), loss_fn=_poison({2}, "grad"), return_model=True)
    assert made and made[0]["skip_nonfinite"] is False and made[0]["max_grad_norm"] is None
    assert s["steps"] == 4
    assert all(torch.isfinite(p).all() for p in s["model"].parameters())
    fresh = train.run(_cfg(tmp_path / "b", corpus, max_grad_norm=None, skip_nonfinite=False,
                           max_steps=4), return_model=True)
    held = train.run(_cfg(tmp_path / "c", corpus, max_grad_norm=None, max_steps=4),
                     return_model=True)
    for a, b in zip(fresh["model"].parameters(), held["model"].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)   # the same training


def test_held_gpu_updates_reach_the_engine_and_train_the_same_model(tmp_path, corpus,
                                                                     monkeypatch):
    """--held-gpu-updates N: blocks 1..N updated by their next load (deferred.py), the
    same model as the CPU AdamW's to float tolerance; bad values are one-line errors."""
    made = []
    real = train.Engine

    def spy(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]
    monkeypatch.setattr(train, "Engine", spy)
    a = train.run(_cfg(tmp_path / "a", corpus, held_gpu_updates="2"), return_model=True)
    assert made[-1].deferred.groups == {1, 2} and made[-1].deferred.applied_on_device > 0
    b = train.run(_cfg(tmp_path / "b", corpus), return_model=True)
    assert made[-1].deferred.groups == set()
    for (n, p), (_, q) in zip(a["model"].named_parameters(), b["model"].named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    for bad, msg in (("x", "use off, auto or a number"), ("-1", "use off, auto or a number")):
        with pytest.raises(OutcoreError, match=msg):
            _cfg(tmp_path, corpus, held_gpu_updates=bad).validate()
    with pytest.raises(OutcoreError, match="needs held updates"):
        _cfg(tmp_path, corpus, held_gpu_updates="2", max_grad_norm=0,
             skip_nonfinite=False).validate()
    assert _cfg(tmp_path, corpus, held_gpu_updates=0).validate().held_gpu_updates == "off"
