"""compute="strassen": one level of Strassen-Winograd on the device, 7 GEMMs where 8 were.

    C = outcore.matmul(A, B, compute="strassen")     # float32 (or float64) arithmetic

C is cut into super-tiles and K into blocks, as few as the budget allows (one of each
where op(A), op(B) and C fit on the device with the temporaries). For each super-tile
and K block, op(A), op(B) and C are split into 2 x 2 quadrants (sizes rounded up; the
rows and columns past a matrix's edge are zeros on the device) and (Winograd's variant)

    S1 = A21 + A22   S2 = S1 - A11   S3 = A11 - A21   S4 = A12 - S2
    T1 = B12 - B11   T2 = B22 - T1   T3 = B22 - B12   T4 = T2 - B21
    X  = A11 B11                                      (M1)
    C11 = X + A12 B21                                 (M2)
    C21 = S3 T3                                       (M7: seven quadrants have landed)
    Z = S1 T1;  X += S2 T2;  C21 += X                 (M5, M6)
    C22 = C21 + Z;  X += Z;  C21 -= A22 T4            (M4)
    C12 = X + S4 B22                                  (M3, in row strips)

Quadrants land in the order the GEMMs need them (A22 last: only M5 and later read it), so
each C quadrant is copied out as soon as it is final (C11 after the second GEMM) while
the next GEMMs run, and the last one goes out strip by strip (STRIPS, fewer where a strip
would hold under STRIP_MIN elements): only a strip's copy is left after the device's last
GEMM. The first GEMM runs piece by piece over K as its quadrants
land; so do M2 and M7 where the link is slower than the GEMMs for the shape
(strassen_worker.PIECEWISE); the other quadrants are copied whole (wide rows copy faster).

Arithmetic: the host dtype's own (float32 or float64), no tensor-core formats. Numerics:
not those of the classical product: the sums and differences mix the quadrants'
magnitudes, so the error bound is norm-wise (Higham, Accuracy and Stability of Numerical
Algorithms, 23.2.2) and a few times the classical product's on typical data; entries much
smaller than their row's and column's others lose relative accuracy. The GPU tests and
bench/gemm.py record its error beside cuBLASXt's.

Per super-tile of sm x sn over a K block of sk (h = half, rounded up), the device holds
op(A)'s quadrants and S1..S4 (8 hm x hk), op(B)'s and T1..T4 (8 hk x hn), and C's four
quadrants and Z (5 hm x hn: X is C12's; 4 more for the products where K has several
blocks or beta != 0, the quadrants then holding the running sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OutcoreError
from ..units import fmt_bytes
from .tiles import spans

MIN_HALF = 256       # no super-tile or K block is cut to quadrants under this (too small
                     # to gain): the budget is then too small
PIECE = 2048         # K depth of a copy piece of the first quadrants (M1 runs by pieces)
FIRST_PIECE = 512    # K depth of the very first piece (0: PIECE's): the device's wait at
                     # the start (fp32-16384: 6.9 ms of 157 before the first GEMM, when all
                     # of A11 came before B11's first piece, gemm-trace-h200-s28-strassen*)
RAMP = 1.0           # each next piece this much deeper, up to PIECE (1: PIECE right after
                     # the first). 1.5 was meant to land each piece within its
                     # predecessor's GEMM (the device waited 1.7 ms for fp32-16384's second
                     # piece, gemm-trace-h200-s28-strassen4*), but ran no faster:
                     # fp32-16384 154 ms against 153, fp32-32768 1.16 s both, NN 16384 x
                     # 8192 42.5 against 41.7 (tile-ab-h200-s28-ramp.json)
STRIPS = 8           # row strips of the last quadrant (C12): the copy left after the end
STRIP_MIN = 1024 * 4096   # C12 elements a strip holds at least (fewer strips where C12 is
                     # small): its GEMM must fill the device. At 8 strips the TN shapes
                     # with 8192 features ran C12's 512 x 4096 x 16384 strips at 27 TFLOP/s
                     # against 54 for the quadrant's other GEMMs (20 of the product's 98
                     # ms, gemm-trace-h200-s28-tn-strassen-*). At 2048 x 4096 those
                     # products ran 1.11-1.12x faster, NN 16384 x 8192 (4 strips for 8)
                     # 0.99x (tile-ab-h200-s29-strips.json); at 1024 x 4096 (NN keeps 8)
                     # 1.00-1.04x faster than at 2048 x 4096 (-strips2.json)
SLACK_BUFFERS = 40   # views of the arena (alignment), see Arena.slack


def c12_strips(hm: int, hn: int) -> int:
    """Row strips of an hm x hn C12: STRIPS, fewer where a strip would hold under STRIP_MIN
    elements, at least 1."""
    return max(1, min(STRIPS, hm * hn // STRIP_MIN))


def half(x: int) -> int:
    """The quadrant side for x: ceil(x / 2)."""
    return (x + 1) // 2


@dataclass(frozen=True)
class SuperTile:
    """C rows r0..r1, columns c0..c1 (op(A) rows, op(B) columns)."""
    r0: int
    r1: int
    c0: int
    c1: int


@dataclass(frozen=True)
class StrassenPlan:
    m: int
    n: int
    k: int
    itemsize: int
    row_spans: tuple
    col_spans: tuple
    k_spans: tuple
    beta_zero: bool
    compute: str = "strassen"
    tail_tasks: int = 0      # (the tiled plan's fields execute() reads)
    first_task: int = 1

    @property
    def accumulates(self) -> bool:
        """Partial sums are kept apart from the products (several K blocks, or an old C)."""
        return len(self.k_spans) > 1 or not self.beta_zero

    @property
    def hm(self) -> int:
        return max(half(r1 - r0) for r0, r1 in self.row_spans)

    @property
    def hn(self) -> int:
        return max(half(c1 - c0) for c0, c1 in self.col_spans)

    @property
    def hk(self) -> int:
        return max(half(k1 - k0) for k0, k1 in self.k_spans)

    def device_bytes(self) -> int:
        """The buffers of one device: see the module docstring."""
        hm, hn, hk = self.hm, self.hn, self.hk
        quarters_c = 5 + (4 if self.accumulates else 0)
        return self.itemsize * (8 * hm * hk + 8 * hk * hn + quarters_c * hm * hn)

    def tiles(self) -> list[SuperTile]:
        return [SuperTile(r0, r1, c0, c1) for r0, r1 in self.row_spans
                for c0, c1 in self.col_spans]

    def pieces(self, depth: int) -> list[tuple[int, int]]:
        """Copy pieces of op(A)'s and op(B)'s first quadrants (M1 runs piece by piece as
        they land), `depth` deep: FIRST_PIECE, each next one RAMP times the last up to
        PIECE, then about PIECE each."""
        out, at, size = [], 0, FIRST_PIECE or PIECE
        while at < depth and size < PIECE and depth - at > size:
            out.append((at, at + size))
            at, size = at + size, int(size * RAMP) if RAMP > 1 else PIECE
        n = max(1, round((depth - at) / PIECE))
        out += [(a + at, b + at) for a, b in spans(depth - at, -(-(depth - at) // n))]
        return out or [(0, 0)]

    def even_pieces(self, depth: int) -> list[tuple[int, int]]:
        """Copy pieces about PIECE deep (M2's and M7's quadrants where they run by pieces)."""
        n = max(1, round(depth / PIECE))
        return spans(depth, -(-depth // n)) if depth else [(0, 0)]

    def describe(self) -> str:
        return (f"strassen-winograd, one level: {len(self.row_spans)}x{len(self.col_spans)} "
                f"super-tiles of {self.row_spans[0][1]}x{self.col_spans[0][1]}, "
                f"{len(self.k_spans)} K blocks of {self.k_spans[0][1]}, quadrants "
                f"{self.hm}x{self.hk} and {self.hk}x{self.hn}; per device "
                f"{fmt_bytes(self.device_bytes())}; 7 GEMMs of 8 (the rate counts 2mnk)")


def _even_spans(x: int, parts: int) -> tuple:
    """x split into `parts` spans of even length (the last takes the rest)."""
    step = -(-x // parts)
    step += step % 2
    return tuple(spans(x, step))


def make_strassen_plan(m: int, n: int, k: int, itemsize: int, budget: int,
                       n_devices: int = 1, beta_zero: bool = True) -> StrassenPlan:
    """As few super-tiles and K blocks as fit `budget` bytes per device: halve the longest
    side of the super-tile (or K block) until they do; at least one super-tile per device
    (rows split first). Raises OutcoreError when quadrants under MIN_HALF would not fit."""
    gm = gn = gk = 1
    while gm * gn < n_devices and (m > 2 * MIN_HALF * gm or n > 2 * MIN_HALF * gn):
        if m / gm >= n / gn:
            gm *= 2
        else:
            gn *= 2
    while True:
        plan = StrassenPlan(m, n, k, itemsize, _even_spans(m, gm), _even_spans(n, gn),
                            _even_spans(k, gk), beta_zero)
        if plan.device_bytes() + SLACK_BUFFERS * 512 <= budget:
            return plan
        sides = {"m": plan.hm * (gm < m), "n": plan.hn * (gn < n), "k": plan.hk * (gk < k)}
        side = max(sides, key=sides.get)
        if sides[side] < 2 * MIN_HALF:
            need = StrassenPlan(m, n, k, itemsize, *(
                _even_spans(x, max(1, x // (2 * MIN_HALF))) for x in (m, n, k)), beta_zero)
            raise OutcoreError(
                f"compute='strassen' needs at least "
                f"{fmt_bytes(need.device_bytes() + SLACK_BUFFERS * 512)} per device for "
                f"{m}x{n}x{k} but the budget is {fmt_bytes(budget)}: raise gpu_memory or use "
                "compute='fp32' (the tiled product needs far less)")
        if side == "m":
            gm *= 2
        elif side == "n":
            gn *= 2
        else:
            gk *= 2
