"""Write embeddings (row i = node i) as .npy, .safetensors or .tsv, in chunks of rows, so a
table larger than RAM is never materialised whole; string ids go beside them."""

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


def save_embeddings(table: EmbeddingTable, path: str, fmt: str | None = None,
                    names: list[str] | None = None, chunk: int = 1 << 18) -> list[str]:
    """N x W float32 (W = dim, or 2*dim for directed: source then target) -> files written."""
    fmt = _fmt_of(path, fmt)
    N, W = table.num_nodes, table.width
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    blocks = ((a, table.gather(np.arange(a, min(a + chunk, N))).numpy())
              for a in range(0, N, chunk))
    if fmt == "npy":
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(N, W))
        for a, rows in blocks:
            out[a:a + len(rows)] = rows
        out.flush()
        del out
    elif fmt == "safetensors":
        # The format is an 8-byte header length, a JSON header, then raw little-endian
        # data: written directly so rows can stream in chunks.
        header = {"embeddings": {"dtype": "F32", "shape": [N, W],
                                 "data_offsets": [0, N * W * 4]},
                  "__metadata__": {"rows": "node id", "sides": str(table.sides)}}
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for _, rows in blocks:
                f.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    else:
        with open(path, "w", encoding="utf-8") as f:
            for a, rows in blocks:
                ids = (names[a:a + len(rows)] if names is not None
                       else [str(i) for i in range(a, a + len(rows))])
                body = np.char.mod("%.6g", rows)
                f.write("".join(f"{i}\t" + "\t".join(r) + "\n" for i, r in zip(ids, body)))
    written = [path]
    if names is not None:
        npath = path + ".ids.tsv"
        write_names(npath, names)
        written.append(npath)
    return written


def load_embeddings(path: str) -> np.ndarray:
    """Read back what save_embeddings wrote: N x W float32."""
    fmt = _fmt_of(path, None)
    if not os.path.isfile(path):
        raise OutcoreError(f"embeddings file {path!r} does not exist")
    if fmt == "npy":
        return np.load(path, mmap_mode="r")
    if fmt == "safetensors":
        from safetensors.numpy import load_file
        d = load_file(path)
        if "embeddings" not in d:
            raise OutcoreError(f"{path} has no 'embeddings' tensor")
        return d["embeddings"]
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rows.append(line.rstrip("\n").split("\t")[1:])
    return np.array(rows, dtype=np.float32)
