"""The device buffers and the quadrant finisher of strassen_worker.py's StrassenWorker."""

from __future__ import annotations

import torch


class Quad:
    """One operand buffer (a quadrant of op(A) or op(B), or an S or T) on the device.

    flat: its arena memory; op: this block's quadrant, op order (R x C), a transposed view
    of the storage-order buffer where the host matrix is stored transposed; events: one
    h2d event per copy piece (spans: their K ranges); free: compute event after its last
    reader (buffer reuse)."""

    def __init__(self, flat: torch.Tensor, trans: bool):
        self.flat, self.trans = flat, trans
        self.op: torch.Tensor | None = None
        self.events: list = []
        self.spans: list = []
        self.free = None

    def shape(self, rows: int, cols: int) -> torch.Tensor:
        """Lay the buffer out as rows x cols (op order) for this block."""
        n = rows * cols
        self.op = (self.flat[:n].view(cols, rows).t() if self.trans
                   else self.flat[:n].view(rows, cols))
        return self.op

    @property
    def storage(self) -> torch.Tensor:
        return self.op.t() if self.trans else self.op


class Finisher:
    """A quadrant (or a strip of it) is final for this block: scale it into the running sum
    where the plan accumulates, and copy it out after the last block."""

    def __init__(self, w, acc: dict, out: dict, first: bool, last: bool):
        # w: the StrassenWorker whose quadrant this finishes (its plan, job, lanes, copier)
        self.w, self.acc, self.out, self.first, self.last = w, acc, out, first, last
        self.done = None

    def quadrant(self, q: str, strip: tuple | None = None) -> None:
        w, job = self.w, self.w.job
        r0, r1 = strip or (0, self.acc[q].shape[0])
        a, o = self.acc[q][r0:r1], self.out[q][r0:r1]
        if w.plan.accumulates:
            if not self.first:
                a.add_(o, alpha=job.alpha)
            elif w.plan.beta_zero:
                torch.mul(o, job.alpha, out=a)
            else:
                a.mul_(job.beta).add_(o, alpha=job.alpha)
        elif job.alpha != 1.0:
            a.mul_(job.alpha)
        if not self.last:
            return
        R0, R1, C0, C1 = w.regions[q]
        rows = min(r1, R1 - R0) - r0
        if rows <= 0 or C1 <= C0:
            return
        L = w.lanes
        self.done = L.event(L.compute)
        region = (R0 + r0, R0 + r0 + rows, C0, C1)
        w.acc_free[q] = w.copier.d2h(job.c, region, a[:rows, :C1 - C0], self.done)
