"""`outcore train --nproc 2` (gloo, CPU): rank 0 alone prints and logs, every checkpoint is
whole, and --resume continues it (two real processes: about 20 s)."""

import csv
import json
import os
import subprocess
import sys

import pytest

import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _train(out, data, *extra):
    cmd = [sys.executable, "-m", "outcore.cli", "train", "--model", "tiny", "--data",
           str(data), "--seq-len", "32", "--batch-size", "4", "--save-every", "2",
           "--output-dir", str(out), "--device", "cpu", "--warmup-steps", "1", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def test_nproc_2_logs_once_and_resumes(tmp_path):
    data = tmp_path / "corpus.txt"
    data.write_text("".join(f"line {i}: the quick brown fox {i * i}\n" for i in range(300)))
    out = tmp_path / "run"
    p = _train(out, data, "--max-steps", "4", "--nproc", "2", "--no-tensorboard")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("summary:") == 1 and p.stdout.count("outcore plan:") == 1
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with open(out / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    for ck in (out / "final", out / "checkpoints" / "step-00000002"):
        assert (ck / "trainer.json").is_file()
        assert {f.name for f in (ck / "outcore").iterdir()} >= {
            "state.json", "shard-0.safetensors", "shard-1.safetensors"}
    p = _train(out, data, "--max-steps", "6", "--nproc", "2", "--resume", "--no-tensorboard")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("resumed from") == 1 and "at step 4" in p.stdout
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    p = _train(out, data, "--max-steps", "8", "--resume", "--no-tensorboard")
    assert p.returncode == 2 and "pass --nproc N (e.g. --nproc 2)" in p.stderr
