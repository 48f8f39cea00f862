"""node2vec walks follow the exact second-order transition probabilities, also for p, q
that make rejection sampling's acceptance rare (the sampler kept a rejected draw after
8 rounds: a chi-square z of about 3700 at p=0.1, q=10 and 1500 at p=10, q=0.1 here)."""

import numpy as np
import pytest

import outcore.embed.node2vec as n2v
from outcore.embed.graph import csr
from outcore.embed.sampling import random_walks

N = 18


def _graph():
    # a clique (returns and common neighbours: p=10, q=0.1 reject most draws there)
    # joined to a hub of a ring of leaves (far moves: p=0.1, q=10 reject most there)
    e = [(a, b) for a in range(6) for b in range(a + 1, 6)]
    e += [(0, 6)] + [(6, k) for k in range(7, 18)] + [(k, k + 1) for k in range(7, 17)]
    e += [(17, 7), (3, 12)]
    s, d = np.array(e).T
    return csr(N, s, d)


def _exact(indptr, idx, prev, cur, p, q):
    """node2vec's P(next = x | prev, cur) for every node x, by its definition."""
    near = set(idx[indptr[prev]:indptr[prev + 1]].tolist())
    w = np.zeros(N)
    for x in idx[indptr[cur]:indptr[cur + 1]].tolist():
        w[x] += 1 / p if x == prev else 1.0 if x in near else 1 / q
    return w / w.sum()


def _fit(indptr, idx, prev, cur, nxt, p, q):
    """(chi-square z over every (prev, cur) context, largest total variation distance)."""
    ctx = prev * N + cur
    chi2, df, tv = 0.0, 0, 0.0
    for c in np.unique(ctx):
        want = _exact(indptr, idx, *divmod(int(c), N), p, q)
        got = np.bincount(nxt[ctx == c], minlength=N)
        m = got.sum()
        assert got[want == 0].sum() == 0                  # only along edges
        k = want > 0
        chi2 += ((got[k] - m * want[k]) ** 2 / (m * want[k])).sum()
        df += k.sum() - 1
        tv = max(tv, 0.5 * np.abs(got / m - want).sum())
    return (chi2 - df) / np.sqrt(2 * df), tv


@pytest.mark.parametrize("p,q", [(0.1, 10.0), (10.0, 0.1), (0.5, 2.0)])
@pytest.mark.parametrize("exact_only", [False, True])
def test_second_steps_follow_the_exact_node2vec_probabilities(p, q, exact_only, monkeypatch):
    if exact_only:       # every rejected walker takes the exact draw, in batches of <= 40
        monkeypatch.setattr(n2v, "MIN_ROUNDS", 1)
        monkeypatch.setattr(n2v, "MAX_ROUNDS", 1)
        monkeypatch.setattr(n2v, "EXACT_ENTRIES", 400)
    indptr, idx = _graph()
    starts = np.repeat(np.arange(N), 20000)
    w = random_walks(indptr, idx, starts, 3, np.random.default_rng(0), p=p, q=q)
    z, tv = _fit(indptr, idx, w[:, 0], w[:, 1], w[:, 2], p, q)
    # 344 degrees of freedom: chance alone keeps z near 0 (|z| > 4 about once in 10**4)
    assert z < 4 and tv < 0.05, (z, tv)


def test_exact_draw_of_walkers_wider_than_a_batch(monkeypatch):
    # a walker of more neighbour entries than a batch holds is a batch of its own
    monkeypatch.setattr(n2v, "EXACT_ENTRIES", 3)
    indptr, idx = _graph()
    keys = np.repeat(np.arange(N, dtype=np.int64), np.diff(indptr)) * N + idx
    prev = np.tile([0, 7, 12], 1000)                    # all at the hub, node 6
    cur = np.full(len(prev), 6)
    nxt = n2v.exact_draw(indptr, idx, keys, N, prev, cur, 0.1, 10.0, np.random.default_rng(1))
    z, tv = _fit(indptr, idx, prev, cur, nxt, 0.1, 10.0)
    assert z < 4 and tv < 0.05, (z, tv)
