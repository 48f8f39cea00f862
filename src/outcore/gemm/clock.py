"""When a GEMM over fresh pieces should start: one rule for the worker and the model.

A tile whose panels are still loading gets its pieces one by one. A GEMM per piece starts
compute early but runs smaller kernels (fp32 on the H200: 48.9 TFLOP/s at 4096 x 4096 x
2048 against 51.3 at 16384 deep); one GEMM over the whole panel waits for its last piece.
`model.merged_end` takes the middle way: a GEMM takes every next piece that lands before it
could start anyway (compute still busy with the GEMMs before it), so where the link runs
ahead of compute (fp32) fresh pieces merge into large GEMMs (the fp32-16384 product ran 32
GEMM kernels instead of 65), and where compute waits for the link (bf16) each piece still
gets its own GEMM as soon as it lands.

`DeviceClock` is the worker's estimate of when its streams get there, from `Rates`: a wrong
estimate costs speed (a GEMM waits for a piece that is late, or starts on fewer pieces than
it could have), never correctness (every GEMM waits for its pieces' events).
"""

from __future__ import annotations

import time

from .model import Rates, kernel_rate, row_factor


class DeviceClock:
    """Estimated seconds (since the product started) at which one device's h2d stream and
    compute stream finish what the host has enqueued on them.

    The host enqueues ahead of the device; a stream the host left idle starts its next
    work no earlier than the host's clock, so an idle spell does not skew the estimate.
    """

    def __init__(self, compute: str, rates: Rates | None = None):
        self.rates, self.compute = rates or Rates(), compute
        self.t0 = time.perf_counter()
        self.link = self.comp = 0.0

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def load(self, nbytes: int, row_bytes: int, contiguous: bool) -> float:
        """A copy of `nbytes` in rows of `row_bytes` enqueued: when it will have landed."""
        rate = self.rates.h2d * row_factor(row_bytes, contiguous)
        self.link = max(self.link, self._now()) + nbytes / rate
        return self.link

    def gemm(self, rows: int, cols: int, k: int, ready: float) -> float:
        """A rows x cols x k GEMM enqueued, its operands landed at `ready`: when it ends."""
        rate = kernel_rate(self.rates, self.compute, rows, cols, k)
        self.comp = max(self.comp, ready, self._now()) + 2.0 * rows * cols * k / rate
        return self.comp
