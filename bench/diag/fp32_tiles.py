"""Which tile shape runs fp32-16384 fastest? Forced tiles against the planner's, one GPU.

    PYTHONPATH=src python3 bench/diag/fp32_tiles.py        # about 40 s on one H200

fp32 at 16384 is compute-bound (in-core 53-54 TFLOP/s, 163-166 ms) and outcore's plan
(4096 x 4096 tiles) runs 176-178 ms: its GEMMs are 4096^2 x 16384 kernels, 51.1-51.4
TFLOP/s in the probes, where 16384 x 4096 x 16384 ran 52.2 and 8192^2 x 16384 52.1-52.4
(gemm-probe-h200-s11a.json, -s14a.json). The planner's model fits kernel rates
symmetrically in rows and columns, so it never weighs whole-height column strips of C
(16384 x 4096) for a product stored N x N. This times the product (outcore.matmul, pinned
host matrices, median of 3 after a warm-up) in the planner's tiles and in forced
ones: whole-height strips, and 8192^2 tiles, each also with a shallow first piece
(plan.FIRST_PIECE); ROUNDS rounds, the order rotated; two rows of each product checked
against float64. Writes bench/results/fp32-tiles-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from fp32_wide import ab_rounds, time_product, write_ab  # noqa: E402
from gemm import fill_, square_cases  # noqa: E402

import outcore.gemm.plan as plan_mod  # noqa: E402
from outcore.gemm import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

# name -> (tile for matmul(tile=) or None for the planner's, plan.FIRST_PIECE)
VARIANTS = {"planner": (None, 0),
            "tall-4096": ((16384, 4096, 16384, 2048), 0),
            "tall-4096-first512": ((16384, 4096, 16384, 2048), 512),
            "8192": ((8192, 8192, 16384, 2048), 0),
            "8192-first1024": ((8192, 8192, 16384, 2048), 1024),
            # session 20: whole-width row strips, whose GEMMs (S x 16384 x 16384) ran 51.8
            # (S = 2048) and 53.2 (8192) TFLOP/s in core against 51.3 for 4096^2 tiles
            # (fp32-shapes-h200.json); B's pieces are contiguous row blocks
            "wide-1024": ((1024, 16384, 16384, 2048), 0),
            "wide-2048": ((2048, 16384, 16384, 2048), 0),
            "wide-2048-first512": ((2048, 16384, 16384, 2048), 512),
            "wide-8192": ((8192, 16384, 16384, 2048), 0),
            "wide-8192-first512": ((8192, 16384, 16384, 2048), 512),
            # session 21 (fp32 GEMMs through outcore.gemm.ltmm): whole-width 4096-row strips,
            # and the planner's tiles with a shallow first piece or 8 strips at the end
            "wide-4096": ((4096, 16384, 16384, 2048), 0),
            "planner-first1024": (None, 1024),
            # session 22: the first tile's A pieces are 2-D copies of 8 KiB rows (34 GB/s
            # alone, copy-rows-h200.json; 16 KiB: 48, 32 KiB: 55), so the first 4096^2 tile
            # waits on the link: 4096-deep pieces, and pieces that grow from a shallow
            # first one (a negative first piece: ramp_spans below, 512, 1024, 2048, ... up
            # to the piece), so the first GEMM starts early and each piece lands under the
            # GEMM before it
            "planner-piece4096": ((4096, 4096, 16384, 4096), 0),
            "planner-ramp512": ((4096, 4096, 16384, 2048), -512),
            "planner-piece4096-ramp512": ((4096, 4096, 16384, 4096), -512),
            "8192-ramp512": ((8192, 8192, 16384, 2048), -512),
            "8192-piece4096-ramp512": ((8192, 8192, 16384, 4096), -512),
            "wide-4096-ramp512": ((4096, 16384, 16384, 2048), -512)}
# FP32_TILES=name,name,... runs only those (and the planner's)
if os.environ.get("FP32_TILES"):
    VARIANTS = {k: v for k, v in VARIANTS.items()
                if k == "planner" or k in os.environ["FP32_TILES"].split(",")}
ROUNDS = 4


def ramp_spans(total: int, size: int, first: int = 0) -> list[tuple[int, int]]:
    """[0, total) in pieces first, 2 first, 4 first, ... while under `size`, then `size`
    (a diag-only stand-in for tiles.piece_spans, patched into plan.py by RAMP variants)."""
    out, s, d = [], 0, first or size
    while s < total:
        out.append((s, min(s + d, total)))
        s, d = s + d, min(2 * d, size)
    return out


SPANS = plan_mod.piece_spans


def time_variant(c, A, B, C, name: str) -> tuple[float, str]:
    tile, first = VARIANTS[name]
    # a negative first piece: pieces that grow from -first (ramp_spans)
    plan_mod.FIRST_PIECE = abs(first)
    plan_mod.piece_spans = ramp_spans if first < 0 else SPANS
    return time_product(lambda: matmul(A, B, C, compute="fp32", tile=tile,
                                       return_stats=True)[1])


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/fp32_tiles.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("fp32-tiles")
    doc["env"] = {"FP32_TILES": os.environ.get("FP32_TILES")}   # not in the command
    c = next(x for x in square_cases(False) if x.name == "fp32-16384")
    A, B, C = (pin_(torch.empty(c.m, c.k)), pin_(torch.empty(c.k, c.n)),
               pin_(torch.empty(c.m, c.n)))
    fill_(A.view(-1))
    fill_(B.view(-1))
    try:
        rows = ab_rounds(c, A, B, C, list(VARIANTS), time_variant, ROUNDS, "planner")
    finally:
        plan_mod.FIRST_PIECE = 0
        plan_mod.piece_spans = SPANS
    write_ab(doc, rows, "fp32-tiles", "planner")
    return 0


if __name__ == "__main__":
    sys.exit(main())
