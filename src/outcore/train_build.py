"""The run's model, data and sample for `outcore train` (train.py): a reference size or a
local HF checkpoint directory, the corpus tokenized and packed to --seq-len rows, and the
short sample printed after training."""

from __future__ import annotations

import hashlib

import torch

from .config import TrainConfig
from .data import (ByteTokenizer, PackedTokens, read_documents, stdlib_corpus,
                   tokenize_documents)
from .errors import OutcoreError
from .hf import is_hf_dir, lazy_hf
from .models import SIZES, decoder, kernels


def build_model(cfg: TrainConfig):
    """(model, tokenizer, init) for --model: a reference size or a local HF checkpoint dir,
    its parameters on the meta device; Engine(model, init=init) fills them (init None: the
    reference decoder's own init_param)."""
    if cfg.model in SIZES:
        max_seq = max(SIZES[cfg.model].max_seq, cfg.seq_len)
        # lazy: no fp32 model is built beside the engine's host state (on every rank of
        # --nproc N, only its shard; stream/materialize.py)
        return decoder(cfg.model, lazy=True, max_seq=max_seq,
                       compiled=cfg.compile_kernels), ByteTokenizer(), None
    if is_hf_dir(cfg.model):
        if cfg.compile_kernels:
            raise OutcoreError("--compile-kernels applies to the reference sizes only: "
                               f"leave it out for --model {cfg.model}")
        from .hf import load_tokenizer
        if load_tokenizer(cfg.model) is None:  # before any weight is read
            raise OutcoreError(f"--model {cfg.model} has no tokenizer files: add them to the "
                               "checkpoint directory")
        model, tok, init = lazy_hf(cfg.model)
        # absolute position tables (GPT-2's n_positions) end there; rotary ones do not
        n_pos = getattr(model.config, "n_positions", None)
        if isinstance(n_pos, int) and cfg.seq_len > n_pos:
            raise OutcoreError(f"--seq-len {cfg.seq_len} is longer than --model {cfg.model}'s "
                               f"position table ({n_pos}): pass --seq-len {n_pos} or less")
        return model, tok, init
    from .planner import unknown_model
    raise unknown_model(cfg.model)


def build_data(cfg: TrainConfig, tokenizer, vocab: int | None = None) -> PackedTokens:
    """--data (or the stdlib corpus) tokenized and packed to --seq-len rows."""
    if cfg.data:
        docs = read_documents(cfg.data)
    else:
        docs = [("", stdlib_corpus(cfg.max_data_bytes).decode("utf-8", errors="replace"))]
    ids, labels = tokenize_documents(docs, tokenizer)
    if vocab is not None and int(ids.max()) >= vocab:
        raise OutcoreError(f"token id {int(ids.max())} is outside the model's vocabulary "
                           f"({vocab}): the tokenizer does not belong to this model")
    has_prompts = bool((labels == -100).any())
    data = PackedTokens(ids, cfg.seq_len, seed=cfg.seed, labels=labels if has_prompts else None)
    data.fingerprint = hashlib.blake2b(ids.tobytes() + labels.tobytes(),
                                       digest_size=8).hexdigest()
    return data


@torch.no_grad()
def generate(model, tokenizer, prompt: str, n: int, temperature: float = 0.8) -> str | None:
    """Sample n tokens after `prompt` with the CPU master weights (small models only);
    None where the weights or the logits are not finite (a diverged run)."""
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        return None
    ids = torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long)[None]
    g = torch.Generator().manual_seed(0)
    max_seq = getattr(getattr(model, "cfg", None), "max_seq", 1024)
    for _ in range(n):
        with kernels.eager():   # a new length each token: no compile per length
            out = model(input_ids=ids[:, -max_seq:])
        logits = out.logits[0, -1].float() / temperature
        if not bool(torch.isfinite(logits).all()):
            return None
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
        ids = torch.cat([ids, nxt[None]], dim=1)
    return tokenizer.decode(ids[0].tolist())
