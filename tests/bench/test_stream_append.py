"""bench/stream.py --append: a results file filled by several commands keeps each command's
own header as a part, and each row names the part that measured it."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_stream_bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("stream_bench", ROOT / "bench" / "stream.py")
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
    # no file yet: the header as it is
    doc2 = bench.appended(dict(new, commit="ccc"), str(path.with_name("missing.json")))
    assert "parts" not in doc2 and bench.part_of(doc2) == {}   # nothing to append to
