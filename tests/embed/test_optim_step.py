"""Sparse row optimizers and the chunked loss, against plain PyTorch doing the same densely."""

import pytest
import torch
import torch.nn.functional as F

from outcore.embed.optim import RowOptimizer, coalesce
from outcore.embed.step import LossSpec, batch_grads, batch_loss, num_chunks


def test_coalesce_sums_repeats_and_pads_with_scratch():
    ids = torch.tensor([4, 1, 4, 0, 1, 4])
    g = torch.arange(12.0).view(6, 2)
    uids, G = coalesce(ids, g, scratch=9)
    assert uids.tolist() == [0, 1, 4, 9, 9, 9]
    dense = torch.zeros(10, 2).index_add_(0, ids, g)
    torch.testing.assert_close(G[:3], dense[[0, 1, 4]])
    assert G[3:].abs().sum() == 0


def test_row_adagrad_matches_dense_reference():
    torch.manual_seed(0)
    N, w, lr, eps = 7, 3, 0.3, 1e-10
    rows = torch.randn(N + 1, w)
    state = torch.zeros(N + 1, 1)
    ref, ref_state = rows[:N].clone(), torch.zeros(N)
    opt = RowOptimizer("adagrad", lr=lr, eps=eps)
    for _ in range(4):
        ids = torch.randint(0, N, (9,))
        g = torch.randn(9, w)
        opt.update(rows, state, ids, g)
        G = torch.zeros(N, w).index_add_(0, ids, g)
        ref_state += G.pow(2).mean(1)
        ref -= lr * G / (ref_state.sqrt() + eps)[:, None]
    torch.testing.assert_close(rows[:N], ref)
    torch.testing.assert_close(state[:N, 0], ref_state)


def test_row_adam_matches_torch_sparse_adam():
    torch.manual_seed(1)
    N, w = 5, 4
    rows = torch.randn(N + 1, w)
    p = torch.nn.Parameter(rows[:N].clone())
    ref = torch.optim.SparseAdam([p], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    opt = RowOptimizer("adam", lr=0.01, eps=1e-8, beta1=0.9, beta2=0.99)
    state = torch.zeros(N + 1, opt.state_cols(w))
    for _ in range(3):   # every row touched each step: per-row t equals the global step
        ids = torch.cat([torch.arange(N), torch.randint(0, N, (6,))])
        g = torch.randn(len(ids), w)
        opt.update(rows, state, ids, g)
        p.grad = torch.zeros(N, w).index_add_(0, ids, g).to_sparse()
        ref.step()
    torch.testing.assert_close(rows[:N], p.detach(), atol=1e-6, rtol=1e-5)


def _reference_loss(U, V, NU, NV, spec):
    """Edge by edge: negatives are the chunk's other targets plus the chunk's samples."""
    B = U.shape[0]
    C = min(spec.chunk, B)
    total = 0.0
    for i in range(B):
        k = i // C
        lo, hi = k * C, min(k * C + C, B)
        for a, b, nb_batch, nb_samp, sa in ((U[i], V[i], V, NV, True), (V[i], U[i], U, NU, False)):
            if spec.score == "cosine":
                a, b = F.normalize(a, dim=0), F.normalize(b, dim=0)
                nb_batch, nb_samp = F.normalize(nb_batch, dim=-1), F.normalize(nb_samp, dim=-1)
            pos = a @ b
            negs = [nb_batch[j] @ a for j in range(lo, hi) if j != i] if spec.batch_negatives else []
            negs += [n @ a for n in nb_samp[k]]
            neg = torch.stack(negs)
            if spec.loss == "softmax":
                total = total + F.cross_entropy(torch.cat([pos[None], neg])[None],
                                                torch.zeros(1, dtype=torch.long), reduction="sum")
            elif spec.loss == "logistic":
                # masked batch negatives count in the mean's denominator as in the chunked form
                denom = (hi - lo if spec.batch_negatives else 0) + nb_samp.shape[1]
                total = total + F.softplus(-pos) + F.softplus(neg).sum() / denom
            else:
                total = total + F.relu(spec.margin - pos + neg).sum()
    return total


@pytest.mark.parametrize("loss,score,bneg", [("softmax", "dot", True), ("logistic", "dot", True),
                                             ("ranking", "cosine", True), ("softmax", "cosine", False)])
def test_chunked_loss_matches_edge_by_edge(loss, score, bneg):
    torch.manual_seed(2)
    B, d, C, M = 11, 5, 4, 3          # 2 full chunks + a remainder chunk of 3
    spec = LossSpec(score=score, loss=loss, chunk=C, batch_negatives=bneg)
    K = num_chunks(B, C)
    assert K == 3
    U, V = torch.randn(B, d), torch.randn(B, d)
    NU, NV = torch.randn(K, M, d), torch.randn(K, M, d)
    got = batch_loss(U, V, NU, NV, spec)
    want = _reference_loss(U, V, NU, NV, spec)
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), rtol=1e-4, atol=1e-4)
    loss_v, dU, dV, dNU, dNV = batch_grads(U, V, NU, NV, spec)
    Ur = U.clone().requires_grad_()
    _reference_loss(Ur, V, NU, NV, spec).backward()
    torch.testing.assert_close(dU, Ur.grad, rtol=1e-4, atol=1e-4)


def test_per_occurrence_adagrad_matches_its_dense_formula():
    torch.manual_seed(3)
    N, w, lr, eps = 6, 4, 0.2, 1e-10
    rows = torch.randn(N + 1, w)
    state = torch.rand(N + 1, 1)
    ref, ref_s = rows[:N].clone(), state[:N, 0].clone()
    parts = [(torch.randint(0, N, (5,)), torch.randn(5, w)) for _ in range(3)]
    ids = torch.cat([i for i, _ in parts])
    g = torch.cat([x for _, x in parts])
    ref_s += torch.zeros(N).index_add_(0, ids, g.pow(2).mean(1))
    G = torch.zeros(N, w).index_add_(0, ids, g)
    ref -= lr * G / (ref_s.sqrt() + eps)[:, None]
    RowOptimizer("adagrad", lr=lr, eps=eps).update_parts(
        rows, state, [(i, x.clone()) for i, x in parts], exact=False)
    torch.testing.assert_close(rows[:N], ref)
    torch.testing.assert_close(state[:N, 0], ref_s)


@pytest.mark.parametrize("B,C,M,bneg", [(13, 4, 3, True), (16, 4, 0, True), (12, 5, 3, False),
                                        (7, 8, 5, True)])
def test_hand_written_softmax_gradients_match_autograd(B, C, M, bneg):
    from outcore.embed.step import softmax_dot_grads
    torch.manual_seed(4)
    spec = LossSpec(chunk=C, batch_negatives=bneg)
    K, d = num_chunks(B, C), 6
    ts = [torch.randn(B, d) * 2, torch.randn(B, d) * 2, torch.randn(K, M, d), torch.randn(K, M, d)]
    fast = softmax_dot_grads(*ts, spec)
    leaves = [t.clone().requires_grad_() for t in ts]
    loss = batch_loss(*leaves, spec)
    loss.backward()
    torch.testing.assert_close(fast[0], loss.detach(), rtol=1e-5, atol=1e-4)
    for got, leaf in zip(fast[1:], leaves):
        want = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
