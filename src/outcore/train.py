"""`outcore train`: build the model, data and engine from a TrainConfig and run the loop."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import TrainConfig
from .data import ByteTokenizer, PackedTokens, read_text_sources, stdlib_corpus
from .errors import OutcoreError
from .hf import is_hf_dir, load_hf
from .memory import host_peak_rss_bytes
from .models import SIZES, decoder
from .stream import AdamW, Engine
from .units import fmt_bytes


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to cfg.lr, then cosine decay to 10% of it at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def _dtype(cfg: TrainConfig, device: str):
    if cfg.compute_dtype == "auto":
        return None
    if cfg.compute_dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.float32
    return getattr(torch, cfg.compute_dtype)


def build_model(cfg: TrainConfig):
    """(model, tokenizer) for --model: a reference size or a local HF checkpoint dir."""
    if cfg.model in SIZES:
        max_seq = max(SIZES[cfg.model].max_seq, cfg.seq_len)
        return decoder(cfg.model, max_seq=max_seq), ByteTokenizer()
    if is_hf_dir(cfg.model):
        model, tok = load_hf(cfg.model)
        if tok is None:
            raise OutcoreError(f"--model {cfg.model} has no tokenizer files: add them to the "
                               "checkpoint directory")
        return model, tok
    raise OutcoreError(f"--model {cfg.model!r} is neither a reference size "
                       f"({', '.join(SIZES)}) nor a Hugging Face checkpoint directory")


def build_data(cfg: TrainConfig, tokenizer) -> PackedTokens:
    raw = read_text_sources(cfg.data) if cfg.data else stdlib_corpus(cfg.max_data_bytes)
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode(raw)
    else:
        import numpy as np
        ids = np.asarray(tokenizer(raw.decode("utf-8", errors="replace"))["input_ids"])
    return PackedTokens(ids, cfg.seq_len, seed=cfg.seed)


@torch.no_grad()
def generate(model, tokenizer, prompt: str, n: int, temperature: float = 0.8) -> str:
    """Sample n tokens after `prompt` with the CPU master weights (small models only)."""
    ids = torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long)[None]
    g = torch.Generator().manual_seed(0)
    max_seq = getattr(getattr(model, "cfg", None), "max_seq", 1024)
    for _ in range(n):
        out = model(input_ids=ids[:, -max_seq:])
        logits = out.logits[0, -1].float() / temperature
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
        ids = torch.cat([ids, nxt[None]], dim=1)
    return tokenizer.decode(ids[0].tolist())


def run(cfg: TrainConfig) -> dict:
    """Train per cfg; returns the summary dict that is also printed."""
    torch.manual_seed(cfg.seed)
    out_dir = Path(cfg.output_dir)
    device = _device(cfg)
    model, tok = build_model(cfg)
    data = build_data(cfg, tok)
    kw = dict(device=device, compute_dtype=_dtype(cfg, device),
              micro_batch_size=cfg.micro_batch_size, max_grad_norm=cfg.max_grad_norm,
              gpu_memory=cfg.gpu_memory, verbose=True)
    ckpt = out_dir / "checkpoint"
    if cfg.resume and (ckpt / "state.json").is_file():
        engine = Engine.load(ckpt, model, **kw)
        print(f"resumed from {ckpt} at step {engine.step_count}")
    else:
        if cfg.resume:
            print(f"--resume: no checkpoint in {ckpt}, starting from step 0")
        opt = AdamW(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
        engine = Engine(model, optimizer=opt, **kw)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    losses, times = [], []
    split = {"compute_s": 0.0, "copy_wait_s": 0.0, "optimizer_wait_s": 0.0}
    start = engine.step_count
    bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    t_run = time.perf_counter()
    for step in range(start, cfg.max_steps):
        engine.set_lr(lr_at(cfg, step))
        loss = engine.train_step(data.batch(step, cfg.batch_size))
        losses.append(loss)
        times.append(engine.stats.step_s)
        for k in split:
            split[k] += getattr(engine.stats, k)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_step / engine.stats.step_s:,.0f}")
        bar.update(1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.max_steps:
            engine.save(ckpt)
    bar.close()
    wall = time.perf_counter() - t_run
    engine.save(ckpt)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps({k: v for k, v in vars(cfg).items()
                                                     if k != "extra"}, default=str, indent=1))
    steady = sorted(times[1:] or times)
    summary = {
        "steps": len(losses), "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "tokens_per_s": tokens_per_step / steady[len(steady) // 2] if steady else 0.0,
        "wall_s": wall, "params": engine.num_params,
        "host_peak_bytes": host_peak_rss_bytes(),
        "device_peak_bytes": engine.stats.peak_device_bytes,
        "host_bytes_per_param": engine.host_bytes_per_param(), **split,
        "checkpoint": str(ckpt),
    }
    if cfg.generate_tokens and isinstance(tok, ByteTokenizer) and engine.num_params < 50e6:
        text = generate(engine.model, tok, "def ", cfg.generate_tokens)
        print("--- sample ---\n" + text + "\n--------------")
    print_summary(summary, device)
    engine.close()
    return summary


def print_summary(s: dict, device: str) -> None:
    dev_peak = fmt_bytes(s["device_peak_bytes"]) if device.startswith("cuda") else "n/a (CPU)"
    total = s["compute_s"] + s["copy_wait_s"] + s["optimizer_wait_s"]
    print(f"summary: {s['steps']} steps, loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, "
          f"{s['tokens_per_s']:,.0f} tokens/s (median step), {s['wall_s']:.1f} s wall\n"
          f"  memory: host peak {fmt_bytes(s['host_peak_bytes'])}, device peak {dev_peak}, "
          f"{s['host_bytes_per_param']:.1f} host bytes/param for {s['params'] / 1e6:.1f}M params\n"
          f"  time: block compute {s['compute_s']:.1f} s, copy wait {s['copy_wait_s']:.1f} s, "
          f"optimizer wait {s['optimizer_wait_s']:.1f} s (of {total:.1f} s accounted)\n"
          f"  checkpoint: {s['checkpoint']}")
