"""Which safetensors files and tensors a checkpoint directory's load takes: transformers'
file rule without an index, a tensor in two files refused, unused tensors said, `~`."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from safetensors.torch import load_file, save_file  # noqa: E402

from outcore.config import TrainConfig  # noqa: E402
from outcore.errors import OutcoreError  # noqa: E402
from outcore.hf import is_hf_dir, load_hf, shard_files  # noqa: E402

from .hfutil import make_checkpoint  # noqa: E402


def test_a_stray_file_beside_model_safetensors_is_not_read(tmp_path, capsys):
    ck = make_checkpoint("llama", tmp_path / "ck")
    ref, _ = load_hf(str(ck))
    tensors = load_file(str(ck / "model.safetensors"))
    # e.g. an old copy with other values: read before model.safetensors it would win
    save_file({k: torch.zeros_like(v) for k, v in tensors.items()},
              str(ck / "a-copy.safetensors"))
    assert shard_files(ck) == [ck / "model.safetensors"]
    model, _ = load_hf(str(ck))
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n
    assert "match no parameter" not in capsys.readouterr().err


def test_a_tensor_in_two_files_without_an_index_is_refused(tmp_path):
    ck = make_checkpoint("llama", tmp_path / "ck")
    tensors = load_file(str(ck / "model.safetensors"))
    (ck / "model.safetensors").rename(ck / "part-a.safetensors")
    key = sorted(tensors)[0]
    save_file({key: torch.zeros_like(tensors[key])}, str(ck / "part-b.safetensors"))
    with pytest.raises(OutcoreError, match=f"tensor '{key}' is in both part-a.safetensors "
                       "and part-b.safetensors"):
        load_hf(str(ck))


def test_unused_checkpoint_tensors_are_said_in_one_line(tmp_path, capsys):
    ck = make_checkpoint("llama", tmp_path / "ck")
    tensors = load_file(str(ck / "model.safetensors"))
    tensors["model.extra_head.weight"] = torch.ones(3, 4)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # ignored
    save_file(tensors, str(ck / "model.safetensors"))
    load_hf(str(ck))
    err = capsys.readouterr().err.strip().splitlines()
    said = [ln for ln in err if "match no parameter" in ln]
    assert len(said) == 1 and "1 checkpoint tensor(s)" in said[0], err
    assert "model.extra_head.weight" in said[0]


def test_a_home_relative_checkpoint_path(tmp_path, monkeypatch):
    make_checkpoint("gpt2", tmp_path / "ck")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert is_hf_dir("~/ck")
    model, tok = load_hf("~/ck")
    assert tok is not None and sum(p.numel() for p in model.parameters()) > 0
    cfg = TrainConfig(model="~/ck", data="~/corpus.txt", output_dir="~/run").validate()
    assert (cfg.model, cfg.data, cfg.output_dir) == (
        str(tmp_path / "ck"), str(tmp_path / "corpus.txt"), str(tmp_path / "run"))
