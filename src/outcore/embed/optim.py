"""Sparse row-wise optimizers whose state lives beside the rows, without host syncs.

Adagrad's default path (`update_parts`, exact=False) needs no coalescing: see there. For
the exact path, a step's gradient arrives as (ids: n, grads: n x w) with repeated ids. `coalesce` sums the
repeats by sorting (torch.unique would sync the host to learn the count of unique ids):
slot k < #unique holds one id and its summed gradient, slots beyond hold the partition's
scratch row (index n_p, which every device copy of a partition carries) and a zero
gradient. Updates then gather, compute and `index_copy_` back: real ids are unique, and
the scratch row absorbs the rest, so no atomics and no sync.

State columns per side: Adagrad 1 (sum of mean squared gradients, as PyTorch-BigGraph's
row Adagrad); Adam 2w + 1 (m, v and the row's own step count for bias correction: rows
are updated lazily, so each has its own t).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def coalesce(ids: torch.Tensor, grads: torch.Tensor, scratch: int):
    """ids: n int64, grads: n x w -> (uids: n, G: n x w); uids unique except `scratch`."""
    sids, order = torch.sort(ids)
    new = torch.ones_like(sids, dtype=torch.bool)
    new[1:] = sids[1:] != sids[:-1]
    seg = torch.cumsum(new, 0) - 1                     # segment (unique id) of each entry
    G = torch.zeros_like(grads).index_add_(0, seg, grads[order])
    uids = torch.full_like(sids, scratch).scatter_(0, seg, sids)
    return uids, G


@dataclass(frozen=True)
class RowOptimizer:
    """Adagrad (row-wise) or Adam (element-wise m, v; per-row step) on a partition."""

    kind: str = "adagrad"
    lr: float = 0.1
    eps: float = 1e-10
    beta1: float = 0.9
    beta2: float = 0.999

    def state_cols(self, width: int) -> int:
        """State columns for one side of `width` columns."""
        return 1 if self.kind == "adagrad" else 2 * width + 1

    def update_parts(self, rows: torch.Tensor, state: torch.Tensor, parts, exact: bool) -> None:
        """parts: [(ids: n_i, grads: n_i x w)] of one partition side (grads are consumed).

        Adagrad with exact=False adds each occurrence's mean squared gradient to the row's
        state, then moves the row by lr * (sum of its gradients) / sqrt(state): the step
        of every occurrence uses the same coefficient, so no sort and no coalescing, just
        atomic index_add_ (the order of float additions may vary between runs on a GPU).
        Otherwise the gradients are coalesced first (exact batch Adagrad; always for Adam).
        """
        if self.kind != "adagrad" or exact:
            ids = torch.cat([i for i, _ in parts])
            grads = torch.cat([g for _, g in parts])
            return self.update(rows, state, ids, grads)
        w = rows.shape[1]
        s = state[:, 0]
        for ids, g in parts:
            s.index_add_(0, ids, torch.linalg.vector_norm(g, dim=1).pow_(2).div_(w))
        for ids, g in parts:
            coef = (s.index_select(0, ids).sqrt_().add_(self.eps)).reciprocal_()
            rows.index_add_(0, ids, g.mul_(coef.unsqueeze(1)), alpha=-self.lr)

    def update(self, rows: torch.Tensor, state: torch.Tensor, ids: torch.Tensor,
               grads: torch.Tensor) -> None:
        """rows: (n_p + 1) x w (last = scratch), state: (n_p + 1) x S, ids: n, grads: n x w.

        rows/state may be column slices (one side of a two-sided table).
        """
        uids, G = coalesce(ids, grads, rows.shape[0] - 1)
        if self.kind == "adagrad":
            s = state[:, 0].index_select(0, uids) + G.pow(2).mean(1)
            state[:, 0].index_copy_(0, uids, s)
            step = G / (s.sqrt() + self.eps).unsqueeze(1)
            rows.index_copy_(0, uids, rows.index_select(0, uids) - self.lr * step)
            return
        w = rows.shape[1]
        st = state.index_select(0, uids)
        m = st[:, :w] * self.beta1 + G * (1 - self.beta1)
        v = st[:, w:2 * w] * self.beta2 + G * G * (1 - self.beta2)
        t = st[:, 2 * w] + 1
        bc1 = 1 - torch.pow(torch.full_like(t, self.beta1), t)
        bc2 = 1 - torch.pow(torch.full_like(t, self.beta2), t)
        size = (self.lr * bc2.sqrt() / bc1).unsqueeze(1)
        new_rows = rows.index_select(0, uids) - size * m / (v.sqrt() + self.eps)
        state.index_copy_(0, uids, torch.cat([m, v, t.unsqueeze(1)], 1))
        rows.index_copy_(0, uids, new_rows)
