"""Crash safety: SIGKILL during training and during a save, SIGTERM; --resume ends identical.

Each run is a real `outcore train` subprocess; the final fp32 masters of every resumed run
must equal (bitwise) those of the run that was never interrupted.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

STEPS = 8


def _args(out, data):
    return [sys.executable, "-m", "outcore.cli", "train", "--model", "tiny", "--data", str(data),
            "--seq-len", "32", "--batch-size", "4", "--max-steps", str(STEPS), "--save-every",
            "2", "--keep-last", "2", "--output-dir", str(out), "--device", "cpu",
            "--no-tensorboard", "--warmup-steps", "2", "--seed", "1"]


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _final(out):
    return load_file(str(out / "final" / "outcore" / "master.safetensors"))


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equal(b[k]), k


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    f = tmp_path_factory.mktemp("d") / "corpus.txt"
    f.write_text("".join(f"line {i}: the quick brown fox {i * i}\n" for i in range(300)))
    return f


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("ref")
    subprocess.run(_args(out, data), env=_env(), check=True, capture_output=True, timeout=120)
    return out


def _steps_logged(out):
    f = out / "metrics.jsonl"
    return [json.loads(ln)["step"] for ln in f.read_text().splitlines()] if f.exists() else []


def test_sigkill_during_save_then_resume(tmp_path, data, reference):
    out = tmp_path / "run"
    p = subprocess.run(_args(out, data), env=_env(OUTCORE_TEST_KILL_DURING_SAVE="4"),
                       capture_output=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    ck = sorted(d.name for d in (out / "checkpoints").iterdir())
    assert "step-00000002" in ck and "step-00000004" not in ck  # the half-written one is hidden
    assert any(".tmp-" in n for n in ck)  # ...under a temporary name
    p = subprocess.run(_args(out, data) + ["--resume"], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from" in p.stdout and "at step 2" in p.stdout
    _same(_final(out), _final(reference))
    assert _steps_logged(out) == list(range(1, STEPS + 1))  # redone steps logged once
    left = sorted(d.name for d in (out / "checkpoints").iterdir())
    assert left == ["step-00000004", "step-00000006"]  # --keep-last 2, no temporaries


def test_sigkill_during_training_then_resume(tmp_path, data, reference):
    out = tmp_path / "run"
    p = subprocess.Popen(_args(out, data), env=_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_steps_logged(out)) < 5 and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    p.kill()
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert not (out / "final").exists()
    p = subprocess.run(_args(out, data) + ["--resume"], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    _same(_final(out), _final(reference))


def test_sigterm_saves_and_exits_then_resume(tmp_path, data, reference):
    out = tmp_path / "run"
    p = subprocess.Popen(_args(out, data), env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while len(_steps_logged(out)) < 3 and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert "SIGTERM: saving a checkpoint" in text
    done = max(_steps_logged(out))
    assert done < STEPS and (out / "checkpoints" / f"step-{done:08d}" / "trainer.json").is_file()
    p = subprocess.run(_args(out, data) + ["--resume"], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and f"at step {done}" in p.stdout, p.stderr[-2000:]
    _same(_final(out), _final(reference))
