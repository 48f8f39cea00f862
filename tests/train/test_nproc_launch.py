"""`outcore train --nproc N`'s launcher and ranks: --nproc checked, an error printed once
with its exit code, the process group shut down, SIGINT to the launcher checkpoints."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from outcore.cli import main

gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                          reason="needs torch.distributed with gloo")


def _cmd(out, *extra):
    return [sys.executable, "-m", "outcore.cli", "train", "--model", "tiny", "--seq-len", "32",
            "--batch-size", "4", "--output-dir", str(out), "--device", "cpu",
            "--no-tensorboard", *extra]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.mark.parametrize("n", ["-3", "0"])
def test_nproc_below_one_is_refused(capsys, n):
    with pytest.raises(SystemExit) as e:
        main(["train", "--nproc", n, "--max-steps", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--nproc" in err and "at least 1" in err, err


def test_more_ranks_than_batch_rows_is_refused_before_launch(capsys):
    assert main(["train", "--nproc", "3", "--batch-size", "2", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot be split over 3 ranks" in err, err


@gloo
def test_one_rank_job_shuts_its_process_group_down(tmp_path, monkeypatch, capsys):
    """Under torchrun's environment the CLI joins a process group; it leaves it at the end
    and on an error (which is printed once, as one line)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("OUTCORE_RANK_REPORTS", raising=False)
    data = tmp_path / "corpus.txt"
    data.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(200)))
    args = ["train", "--model", "tiny", "--seq-len", "32", "--batch-size", "2", "--device",
            "cpu", "--no-tensorboard", "--data", str(data), "--max-steps", "1"]
    assert main(args + ["--output-dir", str(tmp_path / "a")]) == 0
    assert not dist.is_initialized()
    capsys.readouterr()
    assert main(args + ["--output-dir", str(tmp_path / "b"), "--data", "/nonexistent"]) == 2
    assert not dist.is_initialized()
    err = capsys.readouterr().err.strip()
    assert err.count("outcore: error:") == 1 and "/nonexistent" in err, err


@gloo
def test_a_rank_error_is_printed_once_with_its_exit_code(tmp_path):
    p = subprocess.run(_cmd(tmp_path / "run", "--nproc", "2", "--max-steps", "1", "--data",
                            str(tmp_path / "missing.txt")),
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.count("outcore: error:") == 1, p.stderr[-3000:]
    assert "missing.txt" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]


@gloo
def test_sigint_to_the_launcher_checkpoints_on_every_rank(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen(_cmd(out, "--nproc", "2", "--max-steps", "1000"), env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and p.poll() is None and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)   # the launcher only, as `kill -INT` would
    stdout, stderr = p.communicate(timeout=90)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stdout.count("saving a checkpoint after this step") == 1, stdout
    (ck,) = (out / "checkpoints").iterdir()
    assert {f.name for f in (ck / "outcore").iterdir()} >= {
        "state.json", "shard-0.safetensors", "shard-1.safetensors"}
    assert not (out / "final").exists()
