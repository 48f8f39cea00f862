"""bench/swap.py --smoke runs every code path of the bench on the CPU and writes rows in
the results format (DESIGN.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_writes_every_case(tmp_path):
    out = tmp_path / "swap-smoke.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "swap.py"), "--smoke",
                           "--no-wide", "--out", str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert {"benchmark", "command", "commit", "machine", "gpus", "torch", "date", "runs"} <= set(res)
    rows = {(r["system"], r["case"], "error" in r): r for r in res["runs"]}
    plain = rows[("pytorch", "resnet152-maxbatch", False)]
    ours = rows[("outcore", "resnet152-maxbatch", False)]
    assert ours["max_batch"] > plain["max_batch"] >= 1
    assert ours["limited_by"] == "host memory"          # the smoke host limit is small
    oom = rows[("pytorch", "resnet152-maxbatch", True)]
    assert oom["batch"] == ours["max_batch"] and "out of memory" in oom["error"]
    for system in ("pytorch", "outcore", "save_on_cpu"):
        assert rows[(system, "resnet152-throughput", False)]["images_per_s"] > 0
    assert "vs_save_on_cpu" in rows[("outcore", "resnet152-throughput", False)]
    assert "case" in proc.stdout.splitlines()[-len(res["runs"]) - 1]   # the table comes last
