"""Hugging Face interop: load a local checkpoint shard by shard, write one back.

Loading never holds two fp32 copies: the model is built with its parameters on the meta
device (no memory), then each safetensors tensor is read, cast to fp32 and assigned in
place of its meta parameter, one tensor at a time; peak = the fp32 model + one tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .errors import OutcoreError
from .meta import meta_parameters  # noqa: F401  (also outcore.hf.meta_parameters)


def is_hf_dir(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _transformers():
    try:
        import transformers
    except ImportError:
        raise OutcoreError("loading a Hugging Face checkpoint needs transformers: "
                           "pip install 'outcore[hf]'") from None
    return transformers


def shard_files(path: str | Path) -> list[Path]:
    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [p / n for n in names]
    return sorted(p.glob("*.safetensors"))


def hf_config(path: str):
    tf = _transformers()
    try:
        return tf.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise OutcoreError(f"--model {path}: config.json is not a Hugging Face config "
                           f"({str(e).splitlines()[0]})") from None


def empty_model(path: str):
    """The causal LM of `path`'s config.json, parameters on the meta device (no memory)."""
    tf = _transformers()
    config = hf_config(path)
    try:
        with meta_parameters():
            return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except (ValueError, KeyError) as e:
        raise OutcoreError(f"--model {path}: not a causal LM transformers knows "
                           f"({str(e).splitlines()[0]})") from None


def load_hf(path: str):
    """(model, tokenizer) from a local checkpoint directory; fp32 on the CPU, no network."""
    from safetensors import safe_open
    shards = shard_files(path)
    if not shards:
        raise OutcoreError(f"--model {path}: no *.safetensors weights: convert the checkpoint "
                           "with model.save_pretrained(dir, safe_serialization=True)")
    model = empty_model(path)
    params = dict(model.named_parameters(remove_duplicate=False))
    prefix = getattr(model, "base_model_prefix", "") + "."
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                name = key if key in params else prefix + key if prefix + key in params else None
                if name is None:
                    continue  # e.g. a persistent buffer the model recomputes itself
                t = f.get_tensor(key).to(torch.float32)  # one tensor at a time
                _assign(model, name, t)
                params.pop(name)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise OutcoreError(f"--model {path}: the safetensors files lack {len(missing)} "
                           f"parameters (first: {missing[0]}): is the checkpoint complete?")
    model.train()
    tok = load_tokenizer(path)
    return model, tok


def _assign(model: nn.Module, name: str, t: torch.Tensor) -> None:
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    old = getattr(mod, leaf)
    if tuple(old.shape) != tuple(t.shape):
        raise OutcoreError(f"checkpoint tensor {name} has shape {tuple(t.shape)}, the config "
                           f"says {tuple(old.shape)}: config.json and weights disagree")
    setattr(mod, leaf, nn.Parameter(t, requires_grad=old.requires_grad))


def load_tokenizer(path: str):
    tf = _transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError):
        return None


def save_hf(model: nn.Module, tokenizer, out: Path) -> None:
    """model.save_pretrained (safetensors, fp32 masters) + tokenizer.save_pretrained into out."""
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(out))
