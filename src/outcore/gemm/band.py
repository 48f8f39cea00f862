"""The CPU beside GPUs: a band of C's last rows, sized so that it ends with the GPUs.

    rows = band_rows(m, n, k, gpu_s=plan.est_seconds, cpu_flops=cpu_rate(torch.float32, 14))
    band = Band(whole_job, m - rows, threads)      # C[m - rows:] for the host
    job = band.job_above(make_plan(m - rows, ...))  # C[:m - rows] for the GPUs
    band.run(stats)                                 # in a thread beside the GPU workers

GPUs pull C tiles sized for GPUs (4096 x 4096 x 16384 at fp32-16384): a CPU worker pulling
from the same queue would take one such tile and finish it about 0.6 s after the GPUs had
done the rest (0.8-1.2 TFLOP/s fp32 on the H200 host's 16 cores, `bench/results/cpu-gemm-
h200.json`, against about 50 on the GPU). So where the devices list GPUs and the CPU, the
CPU multiplies a fixed band of C's last rows straight on the host matrices (no copies), as
many rows as it does in SAFETY of the time the planner's model gives the GPUs for the rest,
and the GPUs run their plan on the rows above. A band the CPU would take under MIN_ROWS
rows for (a slow CPU, a bf16 product) is not worth its threads: the GPUs then take
everything. Measured on one H200 (session 15, `gemm-h200-s15-band.json`): no faster than
the GPU alone, so `devices=None` leaves the CPU out."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from .planned import GemmPlan
from .stats import DeviceStats
from .worker import GemmJob

SAFETY = 0.9        # the band's predicted time against the GPUs': a late band holds C back
MIN_ROWS = 64       # fewer rows: the CPU sits out
ALIGN = 32          # band rows in multiples of this (the GPUs' rows stay kernel-friendly)
CHUNK_ROWS = 512    # rows per host GEMM (the host's rate rises with rows up to about this)
PROBE = (256, 4096, 4096)   # rows, k, n of the rate probe: about 9 GFLOP, ~10 ms at 1 TFLOP/s
# computes a CPU band runs: fp32 and fp64 in their own dtype (tf32 at least as exactly);
# bf16 on fp32 data would be emulated on the host, far below the GPU's rate
BAND_COMPUTES = ("fp32", "tf32", "fp64")


def runs_on_host(compute: str, dtype: torch.dtype) -> bool:
    """Whether a band may run `compute` on matrices of `dtype`: it multiplies in C's dtype,
    so fp64 only on float64 data (float32 data under compute="fp64" got fp32 arithmetic in
    the band's rows, fp64 in the GPUs')."""
    return compute in BAND_COMPUTES and (compute != "fp64" or dtype == torch.float64)


def band_threads(n_gpus: int) -> int:
    """Host threads for the band: a core kept for each GPU worker's host thread (it
    enqueues the GPU's copies and GEMMs; a late enqueue idles the GPU) and one spare."""
    return max(1, (os.cpu_count() or 1) - n_gpus - 1)


# the last band's own rate, per (dtype, threads): it ran beside the GPUs, the probe did not
_SEEN: dict[tuple[torch.dtype, int], float] = {}


def cpu_rate(dtype: torch.dtype, threads: int) -> float:
    """FLOP/s of the host's GEMM in `dtype` with `threads` threads: the last band's own rate
    (measured beside the GPUs' copies and host threads), else a PROBE-sized GEMM's."""
    return _SEEN.get((dtype, threads)) or _probe_rate(dtype, threads)


@lru_cache(maxsize=None)
def _probe_rate(dtype: torch.dtype, threads: int) -> float:
    """A warm-up, then the faster of two runs of one PROBE-sized host GEMM (once per process)."""
    rows, k, n = PROBE
    a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    with _threads(threads):
        torch.mm(a, b)
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
    return 2.0 * rows * k * n / best


def band_rows(m: int, n: int, k: int, gpu_s: float, cpu_flops: float,
              safety: float = SAFETY) -> int:
    """Rows r of C for the CPU: r rows at `cpu_flops` take `safety` of the GPUs' time for
    the other m - r rows (`gpu_s` for all m, linear in rows); 0 below MIN_ROWS."""
    if m <= 0 or gpu_s <= 0 or cpu_flops <= 0:
        return 0
    f = safety * gpu_s * cpu_flops / (2.0 * m * n * k)
    rows = int(m * f / (1.0 + f)) // ALIGN * ALIGN
    return rows if MIN_ROWS <= rows < m else 0


@contextlib.contextmanager
def _threads(n: int):
    """torch's host thread count set to n for a block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Band:
    """C[r0:m] = alpha * op(A)[r0:m] @ op(B) + beta * C[r0:m] on the host, the rest of
    `whole` (the product, its plan made for all m rows) on the devices (`job_above`)."""
    whole: GemmJob
    r0: int
    threads: int

    @property
    def r1(self) -> int:
        return self.whole.plan.m

    def views(self):
        """op(A)[r0:m] (rows x K), op(B) (K x N) and C[r0:m] as torch views, or None when a
        matrix is numpy-only (negative strides: torch cannot view it)."""
        a, b, c, r0 = self.whole.a, self.whole.b, self.whole.c, self.r0
        if a.t is None or b.t is None or c.t is None:
            return None
        av = a.t[:, r0:].t() if self.whole.ta else a.t[r0:]
        bv = b.t.t() if self.whole.tb else b.t
        return av, bv, c.t[r0:]

    def run(self, stats: DeviceStats, tick=None) -> None:
        """The band on the host, CHUNK_ROWS rows per GEMM in C's dtype (fp32 or fp64);
        `tick(1)` after each chunk."""
        av, bv, cv = self.views()
        stats.t_ready = time.perf_counter()
        with _threads(self.threads):
            for s in range(0, self.r1 - self.r0, CHUNK_ROWS):
                e = min(s + CHUNK_ROWS, self.r1 - self.r0)
                # beta = 0: addmm_ ignores C's old values (NaN or Inf there do not propagate)
                cv[s:e].addmm_(av[s:e], bv, beta=self.whole.beta, alpha=self.whole.alpha)
                stats.tiles += 1
                stats.gemms += 1
                stats.flops += 2.0 * (e - s) * bv.shape[0] * bv.shape[1]
                if tick is not None:
                    tick(1)
        stats.t_issued = stats.t_synced = time.perf_counter()
        done = stats.t_synced - stats.t_ready
        if done > 0.01:       # long enough to time: the next band is sized by this rate
            _SEEN[(self.whole.c.dtype, self.threads)] = stats.flops / done

    def job_above(self, plan: GemmPlan) -> GemmJob:
        """The product's rows above the band, C[:r0], as a job for the devices (`plan`
        made for r0 rows); `whole` itself when the band is empty."""
        w = self.whole
        if self.r0 == self.r1:
            return w
        k, n = w.plan.k, w.plan.n
        a = w.a.region(0, k, 0, self.r0) if w.ta else w.a.region(0, self.r0, 0, k)
        return replace(w, plan=plan, a=a, c=w.c.region(0, self.r0, 0, n))

    @property
    def chunks(self) -> int:
        return -(-(self.r1 - self.r0) // CHUNK_ROWS)
