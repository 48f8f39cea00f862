"""--data: plain text files, a folder of them, or JSONL, tokenized and packed.

Documents (a file, or a JSONL record) are tokenized one at a time, joined with the
tokenizer's end-of-text token, and packed into `seq_len` rows by PackedTokens. A JSONL
record is either {"text": ...} (loss on every token) or {"prompt": ..., "response": ...}
(labels -100 on the prompt, so the loss is on the response only).

A Hugging Face tokenizer encodes prompt + response as one string, with its special tokens
(a Llama BOS), as it will at inference: the prompt's tokens are those it shares with the
prompt encoded alone (encoded apart, a SentencePiece tokenizer would put a "▁" before
every response). A folder's hidden entries (.git), empty and binary files are skipped.

Bad input is an error that names the file and where: an empty file, bytes that are not
UTF-8 (file, line and byte offset), a JSONL line that is not JSON or lacks the fields (line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import OutcoreError

TEXT_SUFFIXES = (".txt", ".md", ".py", ".text", ".jsonl", "")
RECORDS = '{"text": ...} or {"prompt": ..., "response": ...}'


def _files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = []
        for root, dirs, names in os.walk(p):   # symlinked folders are not entered: no loops
            dirs[:] = [d for d in dirs if not d.startswith(".")]   # .git, .venv, ...
            files += [Path(root) / n for n in names if not n.startswith(".")
                      and Path(n).suffix.lower() in TEXT_SUFFIXES and (Path(root) / n).is_file()]
        if not files:
            raise OutcoreError(f"--data {path}: the folder has no .txt/.md/.py/.jsonl files")
        return sorted(files)
    raise OutcoreError(f"--data {path}: no such file or folder")


def _decode(f: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise OutcoreError(f"--data {f}: bytes that are not UTF-8 at byte offset {e.start} "
                           f"(line {line}: {raw[e.start:e.start + 4]!r}): convert the file to "
                           "UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def read_documents(path: str | Path) -> list[tuple[str, str]]:
    """[(prompt, text)]: prompt '' for plain text; one entry per file or JSONL record."""
    docs: list[tuple[str, str]] = []
    folder = Path(path).is_dir()
    for f in _files(path):
        try:
            raw = f.read_bytes()
        except OSError as e:
            raise OutcoreError(f"--data {f}: cannot be read ({e.strerror}): fix its "
                               "permissions or remove it") from None
        if folder and (not raw.strip() or b"\0" in raw[:8192]):
            continue   # an empty __init__.py, a binary file: nothing to learn, as grep judges
        if not raw.strip():
            raise OutcoreError(f"--data {f}: the file is empty: remove it or give it text")
        text = _decode(f, raw)
        if f.suffix.lower() == ".jsonl":
            docs.extend(_jsonl(f, text))
        elif f.suffix.lower() == ".json":
            raise OutcoreError(f"--data {f}: a .json file is not read as records: give JSON "
                               f"Lines (.jsonl), one {RECORDS} a line (e.g. jq -c '.[]')")
        else:
            docs.append(("", text))
    if not docs:
        raise OutcoreError(f"--data {path}: no text found (every file is empty or binary)")
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
        except (ValueError, RecursionError) as e:   # ValueError: also an over-long integer
            why = getattr(e, "msg", None) or str(e).splitlines()[0]
            raise OutcoreError(f"--data {f}: line {i} is not valid JSON ({why}): fix or "
                               "remove that line") from None
        if not isinstance(rec, dict):
            raise OutcoreError(f"--data {f}: line {i} is not a JSON object: use {RECORDS}")
        if isinstance(rec.get("text"), str):
            doc = ("", rec["text"])
        elif isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
            doc = (rec["prompt"], rec["response"])
        else:
            raise OutcoreError(f"--data {f}: line {i} has neither a string 'text' nor string "
                               "'prompt' and 'response' fields")
        try:
            (doc[0] + doc[1]).encode("utf-8")
        except UnicodeEncodeError:   # "\ud83d" alone: half an escaped emoji
            raise OutcoreError(f"--data {f}: line {i} has a lone UTF-16 surrogate escape "
                               r"(such as \ud83d without its pair): fix or remove that "
                               "line") from None
        out.append(doc)
    if not out:
        raise OutcoreError(f"--data {f}: no records (only blank lines)")
    return out


def _eos(tokenizer) -> np.ndarray:
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        return np.asarray([eos], dtype=np.int64)
    if type(tokenizer).__name__ == "ByteTokenizer":
        return np.asarray([10], dtype=np.int64)  # a newline between documents
    return np.zeros(0, dtype=np.int64)


def _byte_docs(docs, tokenizer):
    """(ids, n_prompt) of each document with the byte tokenizer: bytes add up exactly."""
    for prompt, text in docs:
        p = tokenizer.encode(prompt) if prompt else np.zeros(0, dtype=np.int64)
        t = tokenizer.encode(text) if text else np.zeros(0, dtype=np.int64)
        yield np.concatenate([p, t]), len(p)


def _hf_docs(docs, tokenizer, chunk: int = 1024):
    """(ids, n_prompt) of each document: prompt + text encoded as one string, with the
    tokenizer's special tokens; the prompt is the prefix shared with the prompt alone."""
    for s in range(0, len(docs), chunk):
        part = docs[s:s + chunk]
        full = tokenizer([p + t for p, t in part], verbose=False)["input_ids"]
        alone = iter(tokenizer([p for p, _ in part if p], verbose=False)["input_ids"]
                     if any(p for p, _ in part) else [])
        for (prompt, _), ids in zip(part, full):
            n = 0
            if prompt:
                pre = next(alone)
                while n < min(len(pre), len(ids)) and pre[n] == ids[n]:
                    n += 1
            yield np.asarray(ids, dtype=np.int64), n


def tokenize_documents(docs: list[tuple[str, str]], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels): N int64 each; labels are ids, or -100 on prompt tokens."""
    ids: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    sep = _eos(tokenizer)
    hf = type(tokenizer).__name__ != "ByteTokenizer"
    for doc, n_prompt in (_hf_docs if hf else _byte_docs)(docs, tokenizer):
        if not (hf and len(sep) and len(doc) > n_prompt and doc[-1] == sep[0]):
            doc = np.concatenate([doc, sep])   # unless the tokenizer put its EOS there
        lab = doc.copy()
        lab[:n_prompt] = -100
        ids.append(doc)
        labels.append(lab)
    out = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if not len(out):
        raise OutcoreError("--data: the documents tokenized to zero tokens")
    return out, np.concatenate(labels)
