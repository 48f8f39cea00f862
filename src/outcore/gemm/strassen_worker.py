"""One device's side of compute="strassen" (strassen.py): per super-tile and K block, load
the quadrants of op(A) and op(B), run Winograd's seven GEMMs, copy C's quadrants out as
each is final.

Streams as in worker.py: h2d copies quadrants in pieces (events per piece), compute waits
for what each step reads, d2h copies finished quadrants out. Each operand buffer records
the compute event after its last reader in a block, and the next block's copy into it
waits for just that event, so the next block's first quadrants land while this block's
last GEMMs run. The host thread only enqueues; it blocks only for flow control (two
super-tiles in flight).
"""

from __future__ import annotations

from collections import deque

import torch

from ..transfer import host_wait
from .arena import Arena
from .copies import Copier
from .mmacc import mm_acc
from .model import Rates
from . import strassen
from .strassen import SLACK_BUFFERS, SuperTile, half
from .strassen_parts import Finisher, Quad
from .tiles import spans
from .worker import DeviceRun, _device_streams

# Whether the sums S1..S4 and T1..T4 run on a side stream (the conversion stream), beside
# the GEMMs, as soon as their quadrants land (False: on the compute stream, in turn).
# On the compute stream they took 2.3 ms of fp32-16384's 148 (gemm-trace-h200-s28-
# strassen*); beside them 0.6-1.3 ms faster there (tile-ab-h200-s28-strassen*.json).
SIDE_ADDS = True

# Whether M2 and M7 also run piece by piece as their quadrants land (S3 and T3 summed per
# piece), as M1 does: 1 always, 0 never (whole quadrants), -1 where the planner's rates
# (model.Rates) say M2's quadrants would land after M1's GEMM ends (_link_bound).
# Alternating in one process (tile-ab-h200-s28-piecewise.json), by pieces against whole:
# the TN shapes with 8192 features 1.05-1.06x faster, NN and NT 16384 x 8192 x 8192
# 1.01-1.02x (all three by the rule), fp32-16384 0.6 ms slower of 153 (not by the rule).
PIECEWISE = -1


_PIECED = ("a12", "b21", "a21", "b12", "b22")   # copied in pieces where PIECEWISE


def _link_bound(hm: int, hn: int, itemsize: int, h2d: float, flops: float) -> bool:
    """Whether M2's quadrants land after M1's GEMM ends, by the planner's rates: M1's and
    M2's quadrant pairs (hm x hk and hk x hn each) take the link longer than one GEMM takes
    the device (everything per unit of depth hk)."""
    return 2 * (hm + hn) * itemsize / h2d > 2.0 * hm * hn / flops


class StrassenWorker(DeviceRun):
    """Runs super-tiles of `job` (its plan a StrassenPlan) on `device`."""

    def _loop(self, pull, first: int) -> None:
        inflight: deque = deque()
        while True:
            if len(inflight) >= 2:
                # Host sync (flow control): two super-tiles queued at most, so a faster
                # device finds the later ones unclaimed.
                host_wait(inflight.popleft())
            tiles = pull(1)
            if not tiles:
                return
            inflight.append(self._tile(tiles[0]))

    def _release(self) -> None:
        """Drop the buffers and the arena (as DeviceWorker._release)."""
        self.stats.device_bytes = self.arena.used
        self.quads = self.accs = self.work = None
        self.arena.release()

    def _setup(self) -> None:
        p, dev, dt = self.plan, self.device, self.job.c.dtype
        self.lanes = self._make_lanes()
        # Buffer reuse: every buffer is a view of one allocation sized by the plan.
        self.arena = Arena(dev, p.device_bytes() + Arena.slack(SLACK_BUFFERS))
        ta, tb = self.job.ta, self.job.tb
        ak, bk = p.hm * p.hk, p.hk * p.hn
        # op(A)'s quadrants keep the host's layout; S1..S4 too, so the adds run on
        # storage-order buffers alike
        self.quads = {q: Quad(self.arena.take(ak, dt), ta)
                      for q in ("a11", "a12", "a21", "a22", "s1", "s2", "s3", "s4")}
        self.quads.update({q: Quad(self.arena.take(bk, dt), tb)
                           for q in ("b11", "b12", "b21", "b22", "t1", "t2", "t3", "t4")})
        cq = p.hm * p.hn
        self.accs = {q: self.arena.take(cq, dt) for q in ("11", "12", "21", "22")}
        self.acc_free = dict.fromkeys(self.accs)     # d2h event: last copy out of it
        self.work = {q: self.arena.take(cq, dt) for q in (
            ("z", "11", "12", "21", "22") if p.accumulates else ("z",))}
        self.copier = Copier(self.lanes, self.stats, 0)
        self.side = _device_streams(dev)[2] if SIDE_ADDS and dev.type == "cuda" else None
        self.st_free = None          # compute event: the last block's last reader of S, T
        rates = Rates()
        self.rates = (rates.h2d, rates.flops["fp64" if dt == torch.float64 else "fp32"])

    # -- one super-tile ------------------------------------------------------------------
    def _tile(self, t: SuperTile):
        p, L = self.plan, self.lanes
        hm, hn = half(t.r1 - t.r0), half(t.c1 - t.c0)
        rows = {"1": (t.r0, t.r0 + hm), "2": (t.r0 + hm, t.r1)}
        cols = {"1": (t.c0, t.c0 + hn), "2": (t.c0 + hn, t.c1)}
        acc = {q: f[:hm * hn].view(hm, hn) for q, f in self.accs.items()}
        for q in acc:
            # Buffer reuse: the last tile's copy out of this quadrant is done.
            L.wait(L.compute, self.acc_free[q])
        if not p.beta_zero:
            self._load_c(acc, rows, cols)
        self.regions = {q: rows[q[0]] + cols[q[1]] for q in acc}
        done = None
        for b, kspan in enumerate(p.k_spans):
            last = b == len(p.k_spans) - 1
            done = self._block(t, rows, cols, kspan, acc, first=b == 0, last=last)
        self.stats.tiles += 1
        self.progress(1)
        return done

    def _load_c(self, acc: dict, rows: dict, cols: dict) -> None:
        """The old C's quadrants into the accumulators (scaled by beta in Finisher.quadrant)."""
        L = self.lanes
        for q, a in acc.items():
            (r0, r1), (c0, c1) = rows[q[0]], cols[q[1]]
            L.wait(L.h2d, self.acc_free[q])     # buffer reuse, as in _tile, for the copy in
            if r1 > r0 and c1 > c0:
                self.copier.h2d(a[:r1 - r0, :c1 - c0], self.job.c, (r0, r1, c0, c1))
        L.wait(L.compute, L.event(L.h2d))       # stream wait: the old C has landed

    def _load(self, name: str, host, rspan, cspan, k_rows: bool, shape) -> list:
        """Quadrant `name` <- op(host)[rspan, cspan] (K along op's columns for A, its rows
        for B: k_rows), in plan.pieces along K for the first quadrants, else whole; a
        shape larger than the region is padded with zeros. Returns the copies, one per
        piece, each a function that enqueues it (the caller interleaves A's and B's)."""
        L, q = self.lanes, self.quads[name]
        op = q.shape(*shape)
        nr, nc = rspan[1] - rspan[0], cspan[1] - cspan[0]
        q.events = []
        depth = shape[0] if k_rows else shape[1]
        q.spans = (self.plan.pieces(depth) if name[1:] == "11" else
                   self.plan.even_pieces(depth) if self.piecewise and name in _PIECED else
                   [(0, depth)])

        def piece(p0: int, p1: int) -> None:
            if not q.events:
                # Buffer reuse: the last block's last reader of this buffer is done (waited
                # for here, at the first copy, not before the copies enqueued ahead of it)
                L.wait(L.h2d, q.free)
                if nr < shape[0] or nc < shape[1]:
                    with L.on(L.h2d):
                        op[nr:, :].zero_()
                        op[:, nc:].zero_()
            lo, hi = p0, min(p1, nr if k_rows else nc)
            if hi > lo:
                if k_rows:
                    region, dst = (rspan[0] + lo, rspan[0] + hi) + cspan, op[lo:hi, :nc]
                else:
                    region, dst = rspan + (cspan[0] + lo, cspan[0] + hi), op[:nr, lo:hi]
                if q.trans:
                    region, dst = region[2:] + region[:2], dst.t()
                self.copier.h2d(dst, host, region)
            q.events.append(L.event(L.h2d))
        return [lambda a=a, b=b: piece(a, b) for a, b in q.spans]

    def _mm(self, acc, a, b, alpha: float = 1.0, beta: float = 0.0) -> None:
        self.stats.lt_gemms += mm_acc(acc, a, b, alpha, beta)
        self.stats.gemms += 1
        self.stats.flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]

    def _mm_piece(self, acc, qa: Quad, qb: Quad, i: int) -> None:
        """acc (=, for i == 0, else +=) qa @ qb over copy piece i, once it has landed."""
        L, (p0, p1) = self.lanes, qa.spans[i]
        L.wait(L.compute, qa.events[i])        # stream wait: this piece of each has landed
        L.wait(L.compute, qb.events[i])
        self._mm(acc, qa.op[:, p0:p1], qb.op[p0:p1, :], 1.0, 0.0 if i == 0 else 1.0)

    def _ready(self, *names: str) -> None:
        for n in names:
            # stream wait: the quadrant's last piece has landed (earlier ones before it)
            self.lanes.wait(self.lanes.compute, self.quads[n].events[-1])

    def _freed(self, *names: str) -> None:
        ev = self.lanes.event()
        for n in names:
            self.quads[n].free = ev

    def _part(self, name: str, span) -> torch.Tensor:
        """Buffer `name` (op order), or its K range `span` (op's columns for A and S, its
        rows for B and T)."""
        op = self.quads[name].op
        if span is None:
            return op
        return op[:, span[0]:span[1]] if name[0] in "as" else op[span[0]:span[1], :]

    def _sums(self, needs, *jobs, span=None) -> None:
        """S and T buffers (or their K range `span`): (out, x, y, sign) -> out = x + sign * y,
        once the copies `needs` ((quadrant, piece index) pairs) have landed; on the side
        stream where SIDE_ADDS is on."""
        Q, L = self.quads, self.lanes
        on = self.side or L.compute
        for n, i in needs:
            L.wait(on, Q[n].events[i])    # stream wait: that copy has landed
        if self.side is not None:
            # Buffer reuse: the last block's GEMMs that read S and T are done.
            L.wait(on, self.st_free)
        with L.on(self.side):
            for out, x, y, sign in jobs:
                (torch.add if sign > 0 else torch.sub)(
                    self._part(x, span), self._part(y, span), out=self._part(out, span))
        if self.side is not None:
            # stream wait: the GEMMs read the sums (and the quadrants' `_freed` events,
            # recorded on compute after this, cover the side stream's reads)
            L.wait(L.compute, L.event(self.side))

    def _block(self, t: SuperTile, rows, cols, kspan, acc: dict, first: bool, last: bool):
        """This K block's Winograd step (strassen.py's docstring) into acc (or into the work
        buffers, added into acc quadrant by quadrant where the plan accumulates)."""
        p, job, Q = self.plan, self.job, self.quads
        hm, hn = half(t.r1 - t.r0), half(t.c1 - t.c0)
        k0, k1 = kspan
        hk = half(k1 - k0)
        ks = {"1": (k0, k0 + hk), "2": (k0 + hk, k1)}
        self.piecewise = bool(PIECEWISE) if PIECEWISE >= 0 else _link_bound(
            hm, hn, job.c.itemsize, *self.rates)
        def load(n: str) -> list:
            if n[0] == "a":
                return self._load(n, job.a, rows[n[1]], ks[n[2]], False, (hm, hk))
            return self._load(n, job.b, ks[n[1]], cols[n[2]], True, (hk, hn))
        out = acc if not p.accumulates else {
            q: f[:hm * hn].view(hm, hn) for q, f in self.work.items() if q != "z"}
        x, z = out["12"], self.work["z"][:hm * hn].view(hm, hn)
        # X = M1, a GEMM per piece as the pieces land: each enqueued right after its
        # piece's copies (A's and B's alternating), before the later copies, so the host
        # reaches the first GEMM early (fp32-16384's began 3.5 ms after the first copy,
        # 2.4 ms after its pieces had landed, when every copy of the block was enqueued
        # before it: gemm-trace-h200-s28-strassen3*)
        for i, pair in enumerate(zip(load("a11"), load("b11"))):
            for piece in pair:
                piece()
            self._mm_piece(x, Q["a11"], Q["b11"], i)
        for n in ("s1", "s2", "s3", "s4"):
            Q[n].shape(hm, hk)
        for n in ("t1", "t2", "t3", "t4"):
            Q[n].shape(hk, hn)
        fin = Finisher(self, acc, out, first, last)
        # the others in the order of need: M2, M7 (S3, T3), then A22 for M5 and M6; where
        # PIECEWISE, M2's and M7's GEMMs (and S3's and T3's sums) between their copies
        m2 = list(zip(load("a12"), load("b21")))
        for i, pair in enumerate(m2 if self.piecewise else ()):
            for piece in pair:
                piece()
            self._mm_piece(out["11"], Q["a12"], Q["b21"], i)
        m7 = list(zip(load("a21"), load("b12"), load("b22")))
        s3_t3 = (("s3", "a11", "a21", -1), ("t3", "b22", "b12", -1))
        for i, trio in enumerate(m7 if self.piecewise else ()):
            for piece in trio:
                piece()
            span = Q["a21"].spans[i]
            self._sums((("a11", -1), ("a21", i), ("b12", i), ("b22", i)),
                       *s3_t3, span=span)
            self._mm(out["21"], self._part("s3", span), self._part("t3", span), 1.0,
                     0.0 if i == 0 else 1.0)
        for pieces in ([] if self.piecewise else m2 + m7) + [load("a22")]:
            for piece in pieces:
                piece()
        op = {n: Q[n].op for n in Q}
        if not self.piecewise:
            self._ready("a12", "b21")
            self._mm(out["11"], op["a12"], op["b21"])                    # M2
        out["11"].add_(x)                                                # C11 = M1 + M2
        fin.quadrant("11")
        self._sums(tuple((n, -1) for n in ("a11", "a21", "b11", "b12", "b22", "b21")),
                   *(() if self.piecewise else s3_t3),
                   ("t1", "b12", "b11", -1), ("t2", "b22", "t1", -1), ("t4", "t2", "b21", -1))
        self._freed("b11", "b12", "b21")
        if not self.piecewise:
            self._mm(out["21"], op["s3"], op["t3"])                      # C21 = M7
        self._sums((("a22", -1),),
                   ("s1", "a21", "a22", 1), ("s2", "s1", "a11", -1), ("s4", "a12", "s2", -1))
        self._freed("a11", "a21", "a12")
        self._mm(z, op["s1"], op["t1"])                                  # Z = M5
        self._mm(x, op["s2"], op["t2"], 1.0, 1.0)                        # X = M1 + M6
        out["21"].add_(x)                                                # U3 = X + M7
        torch.add(out["21"], z, out=out["22"])                           # C22 = U3 + M5
        fin.quadrant("22")
        x.add_(z)                                                        # X += M5
        self._mm(out["21"], op["a22"], op["t4"], -1.0, 1.0)              # C21 = U3 - M4
        self._freed("a22")
        fin.quadrant("21")
        strips = strassen.c12_strips(hm, hn)
        for r0, r1 in spans(hm, -(-hm // strips)):                       # C12 = X + M3
            self._mm(x[r0:r1], op["s4"][r0:r1], op["b22"], 1.0, 1.0)
            fin.quadrant("12", (r0, r1))
        self._freed("b22")
        self.st_free = self.lanes.event()
        return fin.done
