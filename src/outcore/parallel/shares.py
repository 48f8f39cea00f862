"""Each rank's share of the global batch: given, equal, or following measured speed.

`split_rows(B, shares)` -> rows per rank (sum B, each >= 1, largest-remainder rounding).
`ShareMeter` ("measured"): after steps 1..warmup and then every `every` steps, every rank
publishes (rows, busy seconds) and the shares become proportional to rows / busy seconds,
so a slower GPU gets fewer rows and all ranks finish their compute together.
"""

from __future__ import annotations

from ..errors import OutcoreError


def split_rows(batch: int, shares: list[float]) -> list[int]:
    """batch rows split by `shares` (any positive weights), every rank at least one row."""
    n = len(shares)
    if batch < n:
        raise OutcoreError(f"a batch of {batch} rows cannot be split over {n} ranks: use a "
                           f"batch size of at least {n}")
    total = float(sum(shares))
    want = [batch * s / total for s in shares]
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
    """None | list of world positive floats | 'measured' -> normalized form."""
    if shares is None or shares == "measured":
        return shares
    if isinstance(shares, str) or len(shares) != world or any(
            not (float(s) > 0) for s in shares):
        raise OutcoreError(f"shares={shares!r}: give None (equal), 'measured', or {world} "
                           "positive numbers, one per rank")
    return [float(s) for s in shares]


class ShareMeter:
    """The shares of every rank; re-measured per the module docstring."""

    def __init__(self, comm, shares, warmup: int = 3, every: int = 20):
        self.comm = comm
        self.mode = check_shares(shares, comm.world)
        self.shares = [1.0] * comm.world if self.mode in (None, "measured") else self.mode
        self.warmup, self.every = warmup, every
        self.steps = 0
        self.history: list[list[float]] = []

    def rows(self, batch: int) -> list[int]:
        return split_rows(batch, self.shares)

    def observe(self, rows: int, busy_s: float) -> None:
        """After a step: this rank computed `rows` rows in `busy_s` seconds of compute."""
        self.steps += 1
        if self.mode != "measured":
            return
        if not (self.steps <= self.warmup or self.steps % self.every == 0):
            return
        t = self.comm.gather_rows([float(rows), float(busy_s)])  # collective: every rank
        rate = [r / max(b, 1e-9) for r, b in t.tolist()]
        self.shares = [x / sum(rate) for x in rate]
        self.history.append(list(self.shares))
