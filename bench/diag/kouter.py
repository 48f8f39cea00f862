"""Does an fp32 square product run faster with C resident and K outermost? One GPU.

    PYTHONPATH=src python3 bench/diag/kouter.py        # about 2 minutes on one H200

outcore's fp32-16384 runs 176-178 ms in C tiles (4096^2 x 16384, 2048-deep pieces) where
the whole product in core takes 163-166: the tiles' GEMMs run 49-51 TFLOP/s against 53-54
for one 16384^3 GEMM. This tries another schedule, written here with plain torch calls:
all of C stays on the device and the product runs as a few rank-d updates over all of C,
C += A[:, k:k+d] @ B[k:k+d, :], K outermost, so every GEMM is M x N x d. The depths ramp up
(a shallow first piece: its copies are the only ones the GPU waits for) while the link
brings the next pieces in underneath. The last piece runs in row strips, each strip's C
copied out as soon as its GEMM ends, so the copies out overlap the last piece's compute.
A's pieces are column slabs (strided rows, cudaMemcpy2DAsync); B's are row blocks.

Each round times, in a rotated order: outcore.matmul (its planner), the K-outer variants,
and cuBLASXt (block 8192 at 16384, the best in every record; 4096 too at 32768); median
of RUNS after a warm-up. Round 0 checks two rows of each outcore product against float64.
Also the in-core GEMM (A, B on the device). Writes bench/results/kouter-<machine>.json
with each variant's kernel span (the first GEMM's start to the last one's end, CUDA events),
a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from fp32_wide import ab_rounds, write_ab  # noqa: E402
from gemm import fill_, median_s, square_cases  # noqa: E402

from outcore.gemm import matmul  # noqa: E402
from outcore.gemm.cublasxt import CublasXt  # noqa: E402
from outcore.gemm.cudacopy import copy2d  # noqa: E402
from outcore.memory import pin_  # noqa: E402

# name -> (piece depths in 64ths of K, rows per strip of the last piece). The last piece
# must compute at least as long as all of C takes to go out (1 GiB at ~50 GB/s: ~21 ms at
# 16384, ~2048 deep), or its strips wait on the copies; names give the depths at 16384.
VARIANTS = {
    "ramp256-last3840-s1024": ((1, 4, 12, 16, 16, 15), 1024),
    "ramp128-last4096-s1024": ((0.5, 2, 8, 16, 21.5, 16), 1024),
    "ramp128-last4096-s512": ((0.5, 2, 8, 16, 21.5, 16), 512),
    "ramp256-last7936-s2048": ((1, 4, 12, 16, 31), 2048),
}
ROUNDS = {16384: 4, 32768: 2}
RUNS = {16384: 5, 32768: 2}


class KOuter:
    """The K-outer schedule on device copies of A, B, C ([M, K], [K, N], [M, N])."""

    def __init__(self, A, B, C):
        dev = torch.device("cuda")
        self.A, self.B, self.C = A, B, C
        self.dA = torch.empty(A.shape, device=dev)
        self.dB = torch.empty(B.shape, device=dev)
        self.dC = torch.empty(C.shape, device=dev)
        self.h2d, self.d2h = torch.cuda.Stream(), torch.cuda.Stream()
        self.spans: list[float] = []

    def pieces(self, fracs) -> list[tuple[int, int]]:
        K = self.A.shape[1]
        ends = [round(K * sum(fracs[:i + 1]) / 64) for i in range(len(fracs))]
        assert ends[-1] == K, (fracs, ends)
        return list(zip([0] + ends[:-1], ends))

    def run(self, fracs, strip_rows: int) -> None:
        comp = torch.cuda.current_stream()
        ks = self.pieces(fracs)
        loaded = []
        for k0, k1 in ks:
            # every piece's copies go in at once, in order, on one stream: the link runs
            # them back to back (~40 ms in all at 16384), well ahead of the GEMMs
            ok = copy2d(self.dA[:, k0:k1], self.A[:, k0:k1], self.h2d)
            assert ok, "2-D copy unavailable"
            with torch.cuda.stream(self.h2d):
                self.dB[k0:k1].copy_(self.B[k0:k1], non_blocking=True)
            loaded.append(self.h2d.record_event())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        M = self.C.shape[0]
        for i, (k0, k1) in enumerate(ks):
            comp.wait_event(loaded[i])   # stream wait: piece i's slabs have landed
            if i == 0:
                start.record(comp)
            a, b = self.dA[:, k0:k1], self.dB[k0:k1]
            if i < len(ks) - 1:
                if i == 0:
                    torch.mm(a, b, out=self.dC)
                else:
                    self.dC.addmm_(a, b)
                continue
            for r0 in range(0, M, strip_rows):
                r1 = min(M, r0 + strip_rows)
                self.dC[r0:r1].addmm_(a[r0:r1], b)
                done = comp.record_event()
                self.d2h.wait_event(done)   # stream wait: this strip of C is final
                with torch.cuda.stream(self.d2h):
                    self.C[r0:r1].copy_(self.dC[r0:r1], non_blocking=True)
        end.record(comp)
        self.d2h.synchronize()   # host sync: the product counts once C is in host memory
        self.spans.append(start.elapsed_time(end) / 1e3)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/kouter.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("kouter")
    doc["env"] = {"KOUTER_SIZES": os.environ.get("KOUTER_SIZES")}   # not in the command
    sizes = [int(s) for s in os.environ.get("KOUTER_SIZES", "16384,32768").split(",")]
    rows, incore = [], {}
    for c in [x for x in square_cases(False) if x.compute == "fp32" and x.m in sizes]:
        A, B, C = (pin_(torch.empty(c.m, c.k)), pin_(torch.empty(c.k, c.n)),
                   pin_(torch.empty(c.m, c.n)))
        fill_(A.view(-1))
        fill_(B.view(-1))
        ko = KOuter(A, B, C)
        runs = RUNS[c.m]
        ko.dA.copy_(A)
        ko.dB.copy_(B)
        torch.mm(ko.dA, ko.dB)
        ts = median_s(lambda: torch.mm(ko.dA, ko.dB, out=ko.dC), 5, torch.cuda.synchronize)
        incore[c.name] = statistics.median(ts)
        xts = (8192,) if c.m == 16384 else (4096, 8192)
        spans: dict[str, list] = {}

        def timer(c, A, B, C, v):
            xt = None
            if v == "outcore":
                fn = lambda: matmul(A, B, C, compute="fp32")  # noqa: E731
            elif v.startswith("cublasxt-"):
                # one handle at a time, closed after its row (as bench/gemm.py does): two
                # live handles beside this diag's 12 GiB at 32768 failed (cuBLAS status 14)
                xt = CublasXt([0], block_dim=int(v.split("-")[1]))
                fn = lambda: xt.gemm(A, B, C)  # noqa: E731
            else:
                fracs, strip = VARIANTS[v]
                fn = lambda: ko.run(fracs, strip)  # noqa: E731
            try:
                fn()   # warm-up (the plan, the arena, cuBLASXt's buffers)
                ko.spans.clear()
                # each fn returns once C is in host memory: median_s needs no sync of its own
                t = statistics.median(median_s(fn, runs, lambda: None))
            finally:
                if xt is not None:
                    xt.close()
            if ko.spans:
                spans.setdefault(v, []).append(statistics.median(ko.spans))
                print(f"  {v}: kernel span {spans[v][-1] * 1e3:.1f} ms", flush=True)
            return t, v

        names = ["outcore", *VARIANTS, *(f"cublasxt-{bd}" for bd in xts)]
        rows += ab_rounds(c, A, B, C, names, timer, ROUNDS[c.m], "outcore")
        for r in rows:
            if r["case"] == c.name and r["round"] == "median":
                r["incore_s"] = incore[c.name]
                if r["variant"] in spans:
                    r["kernel_span_s"] = statistics.median(spans[r["variant"]])
        ko.dA = ko.dB = ko.dC = None   # free this size's device copies before the next
        torch.cuda.empty_cache()
    write_ab(doc, rows, "kouter", "outcore")
    print(common.table([r for r in rows if r["round"] == "median"],
                       ["case", "variant", "seconds", "kernel_span_s", "incore_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
