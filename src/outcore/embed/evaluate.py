"""Evaluation: link prediction by PyTorch-BigGraph's protocol, and node classification.

Link prediction: held-out edges in chunks of `batch_negs`; each edge's target is ranked
against the other targets of its chunk (its own masked) plus `uniform_negs` nodes drawn
uniformly for the chunk, and likewise its source: rank = 1 + #(negatives scoring >= the
positive). MRR is the mean of 1/rank over both corruptions; Hits@10 the share of ranks
<= 10. A graph of at most `uniform_negs` nodes is ranked against every other node once
instead (the exact rank, at most N): that many draws with replacement would count each
node many times over, the edge's own node among them as a tie.

Node classification: a logistic regression (torch, L-BFGS) on the embeddings of half the
labelled nodes, micro- and macro-F1 on the other half.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import OutcoreError
from .checked import host_tensor
from .table import EmbeddingTable


def _rows(emb, ids: np.ndarray, device) -> torch.Tensor:
    if isinstance(emb, EmbeddingTable):
        t = emb.gather(ids)
    elif isinstance(emb, torch.Tensor):
        t = emb[torch.from_numpy(np.asarray(ids, dtype=np.int64))].float()
    else:
        t = torch.from_numpy(np.asarray(emb[np.asarray(ids)], dtype=np.float32))
    return t.to(device)


@torch.no_grad()
def evaluate_link_prediction(emb, src: np.ndarray, dst: np.ndarray, *, dim: int | None = None,
                             directed: bool = False, score: str = "dot",
                             batch_negs: int = 1000, uniform_negs: int = 1000,
                             device: str = "cpu", seed: int = 0,
                             max_edges: int | None = None) -> dict:
    """emb: N x W (array, memmap or EmbeddingTable); src, dst: held-out edges.

    directed: W = 2 * dim, source vectors first, target vectors second. dim: None (read
    from W), or the vector size, checked against W.
    Returns {"mrr", "hits10", "hits1", "mean_rank", "count"}.
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if len(src) == 0:
        raise OutcoreError("no held-out edges to evaluate")
    _check_negs(batch_negs, uniform_negs)
    N = emb.num_nodes if hasattr(emb, "num_nodes") else emb.shape[0]
    W = emb.width if hasattr(emb, "width") else emb.shape[1]
    d = W // 2 if directed else W
    if dim is not None and dim != d:        # scoring other slices would be silently wrong
        how = " (source, then target)" if directed else ""
        raise OutcoreError(f"dim={dim} does not match the embeddings: their {W} columns hold "
                           f"vectors of size {d}{how}; pass dim={d} or leave it out")
    if max(src.max(), dst.max()) >= N or min(src.min(), dst.min()) < 0:
        raise OutcoreError(f"held-out edges name nodes outside 0..{N - 1}: evaluate with the "
                           "embeddings of the graph they came from")
    rng = np.random.default_rng(seed)
    if max_edges is not None and len(src) > max_edges:
        pick = rng.choice(len(src), max_edges, replace=False)
        src, dst = src[pick], dst[pick]
    dev = torch.device(device)
    if N <= uniform_negs:
        r = _exact_ranks(emb, src, dst, N, W, d, score, batch_negs, dev)
        return _metrics(r, len(src))
    ranks = []
    C = batch_negs
    for lo in range(0, len(src), C * 64):          # 64 chunks at a time
        s, t = src[lo:lo + C * 64], dst[lo:lo + C * 64]
        for clo in range(0, len(s), C):
            cs, ct = s[clo:clo + C], t[clo:clo + C]
            unif = rng.integers(0, N, size=uniform_negs)
            need = np.concatenate([cs, ct, unif])
            rows = _rows(emb, need, dev)
            n = len(cs)
            A = rows[:n, :d]                             # source vectors of the sources
            Bt = rows[n:2 * n, W - d:]                   # target vectors of the targets
            UA = rows[2 * n:, :d]
            UB = rows[2 * n:, W - d:]
            if score == "cosine":
                A, Bt, UA, UB = (F.normalize(x, dim=-1) for x in (A, Bt, UA, UB))
            pos = (A * Bt).sum(1)
            eye = torch.eye(n, dtype=torch.bool, device=dev)
            for negs_batch, negs_unif, anchor in ((Bt, UB, A), (A, UA, Bt)):
                sb = (anchor @ negs_batch.T).masked_fill(eye, float("-inf"))
                su = anchor @ negs_unif.T
                r = 1 + (sb >= pos[:, None]).sum(1) + (su >= pos[:, None]).sum(1)
                ranks.append(r.cpu())
    return _metrics(torch.cat(ranks), len(src))


def _is_count(v, least: int) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= least


def _check_negs(batch_negs, uniform_negs) -> None:
    if not _is_count(batch_negs, 1):
        raise OutcoreError(f"batch_negs={batch_negs!r} must be an integer >= 1 (edges ranked "
                           "together; the CLI's --eval-negatives)")
    if not _is_count(uniform_negs, 0):
        raise OutcoreError(f"uniform_negs={uniform_negs!r} must be an integer >= 0 (the CLI's "
                           "--eval-negatives)")


def _metrics(r: torch.Tensor, count: int) -> dict:
    """ranks (both corruptions of every edge) -> the metrics."""
    r = r.double()
    return {"mrr": float((1.0 / r).mean()), "hits10": float((r <= 10).double().mean()),
            "hits1": float((r <= 1).double().mean()), "mean_rank": float(r.mean()),
            "count": int(count)}


def _exact_ranks(emb, src, dst, N, W, d, score, chunk, dev) -> torch.Tensor:
    """A small graph (N <= uniform_negs): each edge's target ranked against every other
    node's target vector, its source against every other node's source vector."""
    every = _rows(emb, np.arange(N), dev)
    S, T = every[:, :d], every[:, W - d:]
    if score == "cosine":
        S, T = F.normalize(S, dim=-1), F.normalize(T, dim=-1)
    ranks = []
    for lo in range(0, len(src), chunk):
        cs = host_tensor(src[lo:lo + chunk]).to(dev)       # read_edges' are read-only
        ct = host_tensor(dst[lo:lo + chunk]).to(dev)
        A, Bt = S[cs], T[ct]
        pos = (A * Bt).sum(1)
        for anchor, cands, true in ((A, T, ct), (Bt, S, cs)):
            sc = (anchor @ cands.T).scatter_(1, true[:, None], float("-inf"))
            ranks.append((1 + (sc >= pos[:, None]).sum(1)).cpu())
    return torch.cat(ranks)


def f1_scores(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> tuple[float, float]:
    """(micro-F1, macro-F1) of single-label predictions (micro-F1 = accuracy here)."""
    micro = float((y_true == y_pred).mean())
    f1s = []
    for c in range(num_classes):
        tp = np.sum((y_pred == c) & (y_true == c))
        fp = np.sum((y_pred == c) & (y_true != c))
        fn = np.sum((y_pred != c) & (y_true == c))
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return micro, float(np.mean(f1s)) if f1s else 0.0


def node_classification(emb, labels: np.ndarray, *, train_fraction: float = 0.5,
                        seed: int = 0, max_nodes: int = 200_000, l2: float = 1e-4,
                        iters: int = 100, device: str = "cpu") -> dict:
    """Logistic regression on embeddings of labelled nodes (label >= 0).

    emb: N x d; labels: N ints (-1 = unlabelled). Returns {"micro_f1", "macro_f1", ...}.
    """
    labels = np.asarray(labels, dtype=np.int64)
    nodes = np.flatnonzero(labels >= 0)
    if len(nodes) < 4:
        raise OutcoreError("node classification needs at least 4 labelled nodes")
    rng = np.random.default_rng(seed)
    rng.shuffle(nodes)
    nodes = nodes[:max_nodes]
    cut = max(1, int(len(nodes) * train_fraction))
    te = nodes[cut:]
    if len(te) == 0:
        raise OutcoreError("train_fraction leaves no nodes to test on")
    classes, y = np.unique(labels[nodes], return_inverse=True)
    y = torch.from_numpy(y)
    K = len(classes)
    dev = torch.device(device)
    X = _rows(emb, nodes, dev)
    mu, sd = X[:cut].mean(0), X[:cut].std(0) + 1e-6
    X = (X - mu) / sd
    Xtr, ytr = X[:cut], y[:cut].to(dev)
    Wt = torch.zeros(X.shape[1], K, device=dev, requires_grad=True)
    b = torch.zeros(K, device=dev, requires_grad=True)
    opt = torch.optim.LBFGS([Wt, b], lr=1.0, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(Xtr @ Wt + b, ytr) + l2 * Wt.pow(2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        pred = (X[cut:] @ Wt + b).argmax(1).cpu().numpy()
    micro, macro = f1_scores(y[cut:].numpy(), pred, K)
    return {"micro_f1": micro, "macro_f1": macro, "train_nodes": int(cut),
            "test_nodes": int(len(te)), "classes": int(K)}
