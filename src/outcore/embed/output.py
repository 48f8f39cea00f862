"""Write embeddings (row i = node i) as .npy, .safetensors or .tsv, in chunks of rows, so a
table larger than RAM is never materialised whole; string ids go beside them.

Writes are atomic: every file goes to a temporary name in its own directory and is renamed
over the target only once complete, so a run killed while writing leaves the previous
embeddings (or none), never a truncated or zero-filled file.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..errors import OutcoreError
from .graph import write_names
from .table import EmbeddingTable

FORMATS = ("npy", "safetensors", "tsv")


def _fmt_of(path: str, fmt: str | None) -> str:
    if fmt is None:
        ext = os.path.splitext(path)[1].lstrip(".").lower()
        fmt = {"npy": "npy", "safetensors": "safetensors", "tsv": "tsv", "txt": "tsv"}.get(ext)
        if fmt is None:
            raise OutcoreError(f"cannot tell the format of {path!r}: end it in .npy, "
                               ".safetensors or .tsv, or pass --format")
    if fmt not in FORMATS:
        raise OutcoreError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def check_output_path(path: str, fmt: str | None = None) -> str:
    """Raise a one-line error unless `path` can be written (its format known, not a folder,
    its folder creatable and writable); -> the format. Cheap: call it before training."""
    fmt = _fmt_of(path, fmt)
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise OutcoreError(f"output {path!r} is a directory: give a file name such as "
                           f"{os.path.join(path, 'emb.' + fmt)}")
    parent = os.path.dirname(full)
    probe = parent
    while not os.path.exists(probe):          # the nearest part of the path that exists
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutcoreError(f"cannot write {path!r}: {probe} is a file, not a directory; "
                           "choose another output path")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "its directory" if probe == parent else f"{probe} (to create its directory)"
        raise OutcoreError(f"cannot write {path!r}: no write permission on {what}; "
                           "choose another output path")
    return fmt


def _temp_name(path: str) -> str:
    """A name beside `path` (same directory, so os.replace is a rename); not hidden, so a
    run killed mid-write leaves a partial file the user can see and delete."""
    d, base = os.path.split(os.path.abspath(path))
    return os.path.join(d, f"{base}.{os.getpid()}.tmp")


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_rows(tmp: str, fmt: str, blocks, N: int, W: int, sides: int, names) -> None:
    if fmt == "npy":
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(N, W))
        for a, rows in blocks:
            out[a:a + len(rows)] = rows
        out.flush()
        del out
    elif fmt == "safetensors":
        # The format is an 8-byte header length, a JSON header, then raw little-endian
        # data: written directly so rows can stream in chunks.
        header = {"embeddings": {"dtype": "F32", "shape": [N, W],
                                 "data_offsets": [0, N * W * 4]},
                  "__metadata__": {"rows": "node id", "sides": str(sides)}}
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for _, rows in blocks:
                f.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            for a, rows in blocks:
                ids = (names[a:a + len(rows)] if names is not None
                       else [str(i) for i in range(a, a + len(rows))])
                body = np.char.mod("%.6g", rows)
                f.write("".join(f"{i}\t" + "\t".join(r) + "\n" for i, r in zip(ids, body)))
    _fsync(tmp)


def save_embeddings(table: EmbeddingTable, path: str, fmt: str | None = None,
                    names: list[str] | None = None, chunk: int = 1 << 18) -> list[str]:
    """N x W float32 (W = dim, or 2*dim for directed: source then target) -> files written."""
    fmt = check_output_path(path, fmt)
    N, W = table.num_nodes, table.width
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    blocks = ((a, table.gather(np.arange(a, min(a + chunk, N))).numpy())
              for a in range(0, N, chunk))
    targets = [path] + ([path + ".ids.tsv"] if names is not None else [])
    temps = [_temp_name(t) for t in targets]
    try:
        _write_rows(temps[0], fmt, blocks, N, W, table.sides, names)
        if names is not None:
            write_names(temps[1], names)
            _fsync(temps[1])
        # every file is complete before the first rename
        for tmp, target in zip(temps, targets):
            os.replace(tmp, target)
        if names is None and os.path.exists(path + ".ids.tsv"):
            os.remove(path + ".ids.tsv")    # a string-id run's mapping: eval would use it
    finally:
        for tmp in temps:
            if os.path.exists(tmp):
                os.remove(tmp)
    return targets


def _matrix(path: str, a) -> np.ndarray:
    """a, checked to be a non-empty N x W array of real numbers."""
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise OutcoreError(f"{path} holds an array of shape {tuple(a.shape)}: embeddings are "
                           "N x W (one row a node); pass a file written by 'outcore embed'")
    if a.dtype.kind not in "fiu":
        raise OutcoreError(f"{path} holds {a.dtype} data: embeddings are numbers (float32); "
                           "pass a file written by 'outcore embed'")
    return a


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _load_tsv(path: str) -> np.ndarray:
    rows, lines = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            parts = line.rstrip("\r\n").split("\t")[1:]
            if not line.strip():
                continue
            if rows and len(parts) != len(rows[0]):
                raise OutcoreError(f"{path}, line {i}: {len(parts)} values after the id, but "
                                   f"line {lines[0]} has {len(rows[0])}: fix or delete it")
            rows.append(parts)
            lines.append(i)
    try:
        return np.array(rows, dtype=np.float32)
    except ValueError:
        pass
    for row, i in zip(rows, lines):      # find the line that does not parse, to name it
        try:
            np.array(row, dtype=np.float32)
        except ValueError:
            raise OutcoreError(f"{path}, line {i}: a value is not a number: fix or delete "
                               "it") from None
    raise OutcoreError(f"{path} does not parse as 'id<TAB>value<TAB>...' lines")


def load_embeddings(path: str) -> np.ndarray:
    """Read back what save_embeddings wrote: N x W float32 (a memory map for .npy)."""
    fmt = _fmt_of(path, None)
    if not os.path.isfile(path):
        raise OutcoreError(f"embeddings file {path!r} does not exist")
    if fmt == "npy":
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            why = _one_line(e)
            if "pickled" in why or "Python objects" in why:
                why = "it holds pickled Python objects, which are never loaded"
            raise OutcoreError(f"{path} is not a readable .npy array ({why}): pass a file "
                               "written by 'outcore embed'") from None
        return _matrix(path, a)
    if fmt == "safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        try:
            d = load_file(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise OutcoreError(f"{path} is not a readable .safetensors file ({_one_line(e)}): "
                               "pass a file written by 'outcore embed'") from None
        if "embeddings" not in d:
            raise OutcoreError(f"{path} has no 'embeddings' tensor")
        return _matrix(path, d["embeddings"])
    return _matrix(path, _load_tsv(path))
