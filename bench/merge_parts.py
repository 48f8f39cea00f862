"""Join results files measured by separate commands into one file of parts.

    python3 bench/merge_parts.py stream-h200 first.json second.json@last ...

What `bench/stream.py --append` writes when the earlier part's file is in the tree: each
input becomes one part (its own command, commit, date, torch, GPU tests), each row is
tagged with its part's index, the rows keep every figure as measured. The inputs must be
one benchmark's files from one machine kind; nothing is recomputed or edited.
`FILE@last` takes only the newest part of a file already in parts (what one --append
command added; its header is that file's top level), `FILE@N` its part N (its header from
that part's entry). A `#CASE[,CASE]` suffix keeps only those cases' rows of that input
(the part records `cases_kept`), and a `%SYSTEM[,SYSTEM]` suffix after it only those
systems' rows (`systems_kept`: a run whose other systems failed and ran again in a later
command). A stream file gets its plot too.
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
    summaries: list[dict | None] = []
    for d in docs:
        rows = d.pop("runs")
        if d.get("parts"):
            raise SystemExit("an input is already in parts: merge single-command files")
        summaries.append(d.get("summary"))
        out = dict(d, runs=[]) if out is None else common.join_parts(out, d)
        part = len(out.get("parts", [None])) - 1
        out["runs"] += [dict(r, part=part) for r in rows]
    if any(summaries):
        # Each part's summary figures came from its own rows (one command); the top level
        # takes every figure some part measured, the newest where two did.
        for p, sm in zip(out["parts"], summaries):
            p["summary"] = sm
        top: dict = {}
        for sm in summaries:
            top.update({k: v for k, v in (sm or {}).items() if v is not None})
        out["summary"] = top
    out["merged_by"] = " ".join(["python3"] + sys.argv)
    return out


def one_part(doc: dict, which: str = "last") -> dict:
    """Part `which` ("last" or an index) of a file in parts as a single-command file: its
    rows (untagged) and its header (the top level, which an --append command leaves as
    its own, updated with the part's entry)."""
    parts = doc.pop("parts", None)
    if not parts:
        raise SystemExit(f"@{which}: the file is not in parts; name it without @{which}")
    k = len(parts) - 1 if which == "last" else int(which)
    if not 0 <= k < len(parts):
        raise SystemExit(f"@{which}: the file has parts 0 to {len(parts) - 1}")
    doc.pop("merged_by", None)
    if k != len(parts) - 1:
        doc.pop("summary", None)   # the top level's is the newest command's, not part k's
    doc.update(parts[k])
    doc["runs"] = [{key: v for key, v in r.items() if key != "part"}
                   for r in doc["runs"] if r.get("part") == k]
    return doc


def load(arg: str) -> dict:
    arg, _, systems = arg.partition("%")
    arg, _, cases = arg.partition("#")
    path, _, which = arg.partition("@")
    if which not in ("", "last") and not which.isdigit():
        raise SystemExit(f"{arg}: only FILE, FILE@last or FILE@N (a part's index), then "
                         "#CASE[,CASE] and %SYSTEM[,SYSTEM] if you like")
    doc = json.loads(Path(path).read_text())
    doc = one_part(doc, which) if which else doc
    doc = only(doc, "case", cases.split(","), "#") if cases else doc
    return only(doc, "system", systems.split(","), "%") if systems else doc


def only(doc: dict, key: str, names: list[str], mark: str) -> dict:
    """`doc` with the rows whose `key` ("case" or "system") is one of `names` alone (a
    part whose other cases or systems a newer command measured again); the part says
    which it kept (`cases_kept`, `systems_kept`), and its summary (figures of every row)
    is dropped. `mark`: the suffix's sign, for the message."""
    missing = [x for x in names if not any(r.get(key) == x for r in doc["runs"])]
    if missing:
        raise SystemExit(f"{mark}{','.join(names)}: no rows of {missing} in that file")
    doc["runs"] = [r for r in doc["runs"] if r.get(key) in names]
    doc[f"{key}s_kept"] = names
    doc.pop("summary", None)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="output: bench/results/NAME.json")
    ap.add_argument("inputs", nargs="+", help="results files, oldest first (FILE@last: the "
                    "newest part of a file in parts; FILE@N: its part N; then #CASE,... "
                    "keeps only those cases' rows, %SYSTEM,... those systems')")
    args = ap.parse_args()
    doc = merge([load(a) for a in args.inputs])
    print(common.write(doc, args.name))
    if doc.get("benchmark") == "stream":
        from stream_record import plot
        from stream import CASES
        plot(doc, common.RESULTS / f"{args.name}.png", CASES)


if __name__ == "__main__":
    main()
