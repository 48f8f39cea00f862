"""Review of `outcore train --resume` and its checkpoints: changed options, pruning beside
damaged checkpoints, a crash between a save's two renames, a signal at the last step, and
a resumed run's losses against an uninterrupted one's."""

import json
import os
import shutil
import signal

import pytest
from safetensors.torch import load_file

from outcore import runckpt, train
from outcore.errors import OutcoreError

from .runlib import finished_run, tiny_cfg


def _cfg(out, corpus, **kw):
    return tiny_cfg(out, corpus, **{**dict(max_steps=6, keep_last=0), **kw})


@pytest.fixture(scope="module")
def done_run(tmp_path_factory, corpus):
    """A finished run: checkpoints/step-00000002, step-00000004 and final (step 6)."""
    return finished_run(tmp_path_factory, lambda out: _cfg(out, corpus))


@pytest.fixture
def run_copy(tmp_path, done_run):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    return out


def _losses(out):
    return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()]


def _truncate(f):
    f.write_bytes(f.read_bytes()[:100])


def _one_line(e) -> str:
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


class _Stop(Exception):
    pass


def _stop_at(call):
    """loss_fn that ends the run (an exception, as a crash would) on its call-th step."""
    n = [0]

    def loss_fn(out, batch):
        n[0] += 1
        if n[0] == call:
            raise _Stop
        return out.loss
    return loss_fn


def test_resumed_losses_equal_the_uninterrupted_run(tmp_path, corpus, done_run):
    out = tmp_path / "run"
    with pytest.raises(_Stop):   # dies in step 4, after the step-2 checkpoint
        train.run(_cfg(out, corpus), loss_fn=_stop_at(4))
    assert runckpt.newest(out).name == "step-00000002"
    train.run(_cfg(out, corpus, resume=True))
    assert _losses(out) == _losses(done_run)   # bitwise, every step logged once
    a = load_file(str(out / "final" / "outcore" / "master.safetensors"))
    b = load_file(str(done_run / "final" / "outcore" / "master.safetensors"))
    assert all(a[k].equal(b[k]) for k in b)


def test_resume_with_another_seed_is_refused(run_copy, corpus):
    """The batches are a pure function of (seed, step): another seed serves other batches
    than the run had from its step on (data repeated or skipped), which resumed silently."""
    with pytest.raises(OutcoreError, match="--seed 0.*--seed 0 or a new --output-dir") as e:
        train.run(_cfg(run_copy, corpus, max_steps=7, seed=5, resume=True))
    _one_line(e)


def test_resume_with_another_reference_size_names_the_flag(run_copy, corpus, monkeypatch):
    def boom(cfg):
        raise AssertionError("the model was built before the check")
    monkeypatch.setattr(train, "build_model", boom)
    with pytest.raises(OutcoreError, match="trained with --model tiny.*pass --model tiny") as e:
        train.run(_cfg(run_copy, corpus, max_steps=7, model="small", resume=True))
    _one_line(e)


def test_resume_applies_changed_optimizer_settings_and_says_so(run_copy, corpus, capsys):
    """--weight-decay (and betas, eps) given on --resume were ignored without a word (the
    checkpoint's were kept) while --lr applied: now every flag applies, and a line says
    which differ from the checkpoint's."""
    train.run(_cfg(run_copy, corpus, max_steps=7, weight_decay=0.5, resume=True))
    text = capsys.readouterr().out
    state = json.loads((run_copy / "final" / "outcore" / "state.json").read_text())
    assert state["optimizer"]["weight_decay"] == 0.5
    assert "weight_decay 0.5 (the checkpoint's: 0.1)" in text


def test_pruning_never_deletes_the_only_good_checkpoint(run_copy, corpus):
    """step-4 and step-6 damaged: --resume goes back to step 2. At step 4's save,
    --keep-last 1 kept the newest by name (the damaged step-6) and deleted the good step-2
    and the step-4 just written: a crash then left no checkpoint that loads."""
    ck = run_copy / "checkpoints"
    shutil.rmtree(run_copy / "final")
    shutil.copytree(ck / "step-00000004", ck / "step-00000006")
    (ck / "step-00000006" / "trainer.json").write_text(json.dumps({"step": 6}))
    for s in ("step-00000004", "step-00000006"):
        _truncate(ck / s / "outcore" / "master.safetensors")
    with pytest.raises(_Stop):   # dies in step 5, after step 4's save and prune
        train.run(_cfg(run_copy, corpus, keep_last=1, resume=True), loss_fn=_stop_at(3))
    good = runckpt.pick_resume(run_copy, print, distributed=False)
    assert good == ck / "step-00000004" and runckpt.problem(good) is None


def test_prune_keeps_the_newest_good_ones(tmp_path, done_run):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    ck = out / "checkpoints"
    shutil.copytree(ck / "step-00000004", ck / "step-00000006")
    _truncate(ck / "step-00000006" / "outcore" / "optim.safetensors")
    runckpt.prune(out, 1)
    assert sorted(d.name for d in ck.iterdir()) == ["step-00000004", "step-00000006"]
    runckpt.prune(out, 0)   # 0 = keep all
    assert (ck / "step-00000004").is_dir() and (out / "final").is_dir()


def test_a_crash_between_a_saves_two_renames_keeps_the_old_checkpoint(run_copy, corpus,
                                                                      capsys):
    """atomic_dir moves an existing final/ to .final.old-PID, then the new one in: killed
    between the two, final/ is gone and .final.old-PID is the only copy of step 6, which
    --resume deleted as a 'partial checkpoint' (and went back to step 4)."""
    os.replace(run_copy / "final", run_copy / ".final.old-12345")
    (run_copy / ".final.tmp-abcd").mkdir()   # the new one, half written
    s = train.run(_cfg(run_copy, corpus, max_steps=7, resume=True))
    text = capsys.readouterr().out
    assert "resumed from" in text and "at step 6" in text and s["steps"] == 1
    assert not any(".old-" in p.name or ".tmp-" in p.name for p in run_copy.iterdir())


def test_a_signal_in_the_last_step_still_writes_final(tmp_path, corpus, capsys):
    """SIGTERM in the last step saved checkpoints/step-N and no final/; --resume then said
    'nothing to train', so final/ (the run's Hugging Face export) was never written."""
    n = [0]

    def loss_fn(out, batch):
        n[0] += 1
        if n[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)   # the handler sets a flag
        return out.loss
    out = tmp_path / "run"
    s = train.run(_cfg(out, corpus, max_steps=3, save_every=0), loss_fn=loss_fn)
    assert s["stopped_by_signal"] == signal.SIGTERM
    assert runckpt.is_complete(out / "final")
    assert json.loads((out / "final" / "trainer.json").read_text())["step"] == 3
    assert not (out / "checkpoints").exists()
