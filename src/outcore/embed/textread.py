"""Numeric edge-list text read in parallel: every stage of a chunk runs in a worker thread.

The data bytes [start, size) are cut into ranges of `chunk_bytes`. A line belongs to the
range holding its first byte, so each worker can find its own lines without the others:
it reads its range with os.pread (which releases the GIL) plus the byte before it (is the
range's first byte a line start?) and, past the range's end, up to the newline that ends
its last line. It then counts its lines and parses them (textio.parse_numeric_chunk), all
in the thread. The main thread only stitches the chunks in file order and numbers lines.

Line numbers: a worker parses with its chunk's lines numbered from 1. Good chunks need no
numbers (or carry relative ones, shifted here); a chunk that fails is parsed again here
with its true first line, so the error names the file's line.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import OutcoreError
from .textio import parse_numeric_chunk

_TAIL = 1 << 16     # bytes read at a time past a range's end, to finish its last line


@dataclass
class Chunk:
    """One range's lines: ncols contiguous columns of n values (int32 when the ids fit, else
    int64; float64 when weighted), line numbers relative to the chunk's first line (None:
    consecutive), newline count."""

    cols: tuple | None
    rel_lines: np.ndarray | None
    newlines: int
    failed: bytes | None = None      # the chunk's bytes when parsing raised


def _pread(fd: int, n: int, off: int) -> bytes:
    """n bytes at off, fewer only at the end of the file: one pread may return less (Linux
    reads at most 2 GiB - 4 KiB a call), and a short range would silently drop lines."""
    parts = []
    while n > 0:
        data = os.pread(fd, n, off)
        if not data:
            break
        parts.append(data)
        n, off = n - len(data), off + len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def range_lines(fd: int, size: int, start: int, a: int, b: int) -> bytes:
    """The whole lines whose first byte lies in [a, b) (start: where data begins)."""
    lo = a - 1 if a > start else a
    data = _pread(fd, b - lo, lo)
    if a > start:
        nl = data.find(b"\n")
        if nl < 0:
            return b""                   # no line starts here: a longer one covers it
        data = data[nl + 1:]             # from the first line start at or after a
        if not data:
            return b""
    pos, tail = b, []
    last = data
    while not last.endswith(b"\n") and pos < size:   # finish the line that crosses b
        more = os.pread(fd, _TAIL, pos)
        if not more:
            break                        # the file ended early (shrunk while read)
        cut = more.find(b"\n")
        tail.append(more if cut < 0 else more[:cut + 1])
        pos += len(more)
        last = tail[-1]
        if cut >= 0:
            break
    return data + b"".join(tail)


def _work(fd, size, start, a, b, ncols, path, weighted) -> Chunk:
    body = range_lines(fd, size, start, a, b)
    if not body.strip():
        return Chunk(None, None, body.count(b"\n"))
    try:
        vals, rel = parse_numeric_chunk(body, ncols, 1, path, weighted)
    except OutcoreError:
        return Chunk(None, None, body.count(b"\n"), failed=body)
    # columns split here, in the thread (a strided copy of each); ids below 2**31 are kept
    # as int32: half the memory
    narrow = not weighted and vals.size and vals.max() < 2**31 and vals.min() >= -2**31
    cols = tuple(vals[:, j].astype(np.int32 if narrow else vals.dtype)
                 for j in range(vals.shape[1]))
    return Chunk(cols, rel, body.count(b"\n"))


def read_numeric(path: str, start: int, first_line: int, ncols: int, weighted: bool,
                 workers: int, chunk_bytes: int):
    """-> (ncols columns, each concatenated in file order; [(first line, line numbers or
    None)] and the edge count of each chunk, for error messages)."""
    size = os.path.getsize(path)
    parts, where_parts = [], []
    line = first_line

    def take(c: Chunk) -> None:
        nonlocal line
        if c.failed is not None:     # parse again with true line numbers: this raises
            parse_numeric_chunk(c.failed, ncols, line, path, weighted)
            raise OutcoreError(f"{path}: could not parse the lines from line {line}")
        if c.cols is not None and len(c.cols[0]):
            parts.append(c.cols)
            where_parts.append((line, None if c.rel_lines is None
                                else c.rel_lines + (line - 1)))
        line += c.newlines

    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(workers) as pool:
            window: list = []        # chunks in flight: bounded, so memory is too
            for a in range(start, size, chunk_bytes):
                b = min(a + chunk_bytes, size)
                window.append(pool.submit(_work, fd, size, start, a, b, ncols, path, weighted))
                if len(window) > 2 * workers:
                    take(window.pop(0).result())
            for fut in window:
                take(fut.result())
    finally:
        os.close(fd)
    cols = [np.concatenate([p[j] for p in parts]) if parts else np.zeros(0, np.int64)
            for j in range(ncols)]
    return cols, where_parts, [len(p[0]) for p in parts]
