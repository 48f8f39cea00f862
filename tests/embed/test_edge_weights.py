"""Edge weights: one NaN, inf or negative weight (or all zero) is a one-line error naming
its line, never a silently collapsed weighted sampler."""

import numpy as np
import pytest

from outcore.embed.graph import read_edges
from outcore.errors import OutcoreError


def _lines(tmp_path, name, bad, at=2500, n=3000):
    lines = [f"{i}\t{i + 1}\t1.5" for i in range(n)]
    lines[at] = f"{at}\t{at + 1}\t{bad}"
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "-0.5", "1e39"])
def test_bad_weight_names_its_line(tmp_path, bad):
    path = _lines(tmp_path, "w.tsv", bad)
    with pytest.raises(OutcoreError, match=r"w.tsv, line 2501: edge weight .* is not a finite "
                                           r"number >= 0"):
        read_edges(path, chunk_bytes=1024, threads=2)


def test_bad_weight_with_string_ids_and_header(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("src,dst,w\na,b,1\nb,c,nan\n")
    with pytest.raises(OutcoreError, match=r"s.csv, line 3: edge weight nan"):
        read_edges(str(p), header=True)         # string ids: a header is not detected


def test_bad_weight_in_npy_names_its_row(tmp_path):
    a = np.array([[0, 1, 1.0], [1, 2, 2.0], [2, 0, -1.0]])
    p = str(tmp_path / "e.npy")
    np.save(p, a)
    with pytest.raises(OutcoreError, match=r"e.npy, row 2: edge weight -1.0"):
        read_edges(p)


def test_zero_weights_are_fine_unless_all_are(tmp_path):
    p = tmp_path / "z.tsv"
    p.write_text("0 1 0\n1 2 2\n2 2 5\n")
    el = read_edges(str(p))                      # the self-loop (the only other > 0) dropped
    np.testing.assert_array_equal(el.weight, [0, 2])
    assert el.weight.dtype == np.float32
    p.write_text("0 1 0\n1 2 0\n2 2 5\n")
    with pytest.raises(OutcoreError, match="every edge weight is 0"):
        read_edges(str(p))
