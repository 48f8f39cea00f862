"""Hugging Face interop: load a local checkpoint directory as an fp32 CPU model."""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import OutcoreError


def is_hf_dir(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def load_hf(path: str):
    """(model, tokenizer) from a local checkpoint directory; fp32 on the CPU, no network."""
    try:
        import transformers
    except ImportError:
        raise OutcoreError("loading a Hugging Face checkpoint needs transformers: "
                           "pip install 'outcore[hf]'") from None
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as e:
        raise OutcoreError(f"--model {path}: cannot load it as a Hugging Face causal LM "
                           f"({str(e).splitlines()[0]})") from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        tok = None
    return model, tok
