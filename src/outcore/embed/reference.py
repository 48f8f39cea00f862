"""A plain dense PyTorch replay of recorded training steps: one N x W table in memory, no
partitions, no slots, no streams. Tests and the benchmark's GPU check compare the trainer
against it (Worker.record gives each step's local ids; global = local * P + partition)."""

from __future__ import annotations

import torch

from .step import LossSpec, batch_grads
from .table import hash_init


def replay_dense(records, cfg, N: int, P: int) -> torch.Tensor:
    """records: [(a, b, u, v, nu, nv)] -> the N x W table after those steps."""
    d, sides = cfg.dim, cfg.sides
    W = d * sides
    T = hash_init(torch.arange(N), W, cfg.seed, cfg.init_scale)
    k = 1 if cfg.optimizer == "adagrad" else 2 * d + 1
    S = torch.zeros(N, sides * k)
    spec = LossSpec(cfg.score, cfg.loss, cfg.margin, cfg.chunk_size, cfg.batch_negatives)
    M = cfg.num_negatives
    b1, b2 = cfg.betas
    for a, b, u, v, nu, nv in records:
        gu, gv, gnu, gnv = u * P + a, v * P + b, nu * P + a, nv * P + b
        tc = (sides - 1) * d
        U, V = T[gu, :d], T[gv, tc:tc + d]
        NU, NV = T[gnu, :d].view(-1, M, d), T[gnv, tc:tc + d].view(-1, M, d)
        _, dU, dV, dNU, dNV = batch_grads(U, V, NU, NV, spec)
        groups = [(0, torch.cat([gu, gnu]), torch.cat([dU, dNU.reshape(-1, d)])),
                  (sides - 1, torch.cat([gv, gnv]), torch.cat([dV, dNV.reshape(-1, d)]))]
        if sides == 1:
            groups = [(0, torch.cat([groups[0][1], groups[1][1]]),
                       torch.cat([groups[0][2], groups[1][2]]))]
        for side, ids, g in groups:
            G = torch.zeros(N, d).index_add_(0, ids, g)
            cols = slice(side * d, side * d + d)
            st = S[:, side * k:(side + 1) * k]
            if cfg.optimizer == "adagrad":
                if cfg.exact_sparse:
                    st[:, 0] += G.pow(2).mean(1)
                else:   # each occurrence's squared gradient, the summed step
                    st[:, 0] += torch.zeros(N).index_add_(0, ids, g.pow(2).mean(1))
                T[:, cols] -= cfg.lr * G / (st[:, 0].sqrt() + cfg.eps)[:, None]
            else:
                hit = torch.zeros(N, dtype=torch.bool)
                hit[ids] = True
                m = st[hit, :d] * b1 + (1 - b1) * G[hit]
                vv = st[hit, d:2 * d] * b2 + (1 - b2) * G[hit] ** 2
                t = st[hit, 2 * d] + 1
                step = cfg.lr * (1 - b2 ** t).sqrt() / (1 - b1 ** t)
                T[hit, cols] -= step[:, None] * m / (vv.sqrt() + cfg.eps)
                st[hit] = torch.cat([m, vv, t[:, None]], 1)
    return T
