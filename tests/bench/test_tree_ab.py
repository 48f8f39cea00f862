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
