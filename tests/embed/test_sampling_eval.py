"""Negatives by degree**0.75, LINE weighted sampling, walks; evaluation against brute force."""

import numpy as np
import torch

from outcore.embed.evaluate import evaluate_link_prediction, f1_scores, node_classification
from outcore.embed.graph import csr
from outcore.embed.sampling import (NegativeSampler, random_walks, walk_pairs,
                                    weighted_edges)


def test_negatives_follow_degree_power_within_a_partition():
    deg = np.array([1, 16, 0, 81, 4, 1], dtype=np.int64)
    s = NegativeSampler(deg, P=2, power=0.75)      # partition 0 = nodes 0, 2, 4
    g = torch.Generator().manual_seed(0)
    draws = s.sample(3, 200000, s.cdf[0], g)
    freq = np.bincount(draws.numpy(), minlength=3) / 200000
    want = np.array([1, 0, 4 ** 0.75]) / (1 + 4 ** 0.75)
    np.testing.assert_allclose(freq, want, atol=0.01)
    assert freq[1] == 0                             # degree 0 is never drawn
    u = NegativeSampler(deg, P=1, power=0.0).sample(6, 1000, None, g)
    assert u.min() >= 0 and u.max() <= 5 and len(u.unique()) == 6


def test_line_weighted_sampling_skips_zero_weights():
    src, dst = np.tile(np.arange(4), 500), np.tile(np.arange(1, 5), 500)
    w = np.tile([0.0, 1.0, 3.0, 0.0], 500)
    s, d = weighted_edges(src, dst, w, np.random.default_rng(0))
    assert len(s) == 2000 and np.all(d == s + 1)
    assert set(s.tolist()) <= {1, 2} and abs((s == 2).mean() - 0.75) < 0.1


def test_walks_step_along_edges_and_node2vec_returns_more_with_small_p():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 50, 300), rng.integers(0, 50, 300)
    keep = src != dst
    indptr, idx = csr(50, src[keep], dst[keep])
    adj = {(a, b) for a, b in zip(src[keep], dst[keep])} | {(b, a) for a, b in zip(src[keep], dst[keep])}
    starts = np.repeat(np.arange(50), 20)
    w = random_walks(indptr, idx, starts, 8, rng)
    for row in w[:200]:
        row = row[row >= 0]
        assert all((a, b) in adj for a, b in zip(row, row[1:]))

    def returns(p, q):
        ww = random_walks(indptr, idx, starts, 8, np.random.default_rng(1), p=p, q=q)
        return np.mean(ww[:, 2:] == ww[:, :-2])
    assert returns(0.1, 1.0) > 2 * returns(10.0, 1.0)
    s, d = walk_pairs(np.array([[0, 1, 2, -1]]), window=2)
    assert sorted(zip(s.tolist(), d.tolist())) == [(0, 1), (0, 2), (1, 2)]


def test_link_prediction_matches_brute_force_ranks():
    torch.manual_seed(0)
    N, d = 30, 4
    emb = torch.randn(N, d).numpy()
    src, dst = np.array([0, 5, 7]), np.array([1, 6, 9])
    m = evaluate_link_prediction(emb, src, dst, batch_negs=3, uniform_negs=5, seed=11)
    unif = np.random.default_rng(11).integers(0, N, 5)
    ranks = []
    for i in range(3):
        pos = emb[src[i]] @ emb[dst[i]]
        for anchor, others in ((emb[src[i]], dst), (emb[dst[i]], src)):
            negs = [anchor @ emb[o] for j, o in enumerate(others) if j != i]
            negs += [anchor @ emb[x] for x in unif]
            ranks.append(1 + sum(n >= pos for n in negs))
    r = np.array(ranks, dtype=float)
    assert abs(m["mrr"] - np.mean(1 / r)) < 1e-6
    assert abs(m["hits10"] - np.mean(r <= 10)) < 1e-9


def test_f1_and_logistic_regression():
    micro, macro = f1_scores(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 2]), 3)
    assert micro == 0.75 and abs(macro - np.mean([2 / 3, 2 / 3, 1.0])) < 1e-9
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    X = np.eye(3)[labels] * 3 + rng.normal(0, 0.3, (300, 3))
    m = node_classification(X.astype(np.float32), labels)
    assert m["micro_f1"] > 0.97 and m["classes"] == 3
