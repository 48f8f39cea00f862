"""Review fixes of `outcore train`: output dirs, damaged checkpoints, config values, devices,
rank 0 alone printing and logging, a diverged run's sample."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from outcore import runckpt, train
from outcore.cli import main
from outcore.config import build, load_toml
from outcore.errors import OutcoreError
from outcore.logs import RunLog

from .runlib import finished_run, tiny_cfg


def _cfg(out, corpus, **kw):
    return tiny_cfg(out, corpus, **kw)


@pytest.fixture(scope="module")
def done_run(tmp_path_factory, corpus):
    """A finished run: checkpoints/step-00000002 and final (step 4)."""
    return finished_run(tmp_path_factory, lambda out: _cfg(out, corpus))


@pytest.fixture
def no_build(monkeypatch):
    """Fails the test if the model is built: the check must come before."""
    def boom(cfg):
        raise AssertionError("the model was built before the check")
    monkeypatch.setattr(train, "build_model", boom)


def _one_line(e) -> str:
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


# -- 3: a fresh run into an earlier run's directory -----------------------------------------
def test_fresh_run_refuses_a_dir_with_checkpoints(tmp_path, corpus, done_run, no_build):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    with pytest.raises(OutcoreError, match="holds checkpoints of an earlier run: pass "
                       "--resume") as e:
        train.run(_cfg(out, corpus))
    _one_line(e)
    shutil.rmtree(out / "final")   # periodic checkpoints alone count too
    with pytest.raises(OutcoreError, match="holds checkpoints"):
        train.run(_cfg(out, corpus))


# -- 5: output paths checked before anything is built -------------------------------------
def test_output_dir_problems_are_one_line_before_building(tmp_path, corpus, no_build,
                                                          monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutcoreError, match="is a file: pass a directory") as e:
        train.run(_cfg(afile, corpus))
    _one_line(e)
    with pytest.raises(OutcoreError, match="part of that path is a file") as e:
        train.run(_cfg(afile / "sub", corpus))
    _one_line(e)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(runckpt.tempfile, "mkstemp", denied)   # root ignores chmod
    with pytest.raises(OutcoreError, match="is not writable \\(Permission denied\\)") as e:
        train.run(_cfg(tmp_path / "ro", corpus))
    _one_line(e)


# -- 4: damaged checkpoints ---------------------------------------------------------------
DAMAGE = {
    "trainer": lambda ck: (ck / "trainer.json").write_text("{bad"),
    "state": lambda ck: (ck / "outcore" / "state.json").write_text("{bad"),
    "master": lambda ck: _truncate(ck / "outcore" / "master.safetensors"),
    "optim": lambda ck: _truncate(ck / "outcore" / "optim.safetensors"),
    "rng": lambda ck: (ck / "outcore" / "rng.pt").unlink(),
    "rng-cut": lambda ck: _truncate(ck / "outcore" / "rng.pt"),
}


def _truncate(f):
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_resume_skips_a_damaged_checkpoint(tmp_path, corpus, done_run, capsys, what):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    DAMAGE[what](out / "final")
    assert [ck.name for _, ck in runckpt.list_checkpoints(out)][-1] == "final"  # no raise
    s = train.run(_cfg(out, corpus, max_steps=5, resume=True))
    text = capsys.readouterr().out
    assert f"--resume: skipping {out / 'final'}: " in text
    assert "resumed from" in text and "at step 2" in text and s["steps"] == 3


def test_resume_with_no_loadable_checkpoint_is_one_line(tmp_path, corpus, done_run):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    DAMAGE["trainer"](out / "final")
    DAMAGE["master"](out / "checkpoints" / "step-00000002")
    with pytest.raises(OutcoreError, match="no checkpoint in .* loads .*final: trainer.json "
                       "is unreadable") as e:
        train.run(_cfg(out, corpus, max_steps=5, resume=True))
    _one_line(e)


def test_engine_load_of_a_damaged_checkpoint_is_one_line(tmp_path, done_run):
    from outcore import Engine
    from outcore.models import decoder
    ck = tmp_path / "ck"
    shutil.copytree(done_run / "final" / "outcore", ck)
    (ck / "rng.pt").unlink()
    with pytest.raises(OutcoreError, match="rng.pt is missing or damaged"):
        Engine.load(ck, decoder("tiny"), device="cpu")
    (ck / "state.json").write_text("{bad")
    with pytest.raises(OutcoreError, match="state.json is damaged"):
        Engine.load(ck, decoder("tiny"), device="cpu")


# -- 9: a checkpoint already at --max-steps -------------------------------------------------
def test_resume_past_max_steps_says_so_and_keeps_final(tmp_path, corpus, done_run, capsys,
                                                       no_build):
    out = tmp_path / "run"
    shutil.copytree(done_run, out)
    before = (out / "final" / "trainer.json").stat().st_mtime_ns
    s = train.run(_cfg(out, corpus, max_steps=3, resume=True))
    text = capsys.readouterr().out
    assert "already at step 4 >= --max-steps 3" in text and len(text.splitlines()) == 1
    assert s["steps"] == 0
    assert (out / "final" / "trainer.json").stat().st_mtime_ns == before


# -- 2: --nproc N: rank 0 alone prints and logs; sharded checkpoints ------------------------
def test_ranks_other_than_0_print_and_log_nothing(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.setattr(train, "_rank", lambda: 1)
    out = tmp_path / "run"
    train.run(_cfg(out, corpus, generate_tokens=5, tensorboard=True))
    captured = capsys.readouterr()
    assert captured.out == "" and "train:" not in captured.err
    assert not any((out / n).exists() for n in ("metrics.jsonl", "metrics.csv",
                                                "tensorboard", "config.json"))


def test_save_run_on_other_ranks_only_adds_its_shard(tmp_path):
    calls = []

    class Rank1:
        rank = 1

        def save(self, path):
            calls.append(("save", path))

        @property
        def model(self):
            calls.append(("model",))

    runckpt.save_run(tmp_path / "final", Rank1(), None, {"step": 1}, hf=True)
    assert calls == [("save", tmp_path / "final" / "outcore"), ("model",)]
    assert not (tmp_path / "final").exists()   # rank 0 alone writes and renames it


def test_run_log_drops_rows_that_do_not_parse(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 1}\n{"st')
    (tmp_path / "metrics.csv").write_text("step,loss\nstep,loss\n1,2.0\n2,1.0\n1,2.0\n")
    RunLog(tmp_path, resume_step=1, tensorboard=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 1}\n'
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].startswith("step,loss")
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 3


def test_sharded_checkpoint_without_nproc_is_one_line(tmp_path, corpus, no_build):
    out = tmp_path / "run"
    eng = out / "final" / "outcore"
    eng.mkdir(parents=True)
    (out / "final" / "trainer.json").write_text(json.dumps({"step": 2}))
    (eng / "state.json").write_text(json.dumps({"format": "outcore-sharded-1", "world": 2,
                                                "step": 2}))
    for r in range(2):
        save_file({"master.0": torch.zeros(2)}, str(eng / f"shard-{r}.safetensors"))
    with pytest.raises(OutcoreError, match="written by 2 ranks: pass --nproc N") as e:
        train.run(_cfg(out, corpus, resume=True))
    _one_line(e)


# -- 6: non-finite hyper-parameters; a diverged run's sample --------------------------------
@pytest.mark.parametrize("key,value", [("lr", float("inf")), ("lr", float("nan")),
                                       ("weight_decay", float("nan")), ("eps", float("inf")),
                                       ("max_grad_norm", float("nan")), ("betas", (0.9, 1.0))])
def test_non_finite_hyper_parameters_are_refused(key, value):
    with pytest.raises(OutcoreError, match=key):
        build({}, {key: value})


def test_diverged_run_skips_the_sample(tmp_path, corpus, capsys):
    s = train.run(_cfg(tmp_path / "run", corpus, lr=1e20, max_steps=3, save_every=0,
                       generate_tokens=5, max_bad_steps=10))
    assert s["steps"] == 3 and (tmp_path / "run" / "final" / "trainer.json").is_file()
    assert "no sample: the weights or logits are not finite" in capsys.readouterr().out


def test_generate_returns_none_for_non_finite_weights():
    from outcore.data import ByteTokenizer
    from outcore.models import decoder
    model = decoder("tiny")
    assert isinstance(train.generate(model, ByteTokenizer(), "def ", 2), str)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))
    assert train.generate(model, ByteTokenizer(), "def ", 2) is None


# -- 7: malformed --config files ----------------------------------------------------------
@pytest.mark.parametrize("text", [b'betas = ["a", 0.9]\n', b"betas = 0.9\n",
                                  b"betas = [0.9, 0.95, 0.99]\n", b"train = 5\n",
                                  b"lr = 1\n# \xff\xfe\n"])
def test_malformed_config_is_one_line(tmp_path, text):
    f = tmp_path / "c.toml"
    f.write_bytes(text)
    with pytest.raises(OutcoreError) as e:
        build(load_toml(f), {})
    _one_line(e)


def test_config_that_is_a_directory(tmp_path):
    with pytest.raises(OutcoreError, match="is a directory: pass a TOML file"):
        load_toml(tmp_path)


# -- 8: devices that are not here -----------------------------------------------------------
def test_devices_that_are_not_here_are_one_line(tmp_path, capsys):
    assert main(["plan", "--model", "tiny", "--device", "garbage"]) == 2
    assert "is not a device" in capsys.readouterr().err
    if torch.cuda.is_available():
        return
    assert main(["plan", "--model", "7b", "--device", "cuda", "--no-calibrate"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert main(["train", "--model", "tiny", "--device", "cuda",
                 "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "CUDA is not available" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("err", [OSError(28, "No space left on device"),
                                 "safetensors"])
def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_earlier_ones(
        tmp_path, corpus, monkeypatch, err):
    """A write that fails (ENOSPC from the OS, or safetensors' own I/O error) ends the run
    with one line naming the checkpoint and the space it needs; no temporary is left and
    the earlier checkpoint stays loadable."""
    from safetensors import SafetensorError

    import outcore.stream.checkpoint as ck
    real, calls = ck.save_file, []

    def failing(tensors, path, *a, **kw):
        calls.append(path)
        if "step-00000004" in path or "final" in path:
            if err == "safetensors":
                raise SafetensorError("Error while serializing: I/O error: No space left on "
                                      "device (os error 28)")
            raise err
        return real(tensors, path, *a, **kw)
    monkeypatch.setattr(ck, "save_file", failing)
    out = tmp_path / "run"
    with pytest.raises(OutcoreError) as e:
        train.run(_cfg(out, corpus, max_steps=6))
    msg = _one_line(e)
    assert "could not write the checkpoint" in msg and "step-00000004" in msg
    assert "No space left on device" in msg and "free disk" in msg
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert left == ["step-00000002"]   # no temporary, the earlier one kept
    assert runckpt.is_complete(out / "checkpoints" / "step-00000002")
