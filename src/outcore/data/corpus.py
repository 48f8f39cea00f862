"""Text that every machine has: the Python standard library's own source files."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from ..errors import OutcoreError


class ByteTokenizer:
    """Bytes as tokens (vocab 256): needs no files, round-trips any text."""

    vocab_size = 256

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8", errors="replace") if isinstance(text, str) else text
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")


def stdlib_corpus(max_bytes: int = 8_000_000) -> bytes:
    """Up to max_bytes of the standard library's .py files, in a fixed (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for f in sorted(root.glob("*.py")):
        try:
            b = f.read_bytes()
        except OSError:
            continue
        out.append(b)
        n += len(b)
        if n >= max_bytes:
            break
    if not out:
        raise OutcoreError(f"found no Python sources under {root} for the demo corpus: "
                           "pass --data FILE_OR_DIR")
    return b"\n".join(out)[:max_bytes]


def read_text_sources(path: str | Path) -> bytes:
    """A text file, or every *.txt / *.md / *.py file under a folder (sorted), as bytes."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file()
                       and f.suffix in (".txt", ".md", ".py", ".text", ""))
    else:
        raise OutcoreError(f"--data {path}: no such file or folder")
    data = b"\n".join(f.read_bytes() for f in files)
    if not data.strip():
        raise OutcoreError(f"--data {path}: no text found (empty file or folder)")
    return data
