"""HF checkpoint dirs that cannot train: a truncated weights file, no tokenizer files."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from outcore import train  # noqa: E402
from outcore.config import TrainConfig  # noqa: E402
from outcore.errors import OutcoreError  # noqa: E402

from .hfutil import make_checkpoint  # noqa: E402


def _cfg(src, tmp_path):
    return TrainConfig(model=str(src), seq_len=16, batch_size=2, max_steps=1,
                       output_dir=str(tmp_path / "run"), tensorboard=False, device="cpu",
                       generate_tokens=0)


def test_truncated_weights_are_one_line(tmp_path):
    src = make_checkpoint("llama", tmp_path / "src")
    f = src / "model.safetensors"
    f.write_bytes(f.read_bytes()[:3000])
    with pytest.raises(OutcoreError, match="model.safetensors is not a readable safetensors "
                       "file") as e:
        train.run(_cfg(src, tmp_path))
    assert "\n" not in str(e.value)


def test_no_tokenizer_files_is_detected(tmp_path):
    # GPT-2's config makes transformers build a tokenizer with an empty vocabulary
    src = make_checkpoint("gpt2", tmp_path / "src")
    for f in list(src.iterdir()):
        if f.name not in ("config.json", "generation_config.json", "model.safetensors"):
            f.unlink()
    with pytest.raises(OutcoreError, match="has no tokenizer files"):
        train.run(_cfg(src, tmp_path))
