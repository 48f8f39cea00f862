"""A fused Triton step (kernel="fused"): dot score, softmax loss, row-wise Adagrad.

One program per chunk of C positives: it gathers the chunk's rows (sources, targets, and
the M sampled negatives of each side) from the device partitions, scores them against each
other with tl.dot, turns the scores into probabilities, forms every gradient with tl.dot,
and applies Adagrad straight to the table with atomic adds. Each row crosses memory about
twice (read, atomic update) instead of the dozen passes of the unfused torch step.

Semantics differ from the torch step in one way: chunks update the table as they finish
(Hogwild within a batch, as GraphVite's and PyTorch-BigGraph's workers do), so a chunk may
read rows another chunk has just moved. `emulate` below is the same computation in plain
torch, chunk after chunk (the order Triton's interpreter runs programs in); tests compare the
kernel against it under TRITON_INTERPRET=1, and with no row shared between chunks both
equal the torch step.

Triton is imported lazily: the package works without it.
"""

from __future__ import annotations

import warnings

import torch

from ..errors import OutcoreError
from .config import EmbedConfig

_KERNEL = None
_LOWP: dict[tuple, bool] = {}   # (C, M, D, batch negatives) -> bf16 dot operands needed


def check_fused(cfg: EmbedConfig) -> None:
    """Refuse configurations the fused kernel does not implement (one line each)."""
    why = None
    if cfg.score != "dot" or cfg.loss != "softmax":
        why = "it implements score='dot' with loss='softmax'"
    elif cfg.optimizer != "adagrad" or cfg.exact_sparse:
        why = "it implements row Adagrad accumulated per occurrence (exact_sparse=False)"
    elif cfg.dim < 16 or cfg.dim & (cfg.dim - 1):
        why = "dim must be a power of two >= 16"
    elif cfg.chunk_size < 16 or cfg.chunk_size & (cfg.chunk_size - 1):
        why = "chunk_size must be a power of two >= 16"
    elif cfg.num_negatives < 16 or cfg.num_negatives & (cfg.num_negatives - 1):
        why = "num_negatives must be a power of two >= 16"
    elif cfg.batch_negatives and cfg.num_negatives < cfg.chunk_size:
        # chunk 64 with 16 sampled and batch negatives hit an illegal memory access on an
        # H200 (bench/results/embed-h200-crashed.json; the interpreter runs it correctly)
        why = ("with batch negatives num_negatives must be >= chunk_size (a smaller one "
               "failed on the GPU); raise num_negatives or set batch_negatives=False")
    if why:
        raise OutcoreError(f"kernel='fused' cannot run this configuration: {why}; use "
                           "kernel='torch'")


def _build():
    from .fused_kernel import kernel
    return kernel


def fused_step(rows_a, state_a, rows_b, state_b, u, v, nu, nv, cfg: EmbedConfig,
               side_a: int, side_b: int, loss: torch.Tensor) -> None:
    """One batch on partitions a, b (full-width rows and state, contiguous), in place.

    u, v: B local ids; nu, nv: K*M local ids (K = ceil(B / C)); loss: a 1-element float32
    tensor the summed loss is added to. side_a/side_b pick the column block of each side.
    """
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build()
    d, C, M = cfg.dim, cfg.chunk_size, cfg.num_negatives
    B = u.numel()
    K = -(-B // C)
    k_state = state_a.shape[1] // cfg.sides
    key = (C, M, d, bool(cfg.batch_negatives))

    def launch(lowp: bool) -> None:
        _KERNEL[(K,)](rows_a, state_a, rows_b, state_b, u, v, nu, nv, loss, B,
                      rows_a.shape[1], state_a.shape[1], side_a * d, side_b * d,
                      side_a * k_state, side_b * k_state, cfg.lr, cfg.eps, 1.0 / d,
                      C=C, M=M, D=d, BATCH_NEGS=key[3], LOWP=lowp, num_warps=8)
    if key in _LOWP:
        launch(_LOWP[key])
        return
    try:
        launch(False)
        _LOWP[key] = False
    except Exception as e:  # noqa: BLE001 - only Triton's OutOfResources is handled
        if type(e).__name__ != "OutOfResources":
            raise
        # fp32 dot operands of this chunk need more shared memory than the GPU has (C=64,
        # D=128 with batch negatives: 256 KiB): bf16 operands, fp32 accumulation, half that
        launch(True)
        _LOWP[key] = True
        warnings.warn(f"kernel='fused': chunk_size={C}, num_negatives={M}, dim={d} needs more "
                      "shared memory than this GPU has with fp32 dot operands; using bf16 "
                      "operands (fp32 accumulation). Use a smaller chunk_size for fp32.",
                      stacklevel=2)


def low_precision_dots() -> dict[tuple, bool]:
    """(C, M, D, batch_negatives) -> whether the kernel ran with bf16 dot operands."""
    return dict(_LOWP)


def emulate(rows_a, state_a, rows_b, state_b, u, v, nu, nv, cfg: EmbedConfig,
            side_a: int, side_b: int) -> torch.Tensor:
    """The kernel's computation in plain torch, chunk after chunk, lanes in order."""
    from .step import LossSpec, softmax_dot_grads
    d, C, M = cfg.dim, cfg.chunk_size, cfg.num_negatives
    k_state = state_a.shape[1] // cfg.sides
    spec = LossSpec(chunk=C, batch_negatives=cfg.batch_negatives)
    total = torch.zeros((), device=rows_a.device)
    B = u.numel()
    for k in range(-(-B // C)):
        cu, cv = u[k * C:(k + 1) * C], v[k * C:(k + 1) * C]
        cnu, cnv = nu[k * M:(k + 1) * M], nv[k * M:(k + 1) * M]
        ca = slice(side_a * d, side_a * d + d)
        cb = slice(side_b * d, side_b * d + d)
        U, V = rows_a[cu, ca], rows_b[cv, cb]
        NU, NV = rows_a[cnu, ca].view(1, M, d), rows_b[cnv, cb].view(1, M, d)
        loss, dU, dV, dNU, dNV = softmax_dot_grads(U, V, NU, NV, spec)
        total += loss
        for R, S, idx, G, cols, sc in ((rows_a, state_a, cu, dU, ca, side_a * k_state),
                                       (rows_b, state_b, cv, dV, cb, side_b * k_state),
                                       (rows_a, state_a, cnu, dNU.view(M, d), ca, side_a * k_state),
                                       (rows_b, state_b, cnv, dNV.view(M, d), cb, side_b * k_state)):
            g2 = G.pow(2).sum(1) / d
            for lane in range(len(idx)):            # atomics: one lane after another
                r = int(idx[lane])
                old = float(S[r, sc])
                S[r, sc] = old + float(g2[lane])
                coef = cfg.lr / ((old + float(g2[lane])) ** 0.5 + cfg.eps)
                R[r, cols] -= coef * G[lane]
    return total
