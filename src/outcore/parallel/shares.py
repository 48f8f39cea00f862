"""Each rank's share of the global batch: given, equal, or following measured speed.

`split_rows(B, shares)` -> rows per rank (sum B, each >= 1, largest-remainder rounding).
`ShareMeter` ("measured"): after steps 1..warmup and then every `every` steps, every rank
publishes (rows, busy seconds) and the shares become proportional to rows / busy seconds,
so a slower GPU gets fewer rows and all ranks finish their compute together.
"""

from __future__ import annotations

import math

from ..errors import OutcoreError


def split_rows(batch: int, shares: list[float]) -> list[int]:
    """batch rows split by `shares` (any positive finite weights), every rank at least one
    row."""
    n = len(shares)
    if batch < n:
        raise OutcoreError(f"a batch of {batch} rows cannot be split over {n} ranks: use a "
                           f"batch size of at least {n}")
    top = max(shares)
    # scaled by the largest first: weights such as [1e308, 1e308] would sum to inf
    total = sum(s / top for s in shares)
    want = [batch * (s / top) / total for s in shares]
    rows = [max(1, int(w)) for w in want]
    while sum(rows) > batch:  # the minimum of one row each overshot: take from the largest
        i = max((k for k in range(n) if rows[k] > 1), key=lambda k: rows[k] - want[k])
        rows[i] -= 1
    order = sorted(range(n), key=lambda k: want[k] - rows[k], reverse=True)
    i = 0
    while sum(rows) < batch:
        rows[order[i % n]] += 1
        i += 1
    return rows


def check_shares(shares, world: int):
    """None | sequence of world positive finite numbers | 'measured' -> normalized form
    (the numbers as floats summing to 1)."""
    if shares is None or (isinstance(shares, str) and shares == "measured"):
        return shares
    bad = OutcoreError(f"shares={shares!r}: give None (equal), 'measured', or {world} "
                       "positive finite numbers, one per rank")
    if isinstance(shares, (str, bytes, dict)) or not hasattr(shares, "__len__") or \
            len(shares) != world:
        raise bad
    try:
        values = [float(s) for s in shares]
    except (TypeError, ValueError):
        raise bad from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise bad
    top = max(values)
    scaled = [v / top for v in values]   # no overflow in the sum below
    total = sum(scaled)
    return [v / total for v in scaled]


def check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise OutcoreError(f"measure_every={every!r}: give a whole number of steps >= 1 "
                           "between re-measurements of the shares")
    return every


class ShareMeter:
    """The shares of every rank; re-measured per the module docstring."""

    def __init__(self, comm, shares, warmup: int = 3, every: int = 20):
        self.comm = comm
        self.mode = check_shares(shares, comm.world)
        self.shares = [1.0 / comm.world] * comm.world if self.mode in (None, "measured") \
            else self.mode
        self.warmup, self.every = warmup, check_every(every)
        self.steps = 0
        self.history: list[list[float]] = []

    def rows(self, batch: int) -> list[int]:
        return split_rows(batch, self.shares)

    def observe(self, rows: int, busy_s: float) -> None:
        """After a step: this rank computed `rows` rows in `busy_s` seconds of compute (0:
        not timed yet, as on a GPU before the step's events have run)."""
        self.steps += 1
        if self.mode != "measured":
            return
        if not (self.steps <= self.warmup or self.steps % self.every == 0):
            return
        t = self.comm.gather_rows([float(rows), float(busy_s)])  # collective: every rank
        table = t.tolist()
        # The same table on every rank, so every rank takes or skips it alike. A rank with
        # no time (0, NaN) or no rows would read as infinitely fast or slow: skipped.
        if not all(r >= 1 and math.isfinite(b) and b > 0 for r, b in table):
            return
        rate = [r / b for r, b in table]
        if not all(math.isfinite(x) and x > 0 for x in rate):
            return
        top = max(rate)
        rate = [x / top for x in rate]
        self.shares = [x / sum(rate) for x in rate]
        self.history.append(list(self.shares))
