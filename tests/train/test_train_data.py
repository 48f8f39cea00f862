"""--data: text files, folders, JSONL (text or prompt/response), and its one-line errors."""

import json

import numpy as np
import pytest
import torch

from outcore.data import ByteTokenizer, PackedTokens, read_documents, tokenize_documents
from outcore.errors import OutcoreError


def test_text_file_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("world")
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    docs = read_documents(tmp_path)
    assert docs == [("", "hello"), ("", "world")]
    ids, labels = tokenize_documents(docs, ByteTokenizer())
    assert bytes(ids.astype(np.uint8)) == b"hello\nworld\n"
    assert np.array_equal(ids, labels)


def test_jsonl_prompt_response_masks_the_prompt(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "Q: 2+2?", "response": " 4"}) + "\n\n"
                 + json.dumps({"text": "plain"}) + "\n")
    docs = read_documents(f)
    assert docs == [("Q: 2+2?", " 4"), ("", "plain")]
    ids, labels = tokenize_documents(docs, ByteTokenizer())
    n_prompt = len("Q: 2+2?")
    assert (labels[:n_prompt] == -100).all()
    assert np.array_equal(labels[n_prompt:], ids[n_prompt:])
    assert bytes(ids[n_prompt:].astype(np.uint8)) == b" 4\nplain\n"
    data = PackedTokens(ids, seq_len=4, labels=labels)
    b = data.batch(0, len(data))
    # every row's labels are its ids except at prompt positions
    rows = torch.from_numpy(ids[: len(data) * 4]).view(-1, 4)
    lab = torch.from_numpy(labels[: len(data) * 4]).view(-1, 4)
    for x, y in zip(b["input_ids"], b["labels"]):
        r = next(i for i in range(len(rows)) if torch.equal(rows[i], x))
        assert torch.equal(lab[r], y)


def test_batches_are_a_pure_function_of_seed_and_step():
    ids = np.arange(1000) % 256
    a, b = PackedTokens(ids, 10, seed=3), PackedTokens(ids, 10, seed=3)
    for step in (0, 7, 42):
        assert torch.equal(a.batch(step, 4)["input_ids"], b.batch(step, 4)["input_ids"])
    assert not torch.equal(a.batch(0, 4)["input_ids"], a.batch(1, 4)["input_ids"])


def test_empty_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("  \n")
    with pytest.raises(OutcoreError, match="empty.txt: the file is empty"):
        read_documents(f)


def test_non_utf8_names_file_and_offset(tmp_path):
    f = tmp_path / "latin.txt"
    f.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(OutcoreError, match=r"latin.txt: .*not UTF-8 at byte offset 3") as e:
        read_documents(f)
    assert "\n" not in str(e.value)


def test_bad_jsonl_line_number(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ok"}\n{"text": "fine"}\n{not json\n')
    with pytest.raises(OutcoreError, match="d.jsonl: line 3 is not valid JSON"):
        read_documents(f)
    f.write_text('{"text": "ok"}\n{"prompt": "p"}\n')
    with pytest.raises(OutcoreError, match="line 2 has neither"):
        read_documents(f)


def test_missing_path_and_too_short(tmp_path):
    with pytest.raises(OutcoreError, match="no such file"):
        read_documents(tmp_path / "nope.txt")
    with pytest.raises(OutcoreError, match="fewer than one sequence"):
        PackedTokens(np.arange(5), seq_len=10)
