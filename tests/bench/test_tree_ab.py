"""bench/tree_ab.py's table: a run that timed out (an error row, no step_s) is printed
with its error beside the runs that finished (session 45's 7b-16k A/B had crashed there)."""

from .test_stream_append import load_stream_bench


def test_stream_table_prints_error_rows(capsys):
    ab = load_stream_bench("tree_ab")
    done = {"step_s": 2.073, "steps": [{"step_s": 2.0}, {"step_s": 2.2}], "compute_s": 1.41,
            "copy_wait_s": 0.05, "optimizer_wait_s": 1.26, "device_updated_params": 262e6,
            "peak_gpu_gb": 15.5}
    ab._stream_table([("new1", "20c3c11", {"error": "timed out after 200 s"}),
                      ("old1", "5091731", done), ("new2", "20c3c11", None)])
    out = capsys.readouterr().out.splitlines()
    assert out[-3].split()[:2] == ["new1", "20c3c11"] and "timed out after 200 s" in out[-3]
    assert out[-2].split()[:4] == ["old1", "5091731", "2.073", "2.100"]
    assert out[-1].split() == ["new2", "20c3c11", "no", "result"]


def test_a_timed_out_stream_run_names_the_line_it_stopped_after(monkeypatch, capsys):
    """bench/stream.py's row for a run stopped by its limit says how far it got (session
    46's 7b-16k runs were stopped while building, which the bare "timed out" hid)."""
    import subprocess
    bench = load_stream_bench("stream")
    partial = "== outcore 7b-16k\n  model: 6.74B params built in 12.0 s\n" \
              "outcore: page-locking 25.1 GiB of fp32 master weights\n\n"

    def stopped(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=partial)
    monkeypatch.setattr(bench.subprocess, "run", stopped)
    row = bench.spawn("outcore", "7b-16k", "7b", 16384, 0, [], 170)
    assert row["error"] == ("timed out after 170 s, its last line: outcore: page-locking "
                            "25.1 GiB of fp32 master weights")
    assert row["system"] == "outcore" and row["case"] == "7b-16k"
    assert "model: 6.74B params built" in capsys.readouterr().out


def test_a_run_whose_results_are_already_in_out_dir_is_read(monkeypatch, tmp_path):
    """`--out-dir bench/results` for the new tree (the tree itself): its result is the same
    file, read where it lies (session 47's first A/B call crashed copying it onto itself
    and so never printed its table)."""
    import json
    from types import SimpleNamespace
    ab = load_stream_bench("tree_ab")
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    row = {"system": "outcore", "step_s": 2.0}

    def ran(cmd, **kw):
        (results / "x.json").write_text(json.dumps({"runs": [row]}))
        return SimpleNamespace(returncode=0)
    monkeypatch.setattr(ab.subprocess, "run", ran)
    args = SimpleNamespace(bench="stream", case="7b-16k", timeout=10, steps=5)
    assert ab._run(tmp_path, "abc", "x", args, results) == row
    other = tmp_path / "out"
    other.mkdir()
    assert ab._run(tmp_path, "abc", "x", args, other) == row
    assert json.loads((other / "x.json").read_text())["runs"] == [row]
