"""node2vec's second-order step, exact for any p, q.

A walker at `cur` that came from `prev` steps to neighbour x with probability proportional
to 1/p (x is prev), 1 (x neighbours prev) or 1/q (farther). Most walkers are served by
rejection sampling against the uniform proposal (at most one key lookup a round); a walker
that keeps being rejected (p, q far from 1 make acceptance rare: about 1% a round at
p=0.1, q=10 on a node of many neighbours far from prev) gets one draw from its exact
distribution instead, every neighbour weighed. Rejection stopped after R rounds, R fixed
per walker, then an exact draw gives the node2vec distribution; keeping the last rejected
draw (as an earlier cap of 8 rounds did) mixes in the uniform proposal.
"""

from __future__ import annotations

import numpy as np

MIN_ROUNDS = 8        # rejection rounds every walker gets before an exact draw
MAX_ROUNDS = 1024     # bounds the loop: the rest then take the exact draw
ROUNDS_PER_ENTRY = 2   # rejection rounds worth one neighbour weighed (measured)
EXACT_ENTRIES = 1 << 22   # neighbour entries one exact draw weighs at once (memory)


def weights(keys, N, prev, cand, p, q):
    """node2vec's unnormalised weight of each step prev -> (cur) -> cand. keys: sorted
    src * N + dst of every adjacency entry, to find whether cand neighbours prev."""
    key = prev * N + cand
    k = np.searchsorted(keys, key)
    near = keys[np.minimum(k, len(keys) - 1)] == key
    return np.where(cand == prev, 1.0 / p, np.where(near, 1.0, 1.0 / q))


def exact_draw(indptr, indices, keys, N, prev, cur, p, q, rng):
    """One next node per walker from its exact node2vec distribution (cur has
    neighbours), weighing at most about EXACT_ENTRIES neighbour entries at a time."""
    out = np.empty(len(cur), dtype=np.int64)
    deg = indptr[cur + 1] - indptr[cur]
    ends = np.cumsum(deg)
    a = 0
    while a < len(cur):
        b = max(a + 1, int(np.searchsorted(ends, ends[a] - deg[a] + EXACT_ENTRIES, "right")))
        d = deg[a:b]
        first = np.cumsum(d) - d                 # each walker's first entry in the batch
        pos = np.repeat(indptr[cur[a:b]] - first, d) + np.arange(int(d.sum()))
        cand = indices[pos]
        cum = np.cumsum(weights(keys, N, np.repeat(prev[a:b], d), cand, p, q))
        lo = np.where(first > 0, cum[first - 1], 0.0)
        hi = cum[first + d - 1]
        # inverse CDF on the batch's running sum; the clip only guards rounding at the ends
        k = np.searchsorted(cum, lo + rng.random(b - a) * (hi - lo), side="right")
        out[a:b] = cand[np.clip(k, first, first + d - 1)]
        a = b
    return out


def biased_step(indptr, indices, deg, keys, N, prev, cur, nxt, p, q, rng):
    """Turn nxt (uniform draws among cur's neighbours) into node2vec draws, in place."""
    top = max(1.0 / p, 1.0, 1.0 / q)
    # a rejection round costs at most one key lookup (most skip it), the exact draw one a
    # neighbour: a walker switches after ROUNDS_PER_ENTRY rounds a neighbour (so it pays
    # a small multiple of the cheaper way), never before MIN_ROUNDS nor after MAX_ROUNDS.
    # The switch round depends on the walker's node alone, not on what it drew: exact.
    limit = np.clip(deg[cur] * ROUNDS_PER_ENTRY, MIN_ROUNDS, MAX_ROUNDS)
    todo = np.arange(len(cur))
    rounds = 0
    lo, hi = min(1.0, 1.0 / q) / top, max(1.0, 1.0 / q) / top
    while todo.size:
        pv, cand = prev[todo], nxt[todo]
        r = rng.random(todo.size)
        # accept if r < weight / top. Off the return step the weight is 1 or 1/q, so
        # r below both accepts and r above both rejects without the key lookup
        prob = np.where(cand == pv, 1.0 / p, 1.0 / q) / top
        look = (cand != pv) & (r >= lo) & (r < hi)
        prob[look] = weights(keys, N, pv[look], cand[look], p, q) / top
        todo = todo[r >= prob]
        rounds += 1
        give_up = limit[todo] <= rounds
        if give_up.any():
            w = todo[give_up]
            nxt[w] = exact_draw(indptr, indices, keys, N, prev[w], cur[w], p, q, rng)
            todo = todo[~give_up]
        c = cur[todo]
        nxt[todo] = indices[indptr[c] + (rng.random(todo.size) * deg[c]).astype(np.int64)]
    return nxt
