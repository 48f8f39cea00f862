"""Fast edge-list text: parse chunks of bytes with numpy, format integer columns with numpy.

Parsing: a chunk (whole lines) has its separators (tab, comma, semicolon, CR) turned into
spaces, then `np.fromstring(sep=" ")` parses every number in C (about 2e7 edges/s on one
core, and it releases the GIL, so chunks parse in parallel threads). A vectorised check
then confirms every line held exactly `ncols` tokens; when it does not, the chunk is parsed
again line by line so the error names the offending line (or so that blank lines and
trailing spaces, which are legal, are handled).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import OutcoreError

_SEP = bytes.maketrans(b"\t,;\r", b"    ")
_DIGITS = np.array([10**k for k in range(1, 19)], dtype=np.int64)


def _bad_line(path, lineno, ncols, line: bytes, why: str) -> OutcoreError:
    text = line[:80].decode("utf-8", "replace")
    cols = "source target" + (" weight" if ncols == 3 else "")
    return OutcoreError(f"{path}, line {lineno}: {why} (expected {ncols} columns: {cols}); "
                        f"the line reads {text!r}: fix or delete it")


def parse_numeric_chunk(buf: bytes, ncols: int, first_line: int, path: str,
                        weighted: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Whole lines of numbers -> (values: n x ncols, line numbers or None if consecutive).

    values are int64 (ids only) or float64 (when weighted). `first_line` is the 1-based
    number of the chunk's first line, used in error messages.
    """
    if not buf.endswith(b"\n"):
        buf = buf + b"\n"
    s = buf.translate(_SEP)
    dtype = np.float64 if weighted else np.int64
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # a bad token only stops the parse early
            vals = np.fromstring(s, dtype=dtype, sep=" ")
    except ValueError:                           # numpy >= 2.3 raises on a bad token
        return _parse_slow(buf, ncols, first_line, path, weighted)
    nlines = s.count(b"\n")
    if vals.size == nlines * ncols:
        c = np.frombuffer(s, dtype=np.uint8)
        tok = c > 32
        ends = np.flatnonzero(tok[:-1] & ~tok[1:])
        last = np.flatnonzero(c[ends + 1] == 10)     # index (in ends) of each line's last token
        # tokens per line = distance between consecutive line-final token ends
        if last.size == nlines and (np.diff(last, prepend=-1) == ncols).all():
            return vals.reshape(-1, ncols), None
    return _parse_slow(buf, ncols, first_line, path, weighted)


def _fields(buf: bytes, ncols: int, first_line: int, path: str):
    """(line number, fields, raw line) of each non-blank line; a wrong column count raises
    naming the line."""
    for i, line in enumerate(buf.split(b"\n")):
        parts = line.translate(_SEP).split()
        if not parts:
            continue
        lineno = first_line + i
        if len(parts) != ncols:
            raise _bad_line(path, lineno, ncols, line, f"found {len(parts)} columns")
        yield lineno, parts, line


def _parse_slow(buf, ncols, first_line, path, weighted):
    """Line by line: raises naming the first bad line; skips blank lines."""
    rows, lines = [], []
    conv = float if weighted else int
    for lineno, parts, line in _fields(buf, ncols, first_line, path):
        try:
            row = [int(parts[0]), int(parts[1])]
            if weighted:
                row.append(float(parts[2]))
        except ValueError:
            raise _bad_line(path, lineno, ncols, line,
                            "a node id is not an integer or the weight not a number") from None
        rows.append([conv(x) for x in row])
        lines.append(lineno)
    dtype = np.float64 if weighted else np.int64
    vals = np.array(rows, dtype=dtype).reshape(-1, ncols)
    return vals, np.array(lines, dtype=np.int64)


def parse_string_chunk(buf: bytes, ncols: int, first_line: int, path: str, weighted: bool,
                       ids: dict) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Lines of string ids -> (src/dst ids: n x 2 int64, weights or None, line numbers).

    `ids` (name -> index) grows as new names appear, in order of first appearance.
    """
    pairs, weights, lines = [], [], []
    for lineno, parts, line in _fields(buf, ncols, first_line, path):
        a = ids.setdefault(parts[0], len(ids))
        b = ids.setdefault(parts[1], len(ids))
        pairs.append((a, b))
        if weighted:
            try:
                weights.append(float(parts[2]))
            except ValueError:
                raise _bad_line(path, lineno, ncols, line, "the weight is not a number") from None
        lines.append(lineno)
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    w = np.array(weights, dtype=np.float64) if weighted else None
    return arr, w, np.array(lines, dtype=np.int64)


def format_int_columns(*cols: np.ndarray) -> bytes:
    """Non-negative integer columns (each n) -> b"a\\tb\\n..." text, vectorised."""
    n = len(cols[0])
    parts = []
    for j, x in enumerate(cols):
        x = np.asarray(x, dtype=np.int64)
        if n and x.min() < 0:
            raise OutcoreError("format_int_columns writes non-negative ids only")
        width = int(np.searchsorted(_DIGITS, x.max(initial=0), side="right")) + 1
        nd = np.searchsorted(_DIGITS, x, side="right") + 1          # digits per value
        mat = np.empty((n, width), dtype=np.uint8)
        y = x.copy()
        for k in range(width - 1, -1, -1):
            mat[:, k] = (y % 10 + 48).astype(np.uint8)
            y //= 10
        mat[np.arange(width)[None, :] < (width - nd)[:, None]] = 0   # drop leading zeros
        parts.append(mat)
        parts.append(np.full((n, 1), 10 if j == len(cols) - 1 else 9, dtype=np.uint8))
    line = np.hstack(parts)
    return line[line != 0].tobytes()
