"""Where do fp32-16384's 13 ms over the in-core GEMM go? The kernels alone and under copies.

    PYTHONPATH=src python3 bench/diag/fp32_overlap.py        # about a minute on one H200

outcore's fp32-16384 takes 176-178 ms, in 4096^2 tiles or (bench/diag/kouter.py, session
20) with C resident and K outermost, where one in-core 16384^3 GEMM takes 163-166 ms. This
times, with A, B and C already on the device, the same FLOPs as:
  incore       one torch.mm;
  tiles        the planner's 16 GEMMs of 4096 x 16384 x 4096 (acc = a @ b, 4096^2 tiles);
  kouter       kouter.py's rank-d updates of all of C (piece depths 128, 512, 2048, 4096,
               5504, then 4096 in 512-row strips), A's pieces strided views;
and then `incore` again while the link copies run underneath on two other streams:
  incore+h2d   pinned host -> device, back to back, enough to span the GEMM (~9 GB);
  incore+both  that and device -> host (~4.5 GB) at once;
  incore+outcore-bytes  just outcore's bytes (2 GiB in, 1 GiB out), enqueued at the start.
Each variant: kernel span from CUDA events on the compute stream (its first kernel's start
to its last one's end), median of RUNS, variants rotated over ROUNDS rounds; then
outcore.matmul's wall time in the same rounds. Writes bench/results/fp32-overlap-<machine>
.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from gemm import fill_, median_s  # noqa: E402

from outcore.gemm import matmul  # noqa: E402
from outcore.memory import pin_  # noqa: E402

N = 16384
ROUNDS, RUNS = 3, 5
CHUNK = 64 << 20                   # bytes per background copy
KOUTER = [(0, 128), (128, 640), (640, 2688), (2688, 6784), (6784, 12288), (12288, 16384)]
GIB = 1 << 30


class Setup:
    def __init__(self):
        self.A, self.B, self.C = (pin_(torch.empty(N, N)) for _ in range(3))
        fill_(self.A.view(-1))
        fill_(self.B.view(-1))
        self.dA, self.dB = self.A.cuda(), self.B.cuda()
        self.dC = torch.empty(N, N, device="cuda")
        self.tiles = [torch.empty(4096, 4096, device="cuda") for _ in range(2)]
        # background copies: device scratch in, host scratch out (pinned). Buffer reuse:
        # every run overwrites them, and the copies out read dC while GEMMs write it; only
        # the timing counts here, never their contents
        self.scratch_in = torch.empty(2 * N * N, device="cuda")
        self.host_out = pin_(torch.empty(N * N))
        self.h2d, self.d2h = torch.cuda.Stream(), torch.cuda.Stream()

    def background(self, bytes_in: int, bytes_out: int) -> None:
        """Enqueue copies on the two copy streams; they start at once and run beside the
        GEMMs enqueued next (nothing waits on them until the closing synchronize)."""
        per = CHUNK // 4
        host_in = (self.A.view(-1), self.B.view(-1))
        done, q = 0, 0
        with torch.cuda.stream(self.h2d):
            while done < bytes_in:
                h = host_in[q % 2]
                off = (q // 2 * per) % (h.numel() - per)
                self.scratch_in[off:off + per].copy_(h[off:off + per], non_blocking=True)
                done, q = done + CHUNK, q + 1
        done, q = 0, 0
        src = self.dC.view(-1)
        with torch.cuda.stream(self.d2h):
            while done < bytes_out:
                off = (q * per) % (src.numel() - per)
                self.host_out[off:off + per].copy_(src[off:off + per], non_blocking=True)
                done, q = done + CHUNK, q + 1

    def gemms(self, kind: str) -> None:
        if kind == "tiles":
            for i in range(4):
                for j in range(4):
                    acc = self.tiles[(i * 4 + j) % 2]
                    torch.mm(self.dA[i * 4096:(i + 1) * 4096], self.dB[:, j * 4096:(j + 1) * 4096],
                             out=acc)
        elif kind == "kouter":
            for x, (k0, k1) in enumerate(KOUTER):
                a, b = self.dA[:, k0:k1], self.dB[k0:k1]
                if x == 0:
                    torch.mm(a, b, out=self.dC)
                elif x < len(KOUTER) - 1:
                    self.dC.addmm_(a, b)
                else:
                    for r0 in range(0, N, 512):
                        self.dC[r0:r0 + 512].addmm_(a[r0:r0 + 512], b)
        else:
            torch.mm(self.dA, self.dB, out=self.dC)

    def span(self, variant: str) -> float:
        """Seconds from the first GEMM's start to the last one's end (CUDA events)."""
        kind, _, load = variant.partition("+")
        bytes_in, bytes_out = {"": (0, 0), "h2d": (9 * GIB, 0), "both": (9 * GIB, 9 * GIB // 2),
                               "outcore-bytes": (2 * GIB, GIB)}[load]
        torch.cuda.synchronize()   # host sync: nothing from the last run still runs
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.background(bytes_in, bytes_out)
        s.record()
        self.gemms(kind)
        e.record()
        torch.cuda.synchronize()   # host sync: read the events; the copies are done too
        return s.elapsed_time(e) / 1e3


VARIANTS = ["incore", "tiles", "kouter", "incore+h2d", "incore+both", "incore+outcore-bytes",
            "outcore"]


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/fp32_overlap.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("fp32-overlap")
    st = Setup()
    flops = 2.0 * N ** 3
    times: dict[str, list] = {v: [] for v in VARIANTS}
    rows = []
    for rnd in range(ROUNDS):
        order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
        for v in order:
            if v == "outcore":
                fn = lambda: matmul(st.A, st.B, st.C, compute="fp32")  # noqa: E731
                fn()   # warm-up: the plan, the arena
                ts = median_s(fn, RUNS, lambda: None)   # matmul returns with C on the host
            else:
                st.span(v)   # warm-up
                ts = [st.span(v) for _ in range(RUNS)]
            t = statistics.median(ts)
            times[v].append(t)
            rows.append({"variant": v, "round": rnd, "seconds": t, "runs_s": ts,
                         "tflops": flops / t / 1e12})
            print(rows[-1], flush=True)
    ref = statistics.median(times["incore"])
    for v in VARIANTS:
        t = statistics.median(times[v])
        rows.append({"variant": v, "round": "median", "seconds": t, "tflops": flops / t / 1e12,
                     "vs_incore": t / ref})
    doc["runs"] = rows
    doc["note"] = ("seconds: kernel span on the compute stream (CUDA events) for all but "
                   "outcore, whose figure is wall time with C back in host memory")
    common.write(doc, f"fp32-overlap-{common.machine_name()}")
    print(common.table([r for r in rows if r["round"] == "median"],
                       ["variant", "seconds", "tflops", "vs_incore"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
