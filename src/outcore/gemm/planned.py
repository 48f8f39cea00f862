"""GemmPlan: one out-of-core product's tiles, buffers and schedule, and the device bytes
they take (plan.py chooses them).

What one device holds (all of it counted against the plan's `budget`):
  accumulators  n_acc x tile_m x tile_n in the accumulation dtype (fp32, fp64 for fp64)
  C landing     2 x tile_m x tile_n in the host dtype, when it differs from the accumulator's
  copy landing  2 pieces in the host dtype, when the compute dtype differs (tiles are
                converted on the device, so the host is never asked to convert)
  cache         n_slots blocks of max(tile_m, tile_n) x tile_k in the compute dtype; where
                every block is cached (`caches_all`), each block's own size instead: all
                of op(A) and op(B), (M x K + K x N) elements, however the tiles are shaped;
                twice that for a split compute (tf32x3: each block as hi + lo, split.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import OutcoreError
from ..units import fmt_bytes
from .computes import COMPUTE, SPLIT_COMPUTES, cached_itemsize
from .tiles import band_order, cdiv, growing_order, make_tiles, piece_spans, row_strips


def _size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def operand_bytes(m: int, n: int, k: int, compute: str) -> int:
    """Bytes of all of op(A) (M x K) and op(B) (K x N) in the compute dtype: what the cache
    holds when it holds every block, whatever the tiles' shape."""
    return (m + n) * k * cached_itemsize(compute)


def _fixed_bytes(tm, tn, pk, n_acc, host_dtype, compute) -> int:
    cdt, adt = COMPUTE[compute]
    b = n_acc * tm * tn * _size(adt)
    if host_dtype != adt:
        b += 2 * tm * tn * _size(host_dtype)
    if host_dtype != cdt:
        b += 2 * max(tm, tn) * pk * _size(host_dtype)
    return b



@dataclass(frozen=True)
class GemmPlan:
    """Tile sizes, buffers and schedule of one product; see the module docstring."""
    m: int
    n: int
    k: int
    tile_m: int
    tile_n: int
    tile_k: int
    piece_k: int
    compute: str
    host_dtype: torch.dtype
    n_slots: int
    n_acc: int
    order: str = "grow"          # "grow", "rows" (A band resident) or "cols"
    band: int = 1
    prologue: int = 0            # pieces of K streamed over all tiles before tile-major
    strips: int = 1              # row strips of each of the order's last strip_tiles tiles
    strip_tiles: int = 1         # 1 for a lone device; several devices: shared.py
    first_piece: int = 0         # > 0: a block's first piece is this deep (FIRST_PIECE)
    a_rows: bool = False         # A's blocks copied whole, in chunks of rows (lone.py)
    b_rows: bool = False         # so are a transposed B's (stored N x K)
    budget: int = 0
    est_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.prologue < 0:
            raise OutcoreError(f"prologue={self.prologue} is negative: give 0 (no prologue) or "
                               "a number of K pieces")
        if self.prologue and self.n_acc < self.n_tiles:
            # every tile is live during the prologue: shared accumulators give wrong sums
            raise OutcoreError(f"prologue={self.prologue} keeps all {self.n_tiles} C tiles "
                               f"live but the plan has {self.n_acc} accumulators: set "
                               "n_acc >= n_tiles, or prologue=0")

    @property
    def compute_dtype(self) -> torch.dtype:
        return COMPUTE[self.compute][0]

    @property
    def acc_dtype(self) -> torch.dtype:
        return COMPUTE[self.compute][1]

    @property
    def mt(self) -> int:
        return cdiv(self.m, self.tile_m)

    @property
    def nt(self) -> int:
        return cdiv(self.n, self.tile_n)

    @property
    def nk(self) -> int:
        return cdiv(self.k, self.tile_k)

    @property
    def n_tiles(self) -> int:
        """Tiles in the order, the strips counted one by one."""
        return self.mt * self.nt + self.tail_tasks - (self.strip_tiles if self.strips > 1
                                                      else 0)

    @property
    def tail_tasks(self) -> int:
        """The strips at the order's end (0 without strips): a shared queue hands them out
        after every whole tile, so the devices' last tasks are short."""
        return self.strip_tiles * self.strips if self.strips > 1 else 0

    @property
    def first_task(self) -> int:
        """Tiles a device takes in its first pull: all of them when there is a prologue."""
        return self.n_tiles if self.prologue else 1

    def pieces(self, k_len: int) -> list[tuple[int, int]]:
        """The copy pieces of a K block k_len deep, as (start, end) within the block."""
        return piece_spans(k_len, self.piece_k, self.first_piece)

    @property
    def caches_all(self) -> bool:
        """Every block of A and B has a slot of its own (nothing is evicted): the cache
        sizes each slot by its block (BlockCache(exact=True))."""
        return self.n_slots >= self.nk * (self.mt + self.nt)

    @property
    def slot_numel(self) -> int:
        return max(self.tile_m, self.tile_n) * self.tile_k

    @property
    def piece_numel(self) -> int:
        return max(self.tile_m, self.tile_n) * self.piece_k

    def row_chunk(self, k_len: int) -> int:
        """Rows per copy where blocks go by rows (`a_rows`, `b_rows`): a copy piece's
        size, so that the landing buffers (2 pieces) hold a chunk."""
        return max(1, self.piece_numel // max(1, k_len))

    @property
    def splits(self) -> bool:
        """Blocks are split into hi + lo parts as they land (split.py)."""
        return self.compute in SPLIT_COMPUTES

    @property
    def needs_landing(self) -> bool:
        return self.host_dtype != self.compute_dtype

    @property
    def needs_cbuf(self) -> bool:
        return self.host_dtype != self.acc_dtype

    def device_bytes(self) -> int:
        cached = (operand_bytes(self.m, self.n, self.k, self.compute) if self.caches_all
                  else self.n_slots * self.slot_numel * cached_itemsize(self.compute))
        return _fixed_bytes(self.tile_m, self.tile_n, self.piece_k, self.n_acc, self.host_dtype,
                            self.compute) + cached

    def tiles(self):
        """The C tiles in the order devices take them."""
        if self.order == "grow":
            order = growing_order(self.mt, self.nt)
        else:
            order = band_order(self.mt, self.nt, self.band, "A" if self.order == "rows" else "B")
        tiles = make_tiles(order, self.m, self.n, self.tile_m, self.tile_n)
        if self.strips <= 1:
            return tiles
        cut = len(tiles) - self.strip_tiles
        return tiles[:cut] + [s for t in tiles[cut:] for s in row_strips(t, self.strips)]

    def describe(self) -> str:
        est = f", model {self.est_seconds * 1e3:.0f} ms" if self.est_seconds else ""
        pro = f", first {self.prologue} pieces of K over all tiles" if self.prologue else ""
        if self.strips > 1:
            pro += (f", last tile in {self.strips} strips" if self.strip_tiles == 1 else
                    f", last {self.strip_tiles} tiles in {self.strips} strips each")
        pro += f", first piece {self.first_piece} deep" if self.first_piece else ""
        pro += ", A's panels whole, by rows" if self.a_rows else ""
        pro += ", B's panels whole, by rows" if self.b_rows else ""
        return (f"tiles {self.tile_m}x{self.tile_n}x{self.tile_k} (piece {self.piece_k}), "
                f"{self.mt}x{self.nt} C tiles, {self.nk} K blocks, order {self.order}"
                f"{'' if self.order == 'grow' else f' band {self.band}'}{pro}; per device "
                f"{fmt_bytes(self.device_bytes())} of {fmt_bytes(self.budget)} "
                f"({self.n_slots} cache blocks){est}")
