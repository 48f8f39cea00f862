"""One training step's math: scores, loss and gradients of a batch of positive edges.

Shapes: U, V: B x d (source and target rows of the positives), NU, NV: K x M x d (the
sampled negatives of the K = ceil(B / C) chunks, for the source and the target side).
Chunk k scores its C positives against [its own C targets (batch negatives), its M sampled
targets]: one bmm of (C x d) @ (d x (C + M)) per chunk, and the same for sources. A
positive's own pair among the batch negatives is masked with -1e9 (as PyTorch-BigGraph
does), so it costs nothing in any loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_MASKED = -1e9


@dataclass(frozen=True)
class LossSpec:
    score: str = "dot"          # "dot" | "cosine"
    loss: str = "softmax"       # "softmax" | "logistic" | "ranking"
    margin: float = 0.1
    chunk: int = 64
    batch_negatives: bool = True


def _side_loss(pos: torch.Tensor, blocks: list[torch.Tensor], spec: LossSpec) -> torch.Tensor:
    """pos: n; blocks: score blocks n x k_i (masked entries at -1e9) -> summed loss.

    The blocks are never concatenated (a copy of every score): each loss splits over them,
    softmax through logsumexp of the blocks' logsumexps (as PyTorch-BigGraph does).
    """
    if spec.loss == "logistic":       # the positive's own term stays without negatives
        k = sum(b.shape[1] for b in blocks)
        return F.softplus(-pos).sum() + sum(F.softplus(b).sum() for b in blocks) / max(k, 1)
    if not blocks:
        return pos.new_zeros(())
    if spec.loss == "softmax":
        lse = [torch.logsumexp(b, 1) for b in blocks]
        neg = lse[0] if len(lse) == 1 else torch.logsumexp(torch.stack(lse, 1), 1)
        return (torch.logaddexp(pos, neg) - pos).sum()
    return sum(F.relu(spec.margin - pos[:, None] + b).sum() for b in blocks)


_EYES: dict = {}


def _eye(C: int, device) -> torch.Tensor:
    key = (C, str(device))
    if key not in _EYES:
        _EYES[key] = torch.eye(C, dtype=torch.bool, device=device)
    return _EYES[key]


def _chunk_scores(a: torch.Tensor, b: torch.Tensor, nb: torch.Tensor, spec: LossSpec):
    """a, b: K x C x d (positives), nb: K x M x d -> score blocks of a against b's side,
    each (K*C) x k: the chunk's own targets (diagonal masked) and the sampled ones."""
    K, C, _ = a.shape
    blocks = []
    if spec.batch_negatives and C > 1:
        s = torch.bmm(a, b.transpose(1, 2))                     # K x C x C
        s.masked_fill_(_eye(C, a.device), _MASKED)             # in place: bmm keeps its inputs
        blocks.append(s.view(K * C, C))
    if nb.shape[1] > 0:
        blocks.append(torch.bmm(a, nb.transpose(1, 2)).view(K * C, -1))   # K x C x M
    return blocks


def batch_loss(U, V, NU, NV, spec: LossSpec) -> torch.Tensor:
    """Sum over the batch of the loss of both corruptions (target side, source side)."""
    if spec.score == "cosine":
        U, V = F.normalize(U, dim=-1), F.normalize(V, dim=-1)
        NU, NV = F.normalize(NU, dim=-1), F.normalize(NV, dim=-1)
    B, d = U.shape
    pos = (U * V).sum(1)
    total = U.new_zeros(())
    for lo, hi, ks, c in chunk_ranges(B, spec.chunk, NU.shape[0]):
        u = U[lo:hi].view(-1, c, d)
        v = V[lo:hi].view(-1, c, d)
        neg_t = _chunk_scores(u, v, NV[ks], spec)        # corrupt the target
        neg_s = _chunk_scores(v, u, NU[ks], spec)        # corrupt the source
        total = total + _side_loss(pos[lo:hi], neg_t, spec) + _side_loss(pos[lo:hi], neg_s, spec)
    return total


def chunk_ranges(batch: int, chunk: int, k: int):
    """(lo, hi, negatives slice, rows per chunk) for the full chunks of a batch, then the
    remainder chunk if any; the negatives tensor holds one row block per chunk (k of them)."""
    C = min(chunk, batch)
    full = (batch // C) * C
    if full:
        yield 0, full, slice(0, full // C), C
    if batch > full:
        yield full, batch, slice(full // C, k), batch - full


def num_chunks(batch: int, chunk: int) -> int:
    """Chunks of a batch: full ones plus one for the remainder."""
    C = min(chunk, batch)
    return batch // C + (1 if batch % C else 0)


def _softmax_side(A, Bp, Ns, pos, batch_negs: bool, dA, dB, dNs, first: bool):
    """One corruption of dot-score softmax, gradients by hand, written into dA, dB, dNs.

    A, Bp: k x c x d (anchors and their positive partners), Ns: k x M x d, pos: k x c.
    The score blocks are written once by bmm and turned into probabilities in place (exp,
    scale): no autograd copies of k x c x (c + M). `first` sets dA and dB, otherwise this
    side's gradients are added to them (the other corruption wrote them): no extra pass.
    Returns the summed loss.
    """
    k, c, _ = A.shape
    blocks = []
    if batch_negs and c > 1:
        Sb = torch.bmm(A, Bp.transpose(1, 2))
        Sb.diagonal(dim1=1, dim2=2).fill_(float("-inf"))     # a positive is no negative
        blocks.append(Sb)
    if Ns.shape[1] > 0:
        blocks.append(torch.bmm(A, Ns.transpose(1, 2)))
    m = pos.clone()
    for S in blocks:
        m = torch.maximum(m, S.amax(-1))
    total = torch.exp(pos - m)
    p0 = total.clone()
    for S in blocks:
        total += S.sub_(m.unsqueeze(-1)).exp_().sum(-1)         # S now holds exp(s - m)
    loss = (m + torch.log(total) - pos).sum()
    inv = total.reciprocal_().unsqueeze(-1)
    w = (p0 * inv.squeeze(-1) - 1).unsqueeze(-1)                 # dloss/dpos
    if first:
        torch.mul(w, Bp, out=dA)
        torch.mul(w, A, out=dB)
    else:
        dA.addcmul_(w, Bp)
        dB.addcmul_(w, A)
    i = 0
    if batch_negs and c > 1:
        Pb = blocks[0].mul_(inv)                                 # probabilities, in place
        dA.baddbmm_(Pb, Bp)
        dB.baddbmm_(Pb.transpose(1, 2), A)
        i = 1
    if Ns.shape[1] > 0:
        Ps = blocks[i].mul_(inv)
        dA.baddbmm_(Ps, Ns)
        torch.bmm(Ps.transpose(1, 2), A, out=dNs)
    else:
        dNs.zero_()
    return loss


def softmax_dot_grads(U, V, NU, NV, spec: LossSpec):
    """batch_grads for score="dot", loss="softmax" without autograd: both corruptions,
    each chunk's gradient rows written straight into dU, dV, dNU, dNV."""
    B, d = U.shape
    dU, dV = torch.empty_like(U), torch.empty_like(V)
    dNU, dNV = torch.empty_like(NU), torch.empty_like(NV)
    pos = (U * V).sum(1)
    total = U.new_zeros(())
    for lo, hi, ks, c in chunk_ranges(B, spec.chunk, NU.shape[0]):
        u, v = U[lo:hi].view(-1, c, d), V[lo:hi].view(-1, c, d)
        du, dv = dU[lo:hi].view(-1, c, d), dV[lo:hi].view(-1, c, d)
        pc = pos[lo:hi].view(-1, c)
        bn = spec.batch_negatives
        total = total + _softmax_side(u, v, NV[ks], pc, bn, du, dv, dNV[ks], first=True)
        total = total + _softmax_side(v, u, NU[ks], pc, bn, dv, du, dNU[ks], first=False)
    return total, dU, dV, dNU, dNV


def batch_grads(U, V, NU, NV, spec: LossSpec):
    """(loss, dU, dV, dNU, dNV) for leaf copies of the gathered rows."""
    if spec.score == "dot" and spec.loss == "softmax":
        with torch.no_grad():
            return softmax_dot_grads(U, V, NU, NV, spec)
    U, V, NU, NV = (t.detach().requires_grad_(True) for t in (U, V, NU, NV))
    loss = batch_loss(U, V, NU, NV, spec)
    if not loss.requires_grad:     # no negatives at all (a 1-edge chunk, num_negatives=0)
        return loss.detach(), *(torch.zeros_like(t) for t in (U, V, NU, NV))
    dU, dV, dNU, dNV = torch.autograd.grad(loss, (U, V, NU, NV), materialize_grads=True)
    return loss.detach(), dU, dV, dNU, dNV
