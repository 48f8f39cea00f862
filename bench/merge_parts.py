"""Join results files measured by separate commands into one file of parts.

    python3 bench/merge_parts.py stream-h200 first.json second.json ...

What `bench/stream.py --append` writes when the earlier part's file is in the tree: each
input becomes one part (its own command, commit, date, torch, GPU tests), each row is
tagged with its part's index, the rows keep every figure as measured. The inputs must be
one benchmark's files from one machine kind; nothing is recomputed or edited.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def merge(docs: list[dict]) -> dict:
    kinds = {(d.get("benchmark"), d.get("machine")) for d in docs}
    if len(kinds) != 1:
        raise SystemExit(f"inputs come from different benchmarks or machines: {sorted(kinds)}")
    out = None
    for d in docs:
        rows = d.pop("runs")
        if d.get("parts"):
            raise SystemExit("an input is already in parts: merge single-command files")
        out = dict(d, runs=[]) if out is None else common.join_parts(out, d)
        part = len(out.get("parts", [None])) - 1
        out["runs"] += [dict(r, part=part) for r in rows]
    out["merged_by"] = " ".join(["python3"] + sys.argv)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="output: bench/results/NAME.json")
    ap.add_argument("inputs", nargs="+", type=Path, help="results files, oldest first")
    args = ap.parse_args()
    docs = [json.loads(p.read_text()) for p in args.inputs]
    print(common.write(merge(docs), args.name))


if __name__ == "__main__":
    main()
