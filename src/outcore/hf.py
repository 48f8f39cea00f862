"""Hugging Face interop: load a local checkpoint shard by shard, write one back.

The model is built with its parameters on the meta device (no memory). `lazy_hf` leaves
them there and hands the engine an init that reads each safetensors tensor, cast to fp32,
straight into its host state (`outcore train` does this: no fp32 model beside the state,
each rank only what it keeps); `load_hf` assigns each in place of its meta parameter, one
tensor at a time (peak = the fp32 model + one tensor).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from torch import nn

from .errors import OutcoreError
from .meta import meta_parameters  # noqa: F401  (also outcore.hf.meta_parameters)


def _local(path: str | Path) -> Path:
    """The checkpoint directory as given, `~` expanded (a path from a TOML file or a
    quoted argument reaches here unexpanded by the shell)."""
    return Path(path).expanduser()


def is_hf_dir(path: str) -> bool:
    return _local(path).is_dir() and (_local(path) / "config.json").is_file()


def _transformers():
    try:
        import transformers
    except ImportError:
        raise OutcoreError("loading a Hugging Face checkpoint needs transformers: "
                           "pip install 'outcore[hf]'") from None
    return transformers


def shard_files(path: str | Path) -> list[Path]:
    p = _local(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise OutcoreError(f"--model {path}: {index.name} is not a shard index (no "
                               f"weight_map: {type(e).__name__}): is the checkpoint "
                               "complete?") from None
        return [p / n for n in names]
    if (p / "model.safetensors").is_file():   # transformers' rule without an index: other
        return [p / "model.safetensors"]      # files there (an adapter, a copy) are not read
    return sorted(p.glob("*.safetensors"))


try:   # transformers >= 5 validates configs through huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError
    _STRICT: tuple = (StrictDataclassError,)
except ImportError:
    _STRICT = ()


def hf_config(path: str):
    tf = _transformers()
    try:
        # trust_remote_code=False: no prompt on stdin, no code from the checkpoint is run
        return tf.AutoConfig.from_pretrained(str(_local(path)), local_files_only=True,
                                             trust_remote_code=False)
    except (OSError, ValueError, *_STRICT) as e:
        if "trust_remote_code" in str(e):
            raise OutcoreError(f"--model {path}: the model needs its own Python code "
                               "(auto_map in config.json), which outcore does not run: use "
                               "an architecture transformers has built in") from None
        # a strict config's validation error: its first line names the validator, the cause
        # says what is wrong ("hidden size (32) is not a multiple of ... heads (3)")
        why = str(e.__cause__ if isinstance(e, _STRICT) and e.__cause__ else e)
        raise OutcoreError(f"--model {path}: config.json is not a valid Hugging Face config "
                           f"({why.strip().splitlines()[0]})") from None


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
    except AssertionError as e:   # torch's own checks, e.g. a pad_token_id >= vocab_size
        why = str(e).strip() or "an assertion failed"
        raise OutcoreError(f"--model {path}: config.json does not build a model ({why}): "
                           "fix config.json") from None


def _shards(path: str) -> list[Path]:
    shards = shard_files(path)
    if not shards:
        raise OutcoreError(f"--model {path}: no *.safetensors weights: convert the checkpoint "
                           "with model.save_pretrained(dir, safe_serialization=True)")
    return shards


def lazy_hf(path: str):
    """(model, tokenizer, init) from a local checkpoint directory, no network: the model's
    parameters stay on the meta device, and Engine(model, init=init) reads each one from
    the safetensors shards as it fills its host state (stream/materialize.py). So no fp32
    model is built beside the state, and each rank of a sharded engine reads what it
    keeps. Every parameter's tensor is found (or the error said) before anything is read."""
    shards = _shards(path)
    model = empty_model(path)
    init = SafetensorsInit(model, shards, path)
    if (_local(path) / "generation_config.json").is_file():   # kept in the checkpoints saved
        try:
            model.generation_config = _transformers().GenerationConfig.from_pretrained(
                str(_local(path)), local_files_only=True)
        except (OSError, ValueError) as e:
            raise OutcoreError(f"--model {path}: generation_config.json does not load "
                               f"({str(e).splitlines()[0]})") from None
    model.train()
    return model, load_tokenizer(path), init


class SafetensorsInit:
    """init(name, tensor) for Engine: the checkpoint's tensor of parameter `name`, cast to
    the tensor's dtype. A tied parameter is found under any of its names; a key may lack
    the model's base_model_prefix, as in load_hf."""

    def __init__(self, model: nn.Module, shards: list[Path], path: str):
        from safetensors import safe_open
        self.path, self._open = path, safe_open
        where: dict[str, Path] = {}
        for shard in shards:
            try:
                with safe_open(str(shard), framework="pt") as f:
                    keys = list(f.keys())
            except Exception as e:   # SafetensorError: a truncated or damaged file
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise OutcoreError(f"--model {path}: {shard.name} is not a readable "
                                   f"safetensors file ({why}): is it complete?") from None
            twice = next((k for k in keys if k in where), None)
            if twice is not None:   # else one file's tensor silently wins
                raise OutcoreError(f"--model {path}: tensor {twice!r} is in both "
                                   f"{where[twice].name} and {shard.name}: remove the file "
                                   "that is not part of the checkpoint, or add its "
                                   "model.safetensors.index.json")
            where.update({k: shard for k in keys})
        rename, merges = _key_renames(model)
        named = {rename(k): k for k in sorted(where)}   # the model's name -> checkpoint key
        aliases: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(n)
        prefix = getattr(model, "base_model_prefix", "") + "."
        self.key: dict[str, tuple[str, Path]] = {}
        missing = []
        for names in aliases.values():
            keys = [a for n in names
                    for a in (n, n[len(prefix):] if n.startswith(prefix) else None) if a]
            key = next((named[k] for k in keys if k in named), None)
            if key is None:
                missing.append(names[0])
                continue
            for n in names:   # the engine names a tied parameter by any one of them
                self.key[n] = (key, where[key])
        if missing and merges:
            raise OutcoreError(f"--model {path}: transformers builds {len(missing)} of its "
                               f"parameters (first: {missing[0]}) by merging several checkpoint "
                               "tensors (as for mixture-of-experts layers), which outcore's "
                               "loader does not do: this architecture is not supported")
        if missing:
            raise OutcoreError(f"--model {path}: the safetensors files lack {len(missing)} "
                               f"parameters (first: {missing[0]}): is the checkpoint complete?")
        used = {k for k, _ in self.key.values()}
        _say_unused(model, path, {n: k for n, k in named.items() if k not in used})
        self._files: dict[Path, object] = {}

    def __call__(self, name: str, t: torch.Tensor) -> None:
        key, shard = self.key[name]
        if shard not in self._files:   # kept open: the next parameters are mostly there
            self._files = {shard: self._open(str(shard), framework="pt")}
        src = self._files[shard].get_tensor(key)
        if tuple(src.shape) != tuple(t.shape):
            raise OutcoreError(f"checkpoint tensor {name} has shape {tuple(src.shape)}, the "
                               f"config says {tuple(t.shape)}: config.json and weights "
                               "disagree")
        t.copy_(src)


# buffers that older checkpoints hold and models now rebuild at load (rotary frequencies,
# GPT-2's masked_bias), wherever the layer keeps them
_RECOMPUTED = (".inv_freq", ".masked_bias")


def _say_unused(model: nn.Module, path: str, unused: dict[str, str]) -> None:
    """One line on stderr for checkpoint tensors no parameter takes (a head the model
    lacks, another architecture's weights), as transformers warns; not for the keys the
    model class says to ignore, nor its buffers (recomputed at build, e.g. rotary tables).
    `unused`: {the name transformers gives the tensor: its checkpoint key}."""
    ignore = [re.compile(r) for r in getattr(model, "_keys_to_ignore_on_load_unexpected",
                                             None) or ()]
    buffers = {n for n, _ in model.named_buffers()}
    prefix = getattr(model, "base_model_prefix", "") + "."
    left = sorted(k for n, k in unused.items() if n not in buffers and prefix + n not in
                  buffers and not n.endswith(_RECOMPUTED)
                  and not any(r.search(n) or r.search(k) for r in ignore))
    rank0 = not (torch.distributed.is_available() and torch.distributed.is_initialized()
                 and torch.distributed.get_rank() != 0)
    if left and rank0:
        print(f"outcore: --model {path}: {len(left)} checkpoint tensor(s) match no parameter "
              f"of {type(model).__name__} and are not loaded (first: {left[0]})",
              file=sys.stderr)


def _key_renames(model: nn.Module):
    """(checkpoint key -> parameter name, transformers' merging converters): the renames
    transformers >= 5 applies as it loads (GPT-NeoX's embed_out -> lm_head, legacy gamma/beta;
    its save_pretrained writes the old names back). Identity on transformers 4."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     rename_source_key)
        conv = get_model_conversion_mapping(model)
        renames = [c for c in conv if isinstance(c, WeightRenaming)]
        rename_source_key("probe.weight", renames, [])
    except Exception:   # noqa: BLE001 - transformers 4, or these internals changed shape:
        return (lambda k: k), []   # names as in the checkpoint (a missing one is reported)
    return ((lambda k: rename_source_key(k, renames, [])[0]),
            [c for c in conv if isinstance(c, WeightConverter)])


def load_hf(path: str):
    """(model, tokenizer) from a local checkpoint directory; fp32 on the CPU, no network.
    Each tensor is read (lazy_hf's init) and put in place of its meta parameter in turn:
    peak = the fp32 model + one tensor."""
    model, tok, init = lazy_hf(path)
    for name, p in model.named_parameters():   # each tied parameter once
        t = torch.empty(p.shape, dtype=torch.float32)
        init(name, t)
        _assign(model, name, t)
    model.tie_weights()   # the other names of a tied parameter: the new one
    return model, tok


def _assign(model: nn.Module, name: str, t: torch.Tensor) -> None:
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    setattr(mod, leaf, nn.Parameter(t, requires_grad=getattr(mod, leaf).requires_grad))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")


def load_tokenizer(path: str):
    """The checkpoint's tokenizer, None where it has none (no tokenizer files; for some
    models transformers then builds one with an empty vocabulary)."""
    tf = _transformers()
    hf_config(path)   # a bad config.json said as such, not as a tokenizer failure or traceback
    try:
        tok = tf.AutoTokenizer.from_pretrained(str(_local(path)), local_files_only=True,
                                               trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        if any((_local(path) / n).is_file() for n in TOKENIZER_FILES):
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OutcoreError(f"--model {path}: its tokenizer files do not load ({why}): "
                               "are they complete?") from None
        return None
    return None if getattr(tok, "vocab_size", None) == 0 else tok


def save_hf(model: nn.Module, tokenizer, out: Path) -> None:
    """model.save_pretrained (safetensors, fp32 masters) + tokenizer.save_pretrained into out."""
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(out))
