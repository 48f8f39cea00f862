"""Edge files at their corners: comments anywhere, a UTF-8 byte-order mark, a leading '+',
ids beyond what the integer types hold, paths that are no file, and graphs whose largest
id is far beyond any table this machine could hold: each read right, or refused in one
line naming the line."""

import argparse

import numpy as np
import pytest

from outcore.embed import EmbedConfig, EmbeddingTrainer, read_edges
from outcore.embed.cli import register, run
from outcore.errors import OutcoreError


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def _cli(*argv):
    p = argparse.ArgumentParser(prog="outcore")
    register(p.add_subparsers(dest="command"))
    return run(p.parse_args(["embed", *argv]))


@pytest.mark.parametrize("chunk", [8, 1 << 22])
def test_comment_lines_after_the_first_edge_are_skipped(tmp_path, chunk):
    """'#' and '%' lines are comments wherever they are: with string ids one became an edge
    between nodes '#' and 'x'; with integer ids it was an error."""
    el = read_edges(_write(tmp_path, "n.tsv", "0 1\n# a note\n1 2\n  % x y z\n2 0\n"),
                    chunk_bytes=chunk)
    assert el.src.tolist() == [0, 1, 2] and el.dst.tolist() == [1, 2, 0]
    el = read_edges(_write(tmp_path, "w.tsv", "0 1 0.5\n# c\n1 2 2\n"), chunk_bytes=chunk)
    assert el.src.tolist() == [0, 1] and el.weight.tolist() == [0.5, 2.0]
    el = read_edges(_write(tmp_path, "s.tsv", "a b\n# x\nb c\n"), chunk_bytes=chunk)
    assert el.names == ["a", "b", "c"] and el.src.tolist() == [0, 1]
    with pytest.raises(OutcoreError, match=r"line 4: .*'1 x'"):    # line numbers still count
        read_edges(_write(tmp_path, "b.tsv", "0 1\n# c\n\n1 x\n"), chunk_bytes=chunk)


def test_a_long_comment_preamble_and_a_blank_line_after_the_header(tmp_path):
    """Over 64 KiB of leading comments read as 'no edges'; a blank line after a header made
    the header an edge between string ids 'src' and 'dst'."""
    preamble = "".join(f"# licence line {i} {'x' * 60}\n" for i in range(2000))
    el = read_edges(_write(tmp_path, "c.tsv", preamble + "0 1\n1 2\n"))
    assert el.src.tolist() == [0, 1]
    el = read_edges(_write(tmp_path, "h.tsv", "src dst\n\n# c\n0 1\n1 2\n"))
    assert el.stats["header"] and el.names is None and el.src.tolist() == [0, 1]
    with pytest.raises(OutcoreError, match=r"line 3: found 4 columns"):
        read_edges(_write(tmp_path, "f.tsv", "src dst\n\n0 1 2 3\n"))


def test_a_byte_order_mark_is_not_a_header(tmp_path):
    """Editors on Windows start UTF-8 files with EF BB BF: the first edge was taken for a
    header and dropped, and a first string id kept the mark in its name."""
    el = read_edges(_write(tmp_path, "n.csv", b"\xef\xbb\xbf0,1\n1,2\n2,3\n"))
    assert el.src.tolist() == [0, 1, 2] and not el.stats["header"]
    el = read_edges(_write(tmp_path, "s.csv", b"\xef\xbb\xbfa,b\nb,c\n"))
    assert el.names == ["a", "b", "c"]
    el = read_edges(_write(tmp_path, "h.csv", b"\xef\xbb\xbfsrc,dst\n0,1\n"))
    assert el.stats["header"] and el.src.tolist() == [0]


def test_a_plus_sign_is_part_of_an_integer_id(tmp_path):
    el = read_edges(_write(tmp_path, "p.tsv", "+0 1\n1 2\n2 +3\n"))
    assert el.src.tolist() == [0, 1, 2] and el.dst.tolist() == [1, 2, 3]
    assert el.names is None and not el.stats["header"]


@pytest.mark.parametrize("text,line", [
    ("0 1\n1 99999999999999999999999\n", 2),          # parsed in one pass (saturated)
    ("0 1\n\n1 99999999999999999999999\n", 3),        # line by line (overflowed)
    ("0 1\n1 9223372036854775807\n", 2),              # int64's max: N would not fit
    ("0 1 1\n1 99999999999999999999 1\n", 2),         # beside a weight (read as floats)
    ("0 1 1\n1 9007199254740993 1\n", 2),             # a float would round it
])
def test_ids_too_large_to_hold_name_their_line(tmp_path, text, line):
    with pytest.raises(OutcoreError, match=rf"line {line}: .*node id.*too large"):
        read_edges(_write(tmp_path, "big.tsv", text))


def test_paths_that_are_not_edge_files(tmp_path):
    with pytest.raises(OutcoreError, match="is a directory"):
        read_edges(str(tmp_path))
    with pytest.raises(OutcoreError, match="does not exist"):
        read_edges(str(tmp_path / "nope.tsv"))
    with pytest.raises(OutcoreError, match="not a regular file"):
        read_edges("/dev/null")
    good = _write(tmp_path, "g.tsv", "0 1\n")
    for bad in (0, -2):
        with pytest.raises(OutcoreError, match=rf"num_nodes={bad} must be a positive"):
            read_edges(good, num_nodes=bad)


def test_a_sparse_huge_id_is_refused_before_allocating(tmp_path):
    """One id of 10**12 makes a 10**12-row problem: a one-line error naming the id, not a
    MemoryError traceback from the degree count (or an hour of table writes)."""
    path = _write(tmp_path, "h.tsv", "0 1\n1 1000000000000\n")
    tr = EmbeddingTrainer(EmbedConfig(dim=4, epochs=1, devices=["cpu"], progress=False))
    with pytest.raises(OutcoreError, match=r"ids up to 1,000,000,000,000.*renumber"):
        tr.fit(read_edges(path))
    with pytest.raises(OutcoreError, match=r"ids up to 1,000,000,000,000"):
        _cli(path, "--out", str(tmp_path / "e.npy"), "--devices", "cpu", "--no-progress")


def test_edge_arrays_of_the_python_api_are_checked():
    tr = EmbeddingTrainer(EmbedConfig(dim=4, epochs=1, devices=["cpu"], progress=False))
    with pytest.raises(OutcoreError, match="integer node ids.*float64"):
        tr.fit((np.array([0.0, 1.0]), np.array([1.0, 2.0])))
    with pytest.raises(OutcoreError, match="num_nodes=0 must be a positive"):
        tr.fit(([0, 1], [1, 0]), num_nodes=0)


@pytest.mark.parametrize("field,value", [
    ("lr", float("inf")), ("neg_power", float("nan")), ("neg_power", -1.0),
    ("p", float("nan")), ("q", float("inf")), ("seed", -1), ("init_scale", float("nan")),
    ("init_scale", 0.0), ("eps", 0.0), ("margin", float("nan")), ("betas", (1.0, 0.999)),
    ("num_negatives", 1.5), ("gpu_memory", -5),
])
def test_non_finite_and_out_of_range_numbers_are_refused(field, value):
    with pytest.raises(OutcoreError, match=field):
        EmbedConfig(**{field: value}).validate()


def test_cli_number_options_are_one_line_errors(tmp_path):
    path = _write(tmp_path, "g.tsv", "0 1\n1 2\n2 0\n")
    out = str(tmp_path / "e.npy")
    for flag, value, what in (("--seed", "-1", "seed"), ("--lr", "inf", "lr"),
                              ("--neg-power", "nan", "neg_power"), ("--num-nodes", "0",
                                                                   "num_nodes")):
        with pytest.raises(OutcoreError, match=what):
            _cli(path, "--out", out, "--devices", "cpu", "--no-progress", flag, value)
