"""--data: plain text files, a folder of them, or JSONL, tokenized and packed.

Documents (a file, or a JSONL record) are tokenized one at a time, joined with the
tokenizer's end-of-text token, and packed into `seq_len` rows by PackedTokens. A JSONL
record is either {"text": ...} (loss on every token) or {"prompt": ..., "response": ...}
(labels -100 on the prompt, so the loss is on the response only).

Bad input is an error that names the file and where: an empty file, bytes that are not
UTF-8 (file and byte offset), a JSONL line that is not JSON or lacks the fields (line).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import OutcoreError

TEXT_SUFFIXES = (".txt", ".md", ".py", ".text", ".jsonl", "")


def _files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES
                       and not f.name.startswith("."))
        if not files:
            raise OutcoreError(f"--data {path}: the folder has no .txt/.md/.py/.jsonl files")
        return files
    raise OutcoreError(f"--data {path}: no such file or folder")


def _decode(f: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OutcoreError(f"--data {f}: bytes that are not UTF-8 at byte offset {e.start} "
                           f"({raw[e.start:e.start + 4]!r}): convert the file to UTF-8 "
                           "(e.g. iconv -f latin1 -t utf-8)") from None


def read_documents(path: str | Path) -> list[tuple[str, str]]:
    """[(prompt, text)]: prompt '' for plain text; one entry per file or JSONL record."""
    docs: list[tuple[str, str]] = []
    for f in _files(path):
        raw = f.read_bytes()
        if not raw.strip():
            raise OutcoreError(f"--data {f}: the file is empty: remove it or give it text")
        text = _decode(f, raw)
        if f.suffix == ".jsonl":
            docs.extend(_jsonl(f, text))
        else:
            docs.append(("", text))
    return docs


def _jsonl(f: Path, text: str) -> list[tuple[str, str]]:
    out = []
    # Records end at "\n" only (JSON Lines; "\r\n" too): str.splitlines() would also cut
    # at U+2028, U+2029 and U+0085, which JSON allows raw inside strings. A leading UTF-8
    # byte-order mark is not part of the first record.
    for i, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise OutcoreError(f"--data {f}: line {i} is not valid JSON ({e.msg}): fix or "
                               "remove that line") from None
        if not isinstance(rec, dict):
            raise OutcoreError(f"--data {f}: line {i} is not a JSON object: use "
                               '{"text": ...} or {"prompt": ..., "response": ...}')
        if isinstance(rec.get("text"), str):
            out.append(("", rec["text"]))
        elif isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
            out.append((rec["prompt"], rec["response"]))
        else:
            raise OutcoreError(f"--data {f}: line {i} has neither a string 'text' nor string "
                               "'prompt' and 'response' fields")
    if not out:
        raise OutcoreError(f"--data {f}: no records (only blank lines)")
    return out


def _encode(tokenizer, text: str) -> np.ndarray:
    if not text:
        return np.zeros(0, dtype=np.int64)
    if type(tokenizer).__name__ == "ByteTokenizer":
        return tokenizer.encode(text)
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def _eos(tokenizer) -> np.ndarray:
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        return np.asarray([eos], dtype=np.int64)
    if type(tokenizer).__name__ == "ByteTokenizer":
        return np.asarray([10], dtype=np.int64)  # a newline between documents
    return np.zeros(0, dtype=np.int64)


def tokenize_documents(docs: list[tuple[str, str]], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels): N int64 each; labels are ids, or -100 on prompt tokens."""
    ids: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    sep = _eos(tokenizer)
    for prompt, text in docs:
        p = _encode(tokenizer, prompt)
        t = np.concatenate([_encode(tokenizer, text), sep])
        ids += [p, t]
        labels += [np.full(len(p), -100, dtype=np.int64), t]
    out = np.concatenate(ids)
    if not len(out):
        raise OutcoreError("--data: the documents tokenized to zero tokens")
    return out, np.concatenate(labels)
