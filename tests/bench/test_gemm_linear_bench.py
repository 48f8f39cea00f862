"""bench/gemm_linear.py --smoke: the MLP with a layer over its budget trains on the CPU, its
first loss equals plain PyTorch's, and the results file has every figure."""

import json
import sys

import pytest

from .test_stream_append import load_stream_bench


@pytest.mark.parametrize("compute", [None, "strassen"])
def test_smoke_run_writes_a_checked_row(tmp_path, monkeypatch, compute):
    bench = load_stream_bench("gemm_linear")
    out = tmp_path / "gemm-linear.json"
    monkeypatch.setattr(sys, "argv", ["gemm_linear.py", "--smoke", "--out", str(out)]
                        + (["--compute", compute] if compute else []))
    assert bench.main() == 0
    row = json.loads(out.read_text())["runs"][0]
    assert row["compute"] == (compute or "fp32")
    assert row["loss_falls"] and row["losses"][-1] < row["losses"][0]
    assert row["first_loss_rel_error"] < 1e-4
    assert row["weight_gib"] * 2**30 > row["gpu_memory_bytes"]   # the layer exceeds it
    assert len(row["step_s"]) == 4 and row["layer_tflops"] > 0
