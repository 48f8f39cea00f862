"""JSONL records split at "\\n" only: raw U+2028, U+2029 and U+0085 inside a JSON string
(json.dumps(..., ensure_ascii=False) writes them) stay in their record; a BOM is accepted."""

import json

import pytest

from outcore.data import read_documents
from outcore.errors import OutcoreError

SEPARATORS = ["\u2028", "\u2029", "\u0085"]


def _write(path, text: str):
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("sep", SEPARATORS)
def test_unicode_line_separators_stay_inside_a_record(tmp_path, sep):
    recs = [{"text": f"one{sep}two"}, {"prompt": f"p{sep}", "response": f"{sep}r"}]
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    assert sep in body                               # written raw, not escaped
    docs = read_documents(_write(tmp_path / "d.jsonl", body))
    assert docs == [("", f"one{sep}two"), (f"p{sep}", f"{sep}r")]


def test_line_numbers_do_not_drift_past_a_separator(tmp_path):
    body = (json.dumps({"text": "a\u2028b\u2029c\u0085d"}, ensure_ascii=False) + "\n"
            + json.dumps({"text": "ok"}) + "\n" + "{broken\n")
    with pytest.raises(OutcoreError, match=r"d.jsonl: line 3 is not valid JSON"):
        read_documents(_write(tmp_path / "d.jsonl", body))


def test_bom_and_crlf_are_accepted(tmp_path):
    body = ("\ufeff" + json.dumps({"text": "first"}) + "\r\n\r\n"
            + json.dumps({"text": "x"}) + "\r\n")
    assert read_documents(_write(tmp_path / "d.jsonl", body)) == [("", "first"), ("", "x")]
    bad = "\ufeff" + json.dumps({"text": "first"}) + "\r\n[1]\r\n"
    with pytest.raises(OutcoreError, match=r"line 2 is not a JSON object"):
        read_documents(_write(tmp_path / "e.jsonl", bad))
