"""Several GPUs pulling from one queue: the tiles a lone GPU would take, the order's last
tiles cut into row strips that the queue hands out after every whole tile.

Large tiles run the GEMM kernels fastest (fp32 on the H200, `bench/results/gemm-probe-
h200.json`: 52.2 TFLOP/s in 8192 x 8192 tiles against 50.5 in 4096 x 4096, and slower in
2048 x 2048); devices of unequal speed need a fine-grained end to finish together, not
small tiles throughout. Session 14's two-GPU run at fp32-32768 split the product into 256
tiles of 2048 x 2048 for balance and reached 1.79x one GPU (which ran 8192-wide tiles).

With the strips last, a device that finishes its whole tiles early takes strips while a
slower one ends its tile, so the devices' finish times differ by at most about one strip
(a quarter of a tile) as long as the strips hold more work than one whole tile of the
slowest device.
"""

from __future__ import annotations

from dataclasses import replace

from .plan import MAX_STRIPS, MIN_STRIP
from .planned import GemmPlan

STRIP_TILES = 2      # the order's last tiles cut into strips, per device
MIN_TILES = 4        # whole tiles per device at least; fewer: the older rule (plan.py)


def settings() -> tuple:
    """The settings above: part of the plan cache's key (plan.make_plan)."""
    return STRIP_TILES, MIN_TILES


def shared(lone: GemmPlan, n_devices: int) -> GemmPlan | None:
    """`lone` (a one-GPU plan of the same product) for `n_devices` GPUs sharing the queue:
    no prologue (it would keep one device's every tile live), the last STRIP_TILES per
    device in strips; None when it has fewer than MIN_TILES tiles per device."""
    whole = lone.mt * lone.nt
    if whole < MIN_TILES * n_devices:
        return None
    plan = replace(lone, prologue=0, n_acc=2, strips=1, strip_tiles=1, est_seconds=None)
    cut = min(STRIP_TILES * n_devices, whole // 2)
    rows = min(t.rows for t in plan.tiles()[-cut:])
    strips = max(1, min(MAX_STRIPS, rows // MIN_STRIP["cuda"]))
    return replace(plan, strips=strips, strip_tiles=cut if strips > 1 else 1)
