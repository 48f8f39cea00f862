"""Review fixes of --data and the HF checkpoint interop: prompt/response tokenized as one
string (SentencePiece), prompt-only rows, folders with .git/empty/binary files, JSONL
errors with line numbers, generation_config kept, damaged checkpoint dirs."""

import json
import os

import numpy as np
import pytest
import torch

from outcore import train
from outcore.config import TrainConfig
from outcore.data import ByteTokenizer, PackedTokens, read_documents, tokenize_documents
from outcore.errors import OutcoreError

from .hfutil import SENTENCES, make_checkpoint


def _one_line(e) -> str:
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def sp_tokenizer():
    """A Llama-2-like tokenizer: SentencePiece-style "▁" words and a BOS, built offline."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    t.train_from_iterator(SENTENCES + ["x=4y"], trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=list("0123456789:=+?\nQ")))
    t.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                     special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def test_prompt_and_response_are_tokenized_as_one_string():
    """Encoded apart, the response "4" became ["▁", "4"]: a space the model then learned to
    put after every prompt. Now: the tokens of prompt + response, with the BOS, as at
    inference; -100 on the prompt's tokens (BOS included); the EOS learned."""
    tok = sp_tokenizer()
    # "x=" + "4y": the token "▁x=4y" spans both; it is the response's (the model makes it)
    docs = [("Q: 2+2=", "4"), ("", "the lazy dog"), ("x=", "4y"), ("to be or", "")]
    ids, labels = tokenize_documents(docs, tok)
    want, mask = [], []
    for p, r in docs:
        full = tok(p + r)["input_ids"] + [tok.eos_token_id]
        alone = tok(p)["input_ids"] if p else []
        n = next((i for i, (a, b) in enumerate(zip(alone, full)) if a != b), len(alone))
        want += full
        mask += [True] * n + [False] * (len(full) - n)
    assert ids.tolist() == want
    end = ids.tolist().index(tok.eos_token_id)
    assert tok.convert_ids_to_tokens(ids[:end].tolist())[0] == "<s>"
    assert tok.decode(ids[:end], skip_special_tokens=True) == "Q: 2+2=4"   # was "Q: 2+2= 4"
    assert "▁x=4y" in tok.convert_ids_to_tokens(ids[~np.array(mask)].tolist())
    assert (labels[np.array(mask)] == -100).all()
    assert np.array_equal(labels[~np.array(mask)], ids[~np.array(mask)])
    # an empty response: only its EOS is learned
    assert labels[-1] == tok.eos_token_id and (labels[-2] == -100)


def test_byte_mask_across_the_packing_boundary():
    docs = [("P" * 7, "r" * 5), ("", "t" * 3), ("Q" * 30, "s" * 2)]
    ids, labels = tokenize_documents(docs, ByteTokenizer())
    prompt = np.frombuffer(bytes(ids.astype(np.uint8)), dtype=np.uint8)
    is_prompt = (prompt == ord("P")) | (prompt == ord("Q"))
    assert np.array_equal(labels == -100, is_prompt)
    data = PackedTokens(ids, seq_len=8, labels=labels)
    b = data.batch(0, len(data))
    for x, y in zip(b["input_ids"], b["labels"]):
        p = (x == ord("P")) | (x == ord("Q"))
        assert torch.equal(y[p], torch.full_like(y[p], -100))
        assert torch.equal(y[~p], x[~p])
        assert bool((y[1:] != -100).any())   # no row without a token to learn


def test_prompt_only_rows_are_left_out():
    """A prompt longer than --seq-len made rows of labels -100 only: a batch of them had
    loss NaN, and --max-bad-steps of them stopped the run with 'lower --lr'."""
    labels = np.full(40, -100)
    labels[35:] = 7
    labels[5] = 7   # label 0 of row 1: never a target (shifted), so row 1 has none
    data = PackedTokens(np.arange(40), seq_len=5, labels=labels)
    assert len(data.perm) == 1   # only row 7 is served
    assert data.batch(3, 2)["input_ids"].tolist() == [[35, 36, 37, 38, 39]] * 2
    with pytest.raises(OutcoreError, match="prompt only") as e:
        PackedTokens(np.arange(40), seq_len=5, labels=np.where(np.arange(40) % 5, -100, 1))
    _one_line(e)


def test_long_prompts_train_with_no_nan_step(tmp_path):
    """End to end, a Llama checkpoint with a SentencePiece tokenizer: no step is skipped,
    and step 1's loss is transformers' loss of the initial model on batch 0."""
    tf = pytest.importorskip("transformers")
    src = make_checkpoint("llama", tmp_path / "src")
    for f in src.glob("tokenizer*"):
        f.unlink()
    sp_tokenizer().save_pretrained(str(src))
    f = tmp_path / "sft.jsonl"
    f.write_text("".join(json.dumps({"prompt": " ".join(SENTENCES[:3]), "response": r})
                         + "\n" for r in ("the lazy dog", "4", "")))
    cfg = TrainConfig(model=str(src), data=str(f), seq_len=16, batch_size=1, max_steps=4,
                      warmup_steps=0, output_dir=str(tmp_path / "run"), tensorboard=False,
                      device="cpu", generate_tokens=0)
    ref = tf.AutoModelForCausalLM.from_pretrained(str(src))
    batch = train.build_data(cfg, tf.AutoTokenizer.from_pretrained(str(src))).batch(0, 1)
    want = ref(**batch).loss.item()
    s = train.run(cfg)
    assert s["skipped_steps"] == 0 and s["steps"] == 4
    assert s["first_loss"] == pytest.approx(want, rel=1e-5)


def test_folder_skips_hidden_empty_and_binary_files(tmp_path):
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".git" / "objects" / "ab12").write_bytes(b"x\x9c\x00\xff")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "run").write_bytes(b"\x7fELF\x00\x00\xff")
    (tmp_path / "loop").mkdir()
    os.symlink("..", tmp_path / "loop" / "up")   # a loop: not followed
    (tmp_path / "README").write_text("read me\n")
    assert read_documents(tmp_path) == [("", "read me\n"), ("", "x = 1\n")]
    (tmp_path / "pkg" / "mod.py").write_text("")
    (tmp_path / "README").write_bytes(b"\x00\x01")
    with pytest.raises(OutcoreError, match="no text found") as e:
        read_documents(tmp_path)
    _one_line(e)


@pytest.mark.parametrize("line, why", [
    ("[" * 100000, "line 2 is not valid JSON"),
    ('{"text": "a", "n": ' + "1" * 5000 + "}", "line 2 is not valid JSON"),
    (r'{"prompt": "smile \ud83d", "response": "ok"}', "line 2 has a lone UTF-16 surrogate"),
    ('{"text": 5, "prompt": "p", "response": null}', "line 2 has neither"),
    ("[1, 2]", "line 2 is not a JSON object"),
])
def test_bad_jsonl_lines_are_one_line_with_the_line(tmp_path, line, why):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ok"}\n' + line + "\n\n")
    with pytest.raises(OutcoreError, match=why) as e:
        read_documents(f)
    _one_line(e)


def test_non_utf8_line_and_json_file(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(OutcoreError, match=r"not UTF-8 at byte offset 28 \(line 2") as e:
        read_documents(f)
    _one_line(e)
    f = tmp_path / "d.json"   # was trained on as raw text, keys and brackets included
    f.write_text(json.dumps([{"prompt": "p", "response": "r"}]))
    with pytest.raises(OutcoreError, match=r"a \.json file is not read as records") as e:
        read_documents(f)
    _one_line(e)


def test_generation_config_survives_the_round_trip(tmp_path):
    """from_config dropped the checkpoint's generation_config.json (a Llama-3-Instruct's
    eos_token_id list, its sampling settings); the saved checkpoint had defaults."""
    tf = pytest.importorskip("transformers")
    from outcore.hf import load_hf, save_hf
    src = make_checkpoint("llama", tmp_path / "src")
    tf.GenerationConfig(eos_token_id=[0, 5], bos_token_id=0, do_sample=True,
                        temperature=0.6, top_p=0.9).save_pretrained(str(src))
    model, tok = load_hf(str(src))
    save_hf(model, tok, tmp_path / "out")
    g = tf.GenerationConfig.from_pretrained(str(tmp_path / "out"))
    assert g.eos_token_id == [0, 5] and g.temperature == 0.6 and g.top_p == 0.9


def test_damaged_checkpoint_dirs_are_one_line(tmp_path):
    pytest.importorskip("transformers")
    from outcore.hf import lazy_hf, load_tokenizer
    src = make_checkpoint("llama", tmp_path / "src")
    (src / "model.safetensors.index.json").write_text("{")
    with pytest.raises(OutcoreError, match="index.json is not a shard index") as e:
        lazy_hf(str(src))
    _one_line(e)
    (src / "model.safetensors.index.json").unlink()
    (src / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    with pytest.raises(OutcoreError, match="its tokenizer files do not load") as e:
        load_tokenizer(str(src))   # was: 'has no tokenizer files'
    _one_line(e)
    c = json.loads((src / "config.json").read_text())
    c.update(model_type="fancy", auto_map={"AutoConfig": "cfg_fancy.FancyConfig"})
    (src / "config.json").write_text(json.dumps(c))
    with pytest.raises(OutcoreError, match="needs its own Python code") as e:
        lazy_hf(str(src))   # no "[y/N]" prompt on stdin
    _one_line(e)


def test_seq_len_past_an_absolute_position_table_is_one_line(tmp_path):
    """GPT-2's n_positions: a longer --seq-len failed at step 1 with 'index out of range'."""
    ck = make_checkpoint("gpt2", tmp_path / "gpt2")   # n_positions=128
    cfg = TrainConfig(model=str(ck), seq_len=256, device="cpu", tensorboard=False,
                      output_dir=str(tmp_path / "run"))
    with pytest.raises(OutcoreError, match=r"--seq-len 256 is longer .* position table \(128\)"):
        train.build_model(cfg)
    assert train.build_model(TrainConfig(model=str(ck), seq_len=128))[0] is not None
