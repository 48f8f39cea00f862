"""Fast edge-list text: parse chunks of bytes with numpy, format integer columns with numpy.

Sniffing (`sniff`): the file's first data lines, past a UTF-8 byte-order mark, blank and
comment lines ('#' or '%' first, anywhere in the file), decide the header, the column count
and whether ids are strings.

Parsing: a chunk (whole lines) has its separators (tab, comma, semicolon, CR) turned into
spaces, then `np.fromstring(sep=" ")` parses every number in C (about 2e7 edges/s on one
core, and it releases the GIL, so chunks parse in parallel threads). A vectorised check
then confirms every line held exactly `ncols` tokens; when it does not, the chunk is parsed
again line by line so the error names the offending line (or so that blank lines, comment
lines and trailing spaces, which are legal, are handled; so do ids beyond int64).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import OutcoreError

_SEP = bytes.maketrans(b"\t,;\r", b"    ")
_DIGITS = np.array([10**k for k in range(1, 19)], dtype=np.int64)
COMMENT = (b"#", b"%")          # a line whose first token starts so is a comment
# int64 ids: N = max id + 1 must fit too. np.fromstring saturates a larger token at the
# int64 limits: those values send a chunk to the line-by-line parse, which names the line.
_I64 = np.iinfo(np.int64)
MAX_ID = _I64.max - 1


def _bad_line(path, lineno, ncols, line: bytes, why: str) -> OutcoreError:
    text = line[:80].decode("utf-8", "replace")
    cols = "source target" + (" weight" if ncols == 3 else "")
    return OutcoreError(f"{path}, line {lineno}: {why} (expected {ncols} columns: {cols}); "
                        f"the line reads {text!r}: fix or delete it")


_BOM = b"\xef\xbb\xbf"      # UTF-8 byte-order mark, as Windows editors start files


def _is_int(tok: bytes) -> bool:
    return (tok[1:] if tok[:1] in (b"+", b"-") else tok).isdigit()


def _is_data(line: bytes) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith(COMMENT)


def _head_lines(path: str) -> tuple[int, list[bytes]]:
    """(bytes of a leading byte-order mark, whole lines of the file's head): the head grows
    until it holds two data lines (a header and an edge, or two edges) or the whole file,
    however long a comment preamble comes first."""
    size = 1 << 16
    while True:
        with open(path, "rb") as f:
            head = f.read(size)
        bom = len(_BOM) if head.startswith(_BOM) else 0
        lines = head[bom:].split(b"\n")
        if len(head) < size:
            return bom, lines
        lines = lines[:-1]                   # the last line may continue past the head
        if sum(map(_is_data, lines)) >= 2:
            return bom, lines
        size *= 4


def sniff(path: str, header: bool | None, string_ids: bool | None):
    """First lines -> (data offset in bytes, line number of first data line, ncols,
    header_present, string_ids)."""
    bom, lines = _head_lines(path)
    data = [k for k, line in enumerate(lines) if _is_data(line)]
    if not data:
        raise OutcoreError(f"{path} has no edges: write one 'source target [weight]' per line")
    i = data[0]
    first = lines[i].translate(_SEP).split()
    nxt = lines[data[1]].translate(_SEP).split() if len(data) > 1 else []
    first_numeric = len(first) >= 2 and _is_int(first[0]) and _is_int(first[1])
    if header is None:
        header = (not first_numeric) and len(nxt) >= 2 and _is_int(nxt[0]) and _is_int(nxt[1])
    if header:
        i += 1                               # data from the line after the header
        first = nxt
        first_numeric = len(first) >= 2 and _is_int(first[0]) and _is_int(first[1])
        if not first:
            raise OutcoreError(f"{path} has a header but no edges")
    offset = bom + sum(len(line) + 1 for line in lines[:i])
    lineno = i + 1
    if len(first) not in (2, 3):
        where = data[1] + 1 if header else lineno
        raise OutcoreError(f"{path}, line {where}: found {len(first)} columns; an edge list "
                           "has 2 (source target) or 3 (source target weight)")
    if string_ids is None:
        string_ids = not first_numeric
    return offset, lineno, len(first), bool(header), bool(string_ids)


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
    saturated = not weighted and vals.size and (vals.max() > MAX_ID or vals.min() == _I64.min)
    if vals.size == nlines * ncols and not saturated:
        c = np.frombuffer(s, dtype=np.uint8)
        tok = c > 32
        ends = np.flatnonzero(tok[:-1] & ~tok[1:])
        last = np.flatnonzero(c[ends + 1] == 10)     # index (in ends) of each line's last token
        # tokens per line = distance between consecutive line-final token ends
        if last.size == nlines and (np.diff(last, prepend=-1) == ncols).all():
            return vals.reshape(-1, ncols), None
    return _parse_slow(buf, ncols, first_line, path, weighted)


def _fields(buf: bytes, ncols: int, first_line: int, path: str):
    """(line number, fields, raw line) of each line that is neither blank nor a comment; a
    wrong column count raises naming the line."""
    for i, line in enumerate(buf.split(b"\n")):
        parts = line.translate(_SEP).split()
        if not parts or parts[0].startswith(COMMENT):
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
        big = next((v for v in row[:2] if not _I64.min < v <= MAX_ID), None)
        if big is not None:
            raise OutcoreError(f"{path}, line {lineno}: node id {big} is too large (ids are "
                               "0..N-1 with N below 2**63): renumber the nodes")
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
