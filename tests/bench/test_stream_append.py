"""bench/stream.py --append and bench/merge_parts.py: a results file filled by several
commands keeps each command's own header as a part, and each row names the part that
measured it."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_stream_bench(name="stream"):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_bench",
                                                      ROOT / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_append_keeps_each_part(tmp_path):
    bench = load_stream_bench()
    path = tmp_path / "stream-x.json"
    first = {"benchmark": "stream", "command": "python3 bench/stream.py --cases 3b-16k",
             "commit": "aaa", "date": "d1", "torch": "2.11", "gpus": ["H200"],
             "gpu_tests": {"summary": "11 passed"},
             "runs": [{"system": "outcore", "case": "3b-16k", "step_s": 1.0}]}
    path.write_text(json.dumps(first))
    new = {"benchmark": "stream", "command": "python3 bench/stream.py --cases 7b-16k --append",
           "commit": "bbb", "date": "d2", "torch": "2.11", "gpus": ["H200"], "runs": []}
    doc = bench.appended(new, str(path))
    assert [p["commit"] for p in doc["parts"]] == ["aaa", "bbb"]
    assert doc["parts"][0]["gpu_tests"] == {"summary": "11 passed"}
    assert doc["commit"] == "bbb" and len(doc["runs"]) == 1   # the old rows stay
    assert bench.part_of(doc) == {"part": 1}
    # no file to append to: an error, not a fresh file that passes for the whole run
    with pytest.raises(SystemExit, match="does not exist"):
        bench.appended(dict(new, commit="ccc"), str(path.with_name("missing.json")))


def test_merge_parts_joins_single_command_files():
    merge = load_stream_bench("merge_parts").merge
    head = {"benchmark": "stream", "machine": "nvidia-h200", "torch": "2.11", "gpus": ["H200"]}
    a = dict(head, command="a", commit="c1", date="d1",
             runs=[{"system": "outcore", "case": "3b-16k", "step_s": 1.0}])
    b = dict(head, command="b", commit="c2", date="d2",
             runs=[{"system": "outcore", "case": "3b-64k", "step_s": 3.0},
                   {"system": "pytorch", "case": "3b-64k", "step_s": 2.9}])
    doc = merge([json.loads(json.dumps(d)) for d in (a, b)])
    assert [p["command"] for p in doc["parts"]] == ["a", "b"]
    assert [(r["case"], r["part"], r["step_s"]) for r in doc["runs"]] == \
        [("3b-16k", 0, 1.0), ("3b-64k", 1, 3.0), ("3b-64k", 1, 2.9)]
    assert doc["commit"] == "c2"
    with pytest.raises(SystemExit, match="different"):
        merge([dict(a, runs=[]), dict(b, machine="nvidia-h200x2", runs=[])])


def test_merge_parts_keeps_each_parts_summary_and_joins_their_figures():
    merge = load_stream_bench("merge_parts").merge
    head = {"benchmark": "parallel", "machine": "nvidia-h200x2", "torch": "2.11"}
    docs = [dict(head, command=c, commit=c, date=c, runs=[{"case": c}],
                 summary={"scaling": s, "largest": l, "targets": {"scaling": 1.9}})
            for c, s, l in (("a", 2.07, None), ("b", None, 0.92), ("c", 2.01, None))]
    doc = merge(docs)
    assert [p["summary"]["scaling"] for p in doc["parts"]] == [2.07, None, 2.01]
    # every figure some part measured; the newest where two did; no None over a figure
    assert doc["summary"] == {"scaling": 2.01, "largest": 0.92, "targets": {"scaling": 1.9}}


def test_merge_parts_takes_the_last_part_of_an_appended_file(tmp_path):
    mp = load_stream_bench("merge_parts")
    head = {"benchmark": "stream", "machine": "nvidia-h200", "torch": "2.11", "gpus": ["H200"],
            "compiled": False}
    old = dict(head, command="b", commit="c2", date="d2", parts=[
        {"command": "a", "commit": "c1", "date": "d1"},
        {"command": "b", "commit": "c2", "date": "d2", "gpu_tests": None}],
        runs=[{"case": "3b-16k", "step_s": 1.0}, {"case": "largest", "step_s": 3.0, "part": 1}])
    path = tmp_path / "appended.json"
    path.write_text(json.dumps(old))
    last = mp.load(f"{path}@last")
    assert last["runs"] == [{"case": "largest", "step_s": 3.0}] and "parts" not in last
    assert (last["command"], last["commit"], last["compiled"]) == ("b", "c2", False)
    first = dict(head, command="x", commit="c3", date="d3", runs=[{"case": "1b-16k"}])
    doc = mp.merge([first, last])
    assert [(r["case"], r["part"]) for r in doc["runs"]] == [("1b-16k", 0), ("largest", 1)]
    with pytest.raises(SystemExit, match="not in parts"):
        mp.load(f"{tmp_path / 'plain.json'}@last") if (tmp_path / "plain.json").write_text(
            json.dumps(first)) else None
    assert mp.load(f"{path}@1")["runs"] == [{"case": "largest", "step_s": 3.0}]
    with pytest.raises(SystemExit, match="has parts 0 to 1"):
        mp.load(f"{path}@2")
    with pytest.raises(SystemExit, match="only FILE"):
        mp.load(f"{path}@first")


def test_out_takes_a_bare_name_or_a_path(tmp_path):
    """Every bench's --out: `gemm-h200-s8` means bench/results/gemm-h200-s8.json (session 8
    ran gemm.py with `--out NAME`, which failed at its end and wrote nothing); a path is
    kept; None: the default."""
    common = load_stream_bench("common")
    assert common.out_path("gemm-h200-s8", "d.json") == str(common.RESULTS /
                                                            "gemm-h200-s8.json")
    assert common.out_path("x.json", "d.json") == str(common.RESULTS / "x.json")
    assert common.out_path(str(tmp_path / "y.json"), "d.json") == str(tmp_path / "y.json")
    assert common.out_path(None, "d.json") == "d.json"


def test_merge_parts_keeps_only_the_cases_named(tmp_path):
    """FILE#CASE: a part with one case's rows (a newer run measured its other cases again);
    the part says which it kept; a case the file lacks is an error, not an empty part."""
    mp = load_stream_bench("merge_parts")
    head = {"benchmark": "stream", "machine": "nvidia-h200", "torch": "2.11", "gpus": ["H200"]}
    old = dict(head, command="old", commit="c1", date="d1",
               runs=[{"system": s, "case": c} for c in ("3b-16k", "1b-16k")
                     for s in ("outcore", "fsdp2")])
    new = dict(head, command="new", commit="c2", date="d2",
               runs=[{"system": "outcore", "case": c} for c in ("3b-16k", "1b-16k")])
    for name, d in (("old", old), ("new", new)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    doc = mp.merge([mp.load(f"{tmp_path}/new.json#3b-16k"),
                    mp.load(f"{tmp_path}/old.json#1b-16k")])
    assert [(r["part"], r["system"], r["case"]) for r in doc["runs"]] == \
        [(0, "outcore", "3b-16k"), (1, "outcore", "1b-16k"), (1, "fsdp2", "1b-16k")]
    assert [p["cases_kept"] for p in doc["parts"]] == [["3b-16k"], ["1b-16k"]]
    with pytest.raises(SystemExit, match="no rows"):
        mp.load(f"{tmp_path}/new.json#7b-16k")


def test_merge_parts_keeps_only_the_systems_named(tmp_path):
    """FILE#CASE%SYSTEM: a part with one system's rows (its other system failed there and
    was measured again by a later command); the part records it; a system the file lacks
    is an error."""
    mp = load_stream_bench("merge_parts")
    head = {"benchmark": "stream", "machine": "nvidia-h200", "torch": "2.11", "gpus": ["H200"]}
    peers = dict(head, command="peers", commit="c1", date="d1",
                 runs=[{"system": "pytorch", "case": "7b-16k"},
                       {"system": "fsdp2", "case": "7b-16k", "error": "timed out"}])
    again = dict(head, command="again", commit="c2", date="d2",
                 runs=[{"system": "fsdp2", "case": "7b-16k", "step_s": 3.9}])
    for name, d in (("peers", peers), ("again", again)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    doc = mp.merge([mp.load(f"{tmp_path}/peers.json#7b-16k%pytorch"),
                    mp.load(f"{tmp_path}/again.json")])
    assert [(r["part"], r["system"], r.get("error")) for r in doc["runs"]] == \
        [(0, "pytorch", None), (1, "fsdp2", None)]
    assert doc["parts"][0]["systems_kept"] == ["pytorch"]
    assert doc["parts"][0]["cases_kept"] == ["7b-16k"]
    with pytest.raises(SystemExit, match="no rows"):
        mp.load(f"{tmp_path}/again.json%outcore")
