"""Edge lists: read text (TSV/CSV/whitespace, optional header and weights, integer or
string ids) or .npy fast, validate, and hold them as int arrays.

Integer-id text is read by byte ranges in a thread pool (textread.py: reading, line
finding and parsing all run in the threads; about 1.2e7 edges/s on 2 cores); string ids
go through one dictionary, chunk after chunk. Errors name the file and line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import OutcoreError
from . import checked
from .textio import format_int_columns, parse_string_chunk, sniff
from .textread import read_numeric


@dataclass
class EdgeList:
    """src, dst: E int arrays (node ids 0..num_nodes-1); weight: E float32 or None.

    names: for string ids, names[i] is node i's original id. stats: what reading did
    (self-loops dropped, header skipped, ...), for the run summary. The arrays of one
    read_edges returns are read-only: training trusts them unchecked (see checked.py).
    """

    src: np.ndarray
    dst: np.ndarray
    num_nodes: int
    weight: np.ndarray | None = None
    names: list[str] | None = None
    stats: dict = field(default_factory=dict)
    _checked: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def degrees(self) -> np.ndarray:
        """num_nodes int64: edges touching each node (both ends counted)."""
        return (np.bincount(self.src, minlength=self.num_nodes)
                + np.bincount(self.dst, minlength=self.num_nodes)).astype(np.int64)


_FLOAT_EXACT = 2**53         # ids read beside a weight are float64: exact below this


def _chunks(path: str, offset: int, lineno: int, chunk_bytes: int):
    """Yield (bytes of whole lines, number of its first line)."""
    with open(path, "rb") as f:
        f.seek(offset)
        rest = b""
        while True:
            block = f.read(chunk_bytes)
            if not block:
                if rest.strip():
                    yield rest, lineno
                return
            block = rest + block
            cut = block.rfind(b"\n")
            if cut < 0:
                rest = block
                continue
            body, rest = block[:cut + 1], block[cut + 1:]
            yield body, lineno
            lineno += body.count(b"\n")


def read_edges(path: str, *, header: bool | None = None, string_ids: bool | None = None,
               num_nodes: int | None = None, self_loops: str = "drop",
               threads: int | None = None, chunk_bytes: int = 1 << 22) -> EdgeList:
    """Read an edge list: .npy (E x 2 or E x 3) or text, one 'source target [weight]' a line.

    header/string_ids: None = detect from the first lines. num_nodes: ids must lie in
    [0, num_nodes) (default: max id + 1). self_loops: "drop" (counted in stats),
    "keep", or "error".
    """
    if self_loops not in ("drop", "keep", "error"):
        raise OutcoreError(f"self_loops={self_loops!r} must be 'drop', 'keep' or 'error'")
    if num_nodes is not None and (isinstance(num_nodes, bool) or int(num_nodes) != num_nodes
                                  or num_nodes < 1):
        raise OutcoreError(f"num_nodes={num_nodes!r} must be a positive integer (ids are "
                           "0..num_nodes-1), or leave it out to take the largest id + 1")
    _check_file(path)
    if os.path.getsize(path) == 0:
        raise OutcoreError(f"{path} is empty: write one 'source target [weight]' per line")
    if path.endswith(".npy"):
        src, dst, w, where = _read_npy(path)
        names, stats = None, {}
    else:
        src, dst, w, names, where, stats = _read_text(path, header, string_ids, threads,
                                                      chunk_bytes)
    if len(src) == 0:
        raise OutcoreError(f"{path} has no edges")
    lo = min(int(src.min()), int(dst.min()))
    if lo < 0:
        k = int(np.flatnonzero((src < 0) | (dst < 0))[0])
        raise OutcoreError(f"{where(k)}: negative node id; ids must be 0..N-1")
    hi = max(int(src.max()), int(dst.max()))
    if num_nodes is None:
        num_nodes = hi + 1
    elif hi >= num_nodes:
        k = int(np.flatnonzero((src >= num_nodes) | (dst >= num_nodes))[0])
        raise OutcoreError(f"{where(k)}: node id {max(int(src[k]), int(dst[k]))} is out of "
                           f"range for num_nodes={num_nodes}: ids must be 0..{num_nodes - 1}")
    if w is not None:
        with np.errstate(over="ignore"):       # a weight beyond float32 becomes inf: named below
            w = _checked_weights(w.astype(np.float32), where)
    loops = src == dst
    n_loops = int(loops.sum())
    if n_loops and self_loops == "error":
        k = int(np.flatnonzero(loops)[0])
        raise OutcoreError(f"{where(k)}: self-loop {int(src[k])} -> {int(src[k])}; pass "
                           "self_loops='drop' to skip them")
    if n_loops and self_loops == "drop":
        src, dst, w = _drop_rows(np.flatnonzero(loops), src, dst, w)
        if len(src) == 0:
            raise OutcoreError(f"{path} holds only self-loops: no edges left to train on")
    if w is not None and not w.any():
        raise OutcoreError(f"{path}: every edge weight is 0: give some edge a positive "
                           "weight, or drop the weight column")
    stats["self_loops"] = n_loops
    stats["self_loops_dropped"] = n_loops if self_loops == "drop" else 0
    idt = np.int32 if num_nodes < 2**31 else np.int64
    return checked.mark(EdgeList(src.astype(idt, copy=False), dst.astype(idt, copy=False),
                                 num_nodes, w, names, stats))


def _check_file(path: str) -> None:
    """A one-line error unless `path` is a regular file."""
    if os.path.isdir(path):
        raise OutcoreError(f"edge file {path!r} is a directory: pass the edge list file "
                           "inside it")
    if not os.path.exists(path):
        raise OutcoreError(f"edge file {path!r} does not exist")
    if not os.path.isfile(path):
        raise OutcoreError(f"edge file {path!r} is not a regular file (a device or a pipe): "
                           "write the edges to a file first")


def _checked_weights(w: np.ndarray, where) -> np.ndarray:
    """w (float32, as training samples by it) if every weight is finite and >= 0, else a
    one-line error naming the first bad line: one NaN, inf or negative weight would
    silently break weighted sampling (a cumulative sum of the weights)."""
    bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
    if bad.size:
        k = int(bad[0])
        big = " (float32 holds at most 3.4e38)" if np.isinf(w[k]) else ""
        raise OutcoreError(f"{where(k)}: edge weight {float(w[k])!r} is not a finite number "
                           f">= 0{big}: fix that weight")
    return w


def _drop_rows(rows: np.ndarray, *cols):
    """cols without the given (sorted) rows; None columns stay None. A few rows: copies of
    the runs between them (memcpy speed); many: a boolean mask."""
    if len(rows) > 4096:
        keep = np.ones(len(cols[0]), dtype=bool)
        keep[rows] = False
        return tuple(None if c is None else c[keep] for c in cols)
    bounds = np.concatenate([[-1], rows, [len(cols[0])]])
    runs = [(a + 1, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]
    return tuple(None if c is None else np.concatenate([c[a:b] for a, b in runs])
                 if runs else c[:0] for c in cols)


def _read_npy(path):
    try:
        a = np.load(path, mmap_mode="r")
    except ValueError as e:
        raise OutcoreError(f"{path} is not a readable .npy array ({e})") from None
    if a.ndim != 2 or a.shape[1] not in (2, 3):
        raise OutcoreError(f"{path} has shape {a.shape}: an edge array is E x 2 (source, "
                           "target) or E x 3 (with weights)")
    if a.shape[1] == 2 and not np.issubdtype(a.dtype, np.integer):
        raise OutcoreError(f"{path} holds {a.dtype}: node ids must be integers")
    src = np.asarray(a[:, 0]).astype(np.int64)
    dst = np.asarray(a[:, 1]).astype(np.int64)
    w = np.asarray(a[:, 2]).astype(np.float64) if a.shape[1] == 3 else None
    if a.shape[1] == 3 and not (np.all(np.floor(a[:, 0]) == a[:, 0])
                                and np.all(np.floor(a[:, 1]) == a[:, 1])):
        raise OutcoreError(f"{path}: node ids in columns 0 and 1 must be whole numbers")
    return src, dst, w, (lambda k: f"{path}, row {k}")


def _read_text(path, header, string_ids, threads, chunk_bytes):
    offset, lineno, ncols, has_header, string_ids = sniff(path, header, string_ids)
    weighted = ncols == 3
    stats = {"header": has_header, "string_ids": string_ids, "weighted": weighted}
    parts, where_parts = [], []          # per chunk: values, (first line, line numbers)
    names, w = None, None
    if string_ids:
        ids: dict = {}
        ws = []
        for buf, first in _chunks(path, offset, lineno, chunk_bytes):
            arr, wc, ln = parse_string_chunk(buf, ncols, first, path, weighted, ids)
            parts.append(arr)
            ws.append(wc)
            where_parts.append((first, ln))
        vals = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
        w = np.concatenate(ws) if weighted and ws else None
        names = [k.decode("utf-8", "replace") for k in ids]
        src, dst = vals[:, 0], vals[:, 1]
        where = _line_lookup(path, [len(v) for v in parts], where_parts)
        return src, dst, w, names, where, stats
    workers = threads or min(32, os.cpu_count() or 1)
    cols, where_parts, sizes = read_numeric(path, offset, lineno, ncols, weighted, workers,
                                            chunk_bytes)
    where = _line_lookup(path, sizes, where_parts)
    src, dst = cols[0], cols[1]      # int32 when every chunk's ids fit, else int64
    if weighted:
        bad = np.flatnonzero((src != np.floor(src)) | (dst != np.floor(dst)))
        if bad.size:
            raise OutcoreError(f"{where(int(bad[0]))}: node ids must be integers")
        big = np.flatnonzero((np.abs(src) >= _FLOAT_EXACT) | (np.abs(dst) >= _FLOAT_EXACT))
        if big.size:
            raise OutcoreError(f"{where(int(big[0]))}: node id too large to read exactly beside "
                               f"a weight column (below 2**53 there): renumber the nodes 0..N-1")
        w = cols[2]
        src, dst = src.astype(np.int64), dst.astype(np.int64)
    return src, dst, w, names, where, stats


def _line_lookup(path, sizes, where_parts):
    """Edge index -> 'path, line N' (used only to word an error)."""
    def where(k: int) -> str:
        for n, (first, ln) in zip(sizes, where_parts):
            if k < n:
                # a chunk parsed on the fast path has no blank lines: lines are consecutive
                return f"{path}, line {int(ln[k]) if ln is not None else first + k}"
            k -= n
        return f"{path}, edge {k}"
    return where


def write_edges(path: str, src: np.ndarray, dst: np.ndarray, header: bool = False,
                chunk: int = 1 << 22) -> None:
    """Write integer edges as TSV ('source\\ttarget' lines), vectorised, in chunks."""
    with open(path, "wb") as f:
        if header:
            f.write(b"source\ttarget\n")
        for a in range(0, len(src), chunk):
            f.write(format_int_columns(src[a:a + chunk], dst[a:a + chunk]))


def write_names(path: str, names: list[str]) -> None:
    """index<TAB>original id, one line per node (written beside string-id embeddings)."""
    with open(path, "w", encoding="utf-8") as f:
        for i, n in enumerate(names):
            f.write(f"{i}\t{n}\n")


def csr(num_nodes: int, src: np.ndarray, dst: np.ndarray, undirected: bool = True):
    """Adjacency in CSR: (indptr: N+1 int64, indices: E' int64 sorted within each row)."""
    if undirected:
        s = np.concatenate([src, dst]).astype(np.int64)
        d = np.concatenate([dst, src]).astype(np.int64)
    else:
        s, d = src.astype(np.int64), dst.astype(np.int64)
    order = np.lexsort((d, s))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(s, minlength=num_nodes), out=indptr[1:])
    return indptr, d[order]
