"""Reading in byte ranges: whatever the chunk size, the edges read and the line an error
names are those of reading the file in one piece."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.embed.graph import read_edges
from outcore.errors import OutcoreError

line = st.one_of(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)).map(lambda t: f"{t[0]}\t{t[1]}"),
    st.tuples(st.integers(0, 99), st.integers(0, 99)).map(lambda t: f"{t[0]},{t[1]}\r"),
    st.tuples(st.integers(0, 10**12), st.integers(0, 5)).map(lambda t: f"  {t[0]}  {t[1]} "),
    st.just(""))


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(line, min_size=1, max_size=40), final_newline=st.booleans(),
       chunk=st.sampled_from([1, 2, 3, 5, 8, 13, 64, 4096]))
def test_any_chunk_size_reads_the_same_edges(tmp_path_factory, lines, final_newline, chunk):
    if not any(s.strip() for s in lines):
        lines = lines + ["1\t2"]
    lines = ["7\t8"] + lines          # a numeric first line: no header guessed
    path = tmp_path_factory.mktemp("t") / "e.tsv"
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    whole = read_edges(str(path), chunk_bytes=1 << 20, self_loops="keep")
    cut = read_edges(str(path), chunk_bytes=chunk, self_loops="keep", threads=3)
    assert np.array_equal(whole.src.astype(np.int64), cut.src.astype(np.int64))
    assert np.array_equal(whole.dst.astype(np.int64), cut.dst.astype(np.int64))
    want = [tuple(int(x) for x in s.replace(",", " ").split()) for s in lines if s.strip()]
    assert list(zip(cut.src.tolist(), cut.dst.tolist())) == want


@pytest.mark.parametrize("chunk", [1, 7, 50, 1 << 20])
def test_error_names_the_same_line_whatever_the_chunks(tmp_path, chunk):
    lines = [f"{i}\t{i + 1}" for i in range(200)]
    lines[10] = ""                    # a blank line before the bad one shifts nothing
    lines[150] = "150\tx"
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(OutcoreError, match=r"bad.tsv, line 151\b"):
        read_edges(str(path), chunk_bytes=chunk, threads=4)


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_out_of_range_id_names_its_line_after_blank_lines(tmp_path, chunk):
    text = "0\t1\n\n\n1\t2\n\n2\t99\n3\t0\n"
    path = tmp_path / "range.tsv"
    path.write_text(text)
    with pytest.raises(OutcoreError, match=r"range.tsv, line 6: node id 99"):
        read_edges(str(path), num_nodes=10, chunk_bytes=chunk)


def test_short_preads_drop_no_lines(tmp_path, monkeypatch):
    """One pread may return fewer bytes than asked (Linux: at most 2 GiB - 4 KiB a call):
    a range is read to its end all the same."""
    import os

    from outcore.embed import textread
    lines = [f"{i}\t{i + 1}" for i in range(500)]
    path = tmp_path / "short.tsv"
    path.write_text("\n".join(lines) + "\n")
    real = os.pread
    monkeypatch.setattr(textread.os, "pread", lambda fd, n, off: real(fd, min(n, 100), off))
    el = read_edges(str(path), chunk_bytes=1 << 12, threads=2, self_loops="keep")
    assert el.src.tolist() == list(range(500)) and el.dst.tolist() == list(range(1, 501))
