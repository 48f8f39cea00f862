"""The multi-GPU benches take any number of devices (issue 9's 4- and 8-GPU runs): on the CPU
their --smoke runs use that many workers (gemm), gloo ranks (parallel) or embedding ranks
(embed), and name their cases and summaries after it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def rows_of(path: Path) -> dict:
    return {r["case"] + "/" + r["system"]: r for r in json.loads(path.read_text())["runs"]}


def test_gemm_bench_on_three_devices(tmp_path):
    out = tmp_path / "gemm.json"
    run_bench("gemm.py", "--smoke", "--gpus", "3", "--out", str(out))
    rows = rows_of(out)
    three = rows["fp32-512-3gpu/outcore"]
    assert three["tflops"] > 0 and len(three["devices"]) == 3 and three["speedup"] > 0
    assert three["check_ok"]
    s3 = rows["fp32-512-3gpu/outcore-strassen"]
    assert s3["compute"] == "strassen" and len(s3["devices"]) == 3 and s3["check_ok"]
    assert s3["speedup"] > 0 and rows["fp32-512-1gpu/outcore-strassen"]["check_ok"]
    slowed = rows["fp32-512-slowed/outcore"]
    assert len(slowed["devices"]) == 3 and slowed["check_ok"]
    bound = rows["fp32-512-slowed/bound"]
    # GPU 0's rate alone stands for the two GPUs not slowed
    want = 2 * bound["gpu0_alone_tflops"] + bound["slowed_gpu_alone_tflops"]
    assert abs(bound["tflops"] - want) <= 1e-9 * want


def test_parallel_bench_with_three_ranks(tmp_path):
    out = tmp_path / "parallel.json"
    run_bench("parallel.py", "--smoke", "--gpus", "3", "--cases", "3b-1gpu,3b-3gpu",
              "--out", str(out))
    doc = json.loads(out.read_text())
    rows = {r["case"]: r for r in doc["runs"]}
    assert rows["3b-3gpu"]["gpus_used"] == 3 and "error" not in rows["3b-3gpu"]
    assert len(rows["3b-3gpu"]["shares"]) == 3
    assert rows["3b-3gpu"]["tokens_per_step"] == 3 * rows["3b-1gpu"]["tokens_per_step"]
    assert doc["summary"]["3gpu_over_1gpu"] > 0
    # every rank's peak resident memory, summed per parameter
    rss = rows["3b-3gpu"]["host_peak_rss_gb_per_rank"]
    assert len(rss) == 3 and all(r > 0 for r in rss)
    assert rows["3b-3gpu"]["host_rss_bytes_per_param"] == pytest.approx(
        sum(rss) * 1e9 / rows["3b-3gpu"]["params"])


def test_embed_bench_with_three_ranks(tmp_path):
    out = tmp_path / "embed.json"
    run_bench("embed.py", "--smoke", "--skip-pbg", "--gpus", "3", "--cases", "throughput",
              "--out", str(out))
    rows = rows_of(out)
    three = rows["throughput-3gpu/outcore"]
    assert three["devices"] == 3 and len(three["rank_wait_s"]) == 3
    assert three["edges_per_s"] > 0 and three["speedup"] > 0
