"""Edge-list reading: fast path equals the slow truth; errors name file and line."""

import numpy as np
import pytest

from outcore.embed.graph import read_edges, write_edges, csr
from outcore.embed.textio import format_int_columns, parse_numeric_chunk
from outcore.errors import OutcoreError


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return str(p)


def test_fast_parse_matches_numpy_across_chunks(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 10**7, size=(20000, 2))
    path = str(tmp_path / "e.tsv")
    write_edges(path, a[:, 0], a[:, 1])
    el = read_edges(path, chunk_bytes=4096, threads=2, self_loops="keep")
    assert el.src.dtype == np.int32
    np.testing.assert_array_equal(el.src, a[:, 0])
    np.testing.assert_array_equal(el.dst, a[:, 1])
    assert el.num_nodes == a.max() + 1


def test_format_int_columns_roundtrip():
    x = np.array([0, 7, 10, 99, 123456789012])
    y = np.array([5, 0, 1000, 3, 1])
    text = format_int_columns(x, y).decode()
    assert text == "".join(f"{a}\t{b}\n" for a, b in zip(x, y))


@pytest.mark.parametrize("sep", ["\t", ",", " ", "  "])
def test_separators_header_comments_weights(tmp_path, sep):
    body = f"# comment\n% other\nsrc{sep}dst{sep}w\n0{sep}1{sep}0.5\n2{sep}3{sep}1e-1\n\n4{sep}0{sep}2\n"
    el = read_edges(_write(tmp_path, "w.txt", body))
    assert el.stats["header"] and el.stats["weighted"]
    assert el.src.tolist() == [0, 2, 4] and el.dst.tolist() == [1, 3, 0]
    np.testing.assert_allclose(el.weight, [0.5, 0.1, 2.0])


def test_string_ids_are_mapped_in_order(tmp_path):
    el = read_edges(_write(tmp_path, "s.csv", "alice,bob\nbob,carol\ncarol,alice\n"))
    assert el.names == ["alice", "bob", "carol"]
    assert el.src.tolist() == [0, 1, 2] and el.dst.tolist() == [1, 2, 0]


def test_malformed_line_names_its_number(tmp_path):
    lines = [f"{i}\t{i + 1}" for i in range(3000)]
    lines[2500] = "2500\t2501\t7\t9"
    path = _write(tmp_path, "bad.tsv", "\n".join(lines) + "\n")
    with pytest.raises(OutcoreError, match=r"bad.tsv, line 2501: found 4 columns"):
        read_edges(path, chunk_bytes=1024)
    lines[2500] = "2500\tx"
    path = _write(tmp_path, "bad2.tsv", "\n".join(lines) + "\n")
    with pytest.raises(OutcoreError, match=r"line 2501: a node id is not an integer"):
        read_edges(path, chunk_bytes=1024)


def test_out_of_range_empty_and_self_loops(tmp_path):
    path = _write(tmp_path, "r.tsv", "0 1\n1 2\n2 2\n3 9\n")
    with pytest.raises(OutcoreError, match=r"line 4: node id 9 is out of range"):
        read_edges(path, num_nodes=5)
    neg = _write(tmp_path, "n.tsv", "0 1\n-3 2\n")
    with pytest.raises(OutcoreError, match=r"line 2: negative node id"):
        read_edges(neg)
    with pytest.raises(OutcoreError, match="is empty"):
        read_edges(_write(tmp_path, "empty.tsv", ""))
    with pytest.raises(OutcoreError, match="has no edges"):
        read_edges(_write(tmp_path, "c.tsv", "# only a comment\n"))
    el = read_edges(_write(tmp_path, "l.tsv", "0 1\n2 2\n1 0\n"))
    assert len(el) == 2 and el.stats["self_loops_dropped"] == 1
    assert len(read_edges(_write(tmp_path, "k.tsv", "0 1\n2 2\n"), self_loops="keep")) == 2
    with pytest.raises(OutcoreError, match=r"line 2: self-loop 2 -> 2"):
        read_edges(_write(tmp_path, "e.tsv", "0 1\n2 2\n"), self_loops="error")
    with pytest.raises(OutcoreError, match="only self-loops"):
        read_edges(_write(tmp_path, "o.tsv", "1 1\n"))


def test_npy_input(tmp_path):
    a = np.array([[0, 1], [1, 2], [2, 0]], dtype=np.int64)
    p = str(tmp_path / "e.npy")
    np.save(p, a)
    el = read_edges(p)
    assert el.src.tolist() == [0, 1, 2] and el.num_nodes == 3
    np.save(p, np.zeros((3, 4)))
    with pytest.raises(OutcoreError, match="shape"):
        read_edges(p)


def test_slow_path_allows_trailing_space_and_blank_lines():
    vals, lines = parse_numeric_chunk(b"1 2 \n\n3 4\n", 2, 10, "f", False)
    assert vals.tolist() == [[1, 2], [3, 4]] and lines.tolist() == [10, 12]


def test_csr_sorted_rows():
    indptr, idx = csr(4, np.array([0, 0, 2]), np.array([3, 1, 1]))
    assert indptr.tolist() == [0, 2, 4, 5, 6]
    assert idx.tolist() == [1, 3, 0, 2, 1, 0]
