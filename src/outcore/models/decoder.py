"""A Llama-style decoder LM: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention.

Single-device model code: nothing here knows about streaming. The engine finds
`model.layers` and streams it. With `labels`, the loss is computed over token chunks so
the B x T x V logits are never materialised at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import OutcoreError
from ..meta import building_on_meta, materialize, meta_parameters
from .kernels import Kernels

_KERNELS = {False: Kernels(compiled=False), True: Kernels(compiled=True)}


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 32000
    dim: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 32
    ffn: int = 11008
    max_seq: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    # RMSNorm through F.rms_norm in the activations' dtype (one fused kernel on recent CUDA
    # builds) instead of six fp32 elementwise passes; numerically the same in fp32, one
    # rounding of the weight to bf16 apart under bf16 autocast. Off by default until
    # measured on the GPU (bench/stream.py --fused-norm).
    fused_norm: bool = False
    # The block's elementwise parts (RMSNorm, residual add + norm, rotary embedding, SwiGLU)
    # each as one torch.compile'd kernel forward and one backward (models/kernels.py); the
    # same math as the eager functions. Takes precedence over fused_norm inside blocks.
    compiled: bool = False

    def __post_init__(self) -> None:
        # here, in one line, not as a shape error from inside torch at the first forward
        for f in ("vocab", "dim", "layers", "heads", "kv_heads", "ffn", "max_seq"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise OutcoreError(f"DecoderConfig {f}={v!r}: it must be a positive integer")
        if self.dim % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise OutcoreError(f"DecoderConfig dim={self.dim}, heads={self.heads}, kv_heads="
                               f"{self.kv_heads}: heads must divide dim into an even head "
                               "size (rotary pairs) and kv_heads must divide heads")
        if not (self.rope_theta > 0 and self.norm_eps >= 0):   # also False for NaN
            raise OutcoreError(f"DecoderConfig rope_theta={self.rope_theta!r}, norm_eps="
                               f"{self.norm_eps!r}: rope_theta must be > 0, norm_eps >= 0")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def num_params(self) -> int:
        d, hd = self.dim, self.head_dim
        attn = d * d * 2 + 2 * d * self.kv_heads * hd
        block = attn + 3 * d * self.ffn + 2 * d
        emb = self.vocab * d * (1 if self.tie_embeddings else 2)
        return self.layers * block + emb + d


SIZES: dict[str, DecoderConfig] = {
    "tiny": DecoderConfig(vocab=256, dim=64, layers=4, heads=4, kv_heads=2, ffn=192, max_seq=512),
    "small": DecoderConfig(vocab=256, dim=256, layers=6, heads=8, kv_heads=4, ffn=704,
                           max_seq=1024),
    "125m": DecoderConfig(vocab=32000, dim=768, layers=12, heads=12, kv_heads=12, ffn=2048),
    "350m": DecoderConfig(vocab=32000, dim=1024, layers=24, heads=16, kv_heads=16, ffn=2816),
    "1b": DecoderConfig(vocab=32000, dim=2048, layers=16, heads=16, kv_heads=16, ffn=5632),
    "3b": DecoderConfig(vocab=32000, dim=3072, layers=28, heads=24, kv_heads=24, ffn=8192),
    "7b": DecoderConfig(vocab=32000, dim=4096, layers=32, heads=32, kv_heads=32, ffn=11008),
    "8b": DecoderConfig(vocab=32000, dim=4096, layers=36, heads=32, kv_heads=8, ffn=14336),
    "13b": DecoderConfig(vocab=32000, dim=5120, layers=40, heads=40, kv_heads=40, ffn=13824),
    "30b": DecoderConfig(vocab=32000, dim=6656, layers=60, heads=52, kv_heads=52, ffn=17920),
    "70b": DecoderConfig(vocab=32000, dim=8192, layers=80, heads=64, kv_heads=8, ffn=28672),
}


def decoder(size: str, lazy: bool = False, **overrides) -> "Decoder":
    """A reference decoder of a named size ("tiny" .. "70b"), fields overridable.

    lazy: parameters on the meta device (no memory); the engine fills them with
    Decoder.init_param as it builds its host state (stream/materialize.py). Else (and not
    inside meta_parameters()) they are real fp32 CPU tensors holding those same values,
    drawn in row blocks on every core (meta.materialize), seeded from torch.initial_seed():
    the same seed gives the same weights, and the caller's RNG is left where it was. Under
    `with torch.device(d):` (d not the CPU) torch builds it on d, from the caller's RNG."""
    if size not in SIZES:
        raise OutcoreError(f"unknown model size {size!r}: choose one of {', '.join(SIZES)}")
    cfg = replace(SIZES[size], **overrides)
    if not lazy and _default_device().type != "cpu":
        return Decoder(cfg)   # under `with torch.device(...)`: torch builds it there
    with meta_parameters():
        model = Decoder(cfg)
    return model if lazy or building_on_meta() else materialize(model)


def _default_device() -> torch.device:
    """The device torch creates tensors on now (`with torch.device("cuda"):` sets it)."""
    get = getattr(torch, "get_default_device", None)   # torch >= 2.3
    return get() if get is not None else torch.empty(0).device


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, fused: bool = False, compiled: bool = False):
        super().__init__()
        self.eps = eps
        self.fused = fused and not compiled
        self.compiled = compiled
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            # autocast off: it would run the norm in fp32 on some builds; the dtype is
            # chosen here (the activations', accumulation in fp32 inside the kernel)
            with torch.autocast(x.device.type, enabled=False):
                return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)
        return _KERNELS[self.compiled].rms_norm(x, self.weight, self.eps)


def rope_tables(cfg: DecoderConfig, seq: int, device, dtype):
    """cos, sin: 1 x T x head_dim (dim 0 is 1 so micro-batch splitting leaves them alone)."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    t = torch.arange(seq, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[None].to(dtype), emb.sin()[None].to(dtype)


class Block(nn.Module):
    """x: B x T x D -> B x T x D (pre-norm attention + SwiGLU MLP, residuals)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        d, hd = cfg.dim, cfg.head_dim
        self.cfg = cfg
        self.attn_norm = RMSNorm(d, cfg.norm_eps, cfg.fused_norm, cfg.compiled)
        self.wq = nn.Linear(d, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps, cfg.fused_norm, cfg.compiled)
        self.w1 = nn.Linear(d, cfg.ffn, bias=False)
        self.w3 = nn.Linear(d, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.cfg
        kern = _KERNELS[c.compiled]
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, c.heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos[:, None, :T].to(q.dtype), sin[:, None, :T].to(q.dtype)
        q, k = kern.rotate(q, cos, sin), kern.rotate(k, cos, sin)
        if c.kv_heads != c.heads:
            rep = c.heads // c.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = self.wo(a.transpose(1, 2).reshape(B, T, -1))
        if c.compiled:  # the residual add and the MLP's norm in one kernel; SwiGLU in one
            x, h = kern.add_rms_norm(x, o, self.mlp_norm.weight, c.norm_eps)
            return x + self.w2(kern.swiglu(self.w1(h), self.w3(h)))
        x = x + o
        h = self.mlp_norm(x)
        # eager: SiLU before the up projection, so SiLU's input is freed first
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def _chunk_loss(h, weight, labels):
    logits = F.linear(h, weight).float()
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


class Decoder(nn.Module):
    """input_ids: B x T (int64) -> SimpleNamespace(loss, logits).

    With labels (B x T, -100 ignored) the loss is the mean next-token cross-entropy
    (labels are shifted inside, as in Hugging Face) and logits is None.
    """

    loss_chunk_tokens = 4096

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, cfg.fused_norm, cfg.compiled)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, self._std(name))

    def _std(self, name: str) -> float:
        """0.02; the residual branches' output projections scaled by 1/sqrt(2 layers)."""
        if name.endswith(("wo.weight", "w2.weight")):
            return 0.02 / math.sqrt(2 * self.cfg.layers)
        return 0.02

    def init_param(self, name: str, t: torch.Tensor, generator: torch.Generator) -> None:
        """t (rows of parameter `name`, or all of a 1-D one) <- initial values, in place,
        each element on its own: a 2-D weight's from normal(0, std) as reset_parameters
        draws it, a norm's weight ones. The engine calls it for a model built with
        lazy=True (stream/materialize.py), on several row blocks at once."""
        if t.dim() == 2:
            t.normal_(0.0, self._std(name), generator=generator)
        else:
            t.fill_(1.0)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        if input_ids.dim() != 2 or (labels is not None and labels.shape != input_ids.shape):
            raise OutcoreError(f"Decoder: input_ids must be B x T and labels the same shape, "
                               f"got {tuple(input_ids.shape)} and "
                               f"{None if labels is None else tuple(labels.shape)}")
        B, T = input_ids.shape
        if T > self.cfg.max_seq:
            raise OutcoreError(f"sequence length {T} exceeds the model's max_seq "
                               f"{self.cfg.max_seq}")
        dtype = torch.get_autocast_dtype(input_ids.device.type) \
            if torch.is_autocast_enabled(input_ids.device.type) else torch.float32
        x = self.embed(input_ids).to(dtype)
        cos, sin = rope_tables(self.cfg, T, input_ids.device, torch.float32)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        if labels is None:
            return SimpleNamespace(loss=None, logits=self.head(x))
        return SimpleNamespace(loss=self.loss(x, labels), logits=None)

    def loss(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean next-token CE over labels != -100, in chunks with recompute."""
        h = x[:, :-1].reshape(-1, x.shape[-1])
        y = labels[:, 1:].reshape(-1)
        count = (y != -100).sum().clamp(min=1)
        total = h.new_zeros((), dtype=torch.float32)
        w = self.head.weight
        for s in range(0, h.shape[0], self.loss_chunk_tokens):
            hs, ys = h[s:s + self.loss_chunk_tokens], y[s:s + self.loss_chunk_tokens]
            if h.requires_grad or w.requires_grad:
                total = total + checkpoint(_chunk_loss, hs, w, ys, use_reentrant=False)
            else:
                total = total + _chunk_loss(hs, w, ys)
        return total / count

    def estimate_flops_per_token(self) -> float:
        """6 x params (model FLOPs per trained token, the convention of the MFU figures)."""
        return 6.0 * self.cfg.num_params()
