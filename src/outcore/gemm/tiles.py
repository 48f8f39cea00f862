"""C tiles and the orders devices take them in.

    C: M x N is cut into tiles of tile_m x tile_n (edge tiles smaller), tile (i, j) covers
    rows [i*tile_m, ...) and columns [j*tile_n, ...). op(A): M x K is cut into row panels
    A_i (tile_m x K), op(B): K x N into column panels B_j (K x tile_n); tile (i, j) needs
    exactly A_i and B_j. Along K a panel is cut into blocks of tile_k (the cache unit) and a
    block into pieces of piece_k (the copy unit: one event each).

The last tile of a lone device's order may be cut into row strips (`row_strips`): each
strip's C goes back to the host as soon as it is done, so the copy-out that no compute
hides at the end of a product is one strip's, not one tile's.

The order of C tiles decides how often a panel crosses PCIe:
- `growing_order`: when a device's cache holds every panel, tiles with max(i, j) = s come
  at step s, so each step needs only A_s and B_s and the work available grows with the
  square of what has been loaded (compute starts after two panels, not after all of A).
- `band_order`: when the cache holds only some panels, keep a band of `band` row panels
  of A resident and stream the B panels past it (or the transpose, whichever moves fewer
  bytes); consecutive tiles share a panel at every turn (snake order).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tile:
    """One C tile: rows [r0, r1) x columns [c0, c1); (i, j) its panel indices."""
    i: int
    j: int
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def rows(self) -> int:
        return self.r1 - self.r0

    @property
    def cols(self) -> int:
        return self.c1 - self.c0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def spans(total: int, size: int) -> list[tuple[int, int]]:
    """[0, total) cut into [start, end) pieces of `size` (the last one shorter)."""
    return [(s, min(s + size, total)) for s in range(0, total, size)]


def piece_spans(total: int, size: int, first: int = 0) -> list[tuple[int, int]]:
    """spans(total, size), the first piece cut in two at `first` when 0 < first < its
    length: a block's first GEMM can start after `first` rows of K instead of `size`
    (the later pieces keep their boundaries)."""
    out = spans(total, size)
    if out and 0 < first < out[0][1]:
        out[:1] = [(0, first), (first, out[0][1])]
    return out


def growing_order(mt: int, nt: int) -> list[tuple[int, int]]:
    """All (i, j) of an mt x nt grid, step s = max(i, j) at a time, snaking at each turn.

    Even steps: row s left to right, then column s bottom-up (ends at (0, s)); odd steps:
    column s top-down, then row s right to left (ends at (s, 0)). Each step starts next to
    where the previous one ended, so consecutive tiles share a panel.
    """
    out: list[tuple[int, int]] = []
    for s in range(max(mt, nt)):
        row = [(s, j) for j in range(min(s, nt))] if s < mt else []
        col = [(i, s) for i in range(min(s + 1, mt))] if s < nt else []
        if s % 2 == 0:
            out += row + col[::-1]
        else:
            out += col + row[::-1]
    return out


def band_order(mt: int, nt: int, band: int, resident: str = "A") -> list[tuple[int, int]]:
    """Bands of `band` row panels (resident="A") or column panels (resident="B").

    resident="A": for each band of rows, sweep the columns (direction alternating per band)
    and within a column the band's rows (direction alternating per column): each B panel
    is used `band` times in a row and the band's A panels for the whole sweep.
    """
    if resident == "B":
        return [(i, j) for (j, i) in band_order(nt, mt, band, "A")]
    band = max(1, band)
    out: list[tuple[int, int]] = []
    for b, r0 in enumerate(range(0, mt, band)):
        rows = list(range(r0, min(r0 + band, mt)))
        cols = range(nt) if b % 2 == 0 else range(nt - 1, -1, -1)
        for c, j in enumerate(cols):
            out += [(i, j) for i in (rows if c % 2 == 0 else rows[::-1])]
    return out


def make_tiles(order: list[tuple[int, int]], m: int, n: int, tile_m: int,
               tile_n: int) -> list[Tile]:
    """(i, j) pairs -> Tiles with their row and column bounds."""
    return [Tile(i, j, i * tile_m, min((i + 1) * tile_m, m), j * tile_n,
                 min((j + 1) * tile_n, n)) for (i, j) in order]


def row_strips(t: Tile, parts: int) -> list[Tile]:
    """t cut into `parts` strips of rows (the same panels i and j); [t] when parts <= 1."""
    parts = max(1, min(parts, t.rows))
    edges = [t.r0 + (t.rows * q) // parts for q in range(parts + 1)]
    return [Tile(t.i, t.j, r0, r1, t.c0, t.c1) for r0, r1 in zip(edges, edges[1:])]
