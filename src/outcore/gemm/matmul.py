"""outcore.matmul: out = alpha * op(A) @ op(B) + beta * out on host-resident matrices.

    C = outcore.matmul(A, B)                                  # every GPU, or the CPU
    outcore.matmul(X, W, out=Y, transb=True, compute="bf16", gpu_memory="8GiB")

The matrices stay in host memory (torch CPU tensors, numpy arrays, numpy memmaps: a
matrix larger than RAM streams from disk); the devices pull C tiles from one shared queue
(schedule.py), cache blocks of A and B (cache.py) and write finished tiles straight into
`out` (worker.py). Pinned inputs and a pinned `out` are copied by DMA directly; anything
else goes through pinned staging buffers (a host memcpy per block: pin once and pass
`out` for the best rate).
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import torch
from tqdm import tqdm

from ..errors import OutcoreError
from ..units import fmt_bytes, parse_bytes
from .computes import STRASSEN
from .band import MIN_ROWS, Band, band_rows, band_threads, cpu_rate, runs_on_host
from .hostmat import HostMatrix
from .model import Rates
from .plan import make_plan
from .schedule import TileQueue, run_workers
from .stats import DeviceStats, GemmStats
from .strassen import make_strassen_plan
from .strassen_worker import StrassenWorker
from .threadmode import caller_mode
from .validate import (check_flag, check_matrix, check_out, check_scalar, dtype_of, op_shape,
                       resolve_budget, resolve_compute, resolve_devices)
from .worker import DeviceWorker, GemmJob

_PRECISION_LOCK = threading.RLock()


@contextlib.contextmanager
def _precision(compute: str, devices):
    """fp32 GEMMs on GPUs in tf32 for compute="tf32" and "tf32x3", in full fp32 otherwise
    (the process-wide setting is restored afterwards; concurrent matmul calls take turns)."""
    if not any(d.type == "cuda" for d in devices):
        yield
        return
    with _PRECISION_LOCK:
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if compute in ("tf32", "tf32x3")
                                           else "highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)


def _labels(devices) -> list[str]:
    names = [str(d) for d in devices]
    return [f"{s}#{i}" if names.count(s) > 1 else s for i, s in enumerate(names)]


def _new_out(a, m: int, n: int, dtype: torch.dtype):
    if isinstance(a, np.ndarray):
        return np.empty((m, n), dtype=np.float32 if dtype == torch.float32 else np.float64)
    return torch.empty((m, n), dtype=dtype)


def _scale(out, beta: float) -> None:
    """out = beta * out (out = 0 when beta == 0: out is not read)."""
    if isinstance(out, np.ndarray):
        if beta == 0:
            out[...] = 0
        else:
            out *= beta
    elif beta == 0:
        out.detach().zero_()   # detach: an out that requires grad is written as data
    else:
        out.detach().mul_(beta)


def matmul(A, B, out=None, *, transa: bool = False, transb: bool = False, alpha: float = 1.0,
           beta: float = 0.0, devices=None, gpu_memory=None, tile=None, compute=None,
           progress: bool = False, return_stats: bool = False):
    """out = alpha * op(A) @ op(B) + beta * out, op(X) = X.T if transX else X.

    A: M x K (K x M if transa), B: K x N (N x K if transb), out: M x N; all host matrices
    of one dtype (float32, float64; bfloat16 for torch tensors), any strides.
    out=None: a new matrix of A's kind (torch tensor or numpy array); beta must then be 0.
    As in BLAS, beta == 0 does not read out, and alpha == 0 (or K == 0) reads neither A nor B.
    compute: "fp64", "fp32", "tf32", "tf32x3", "bf16" or "strassen" (default: the dtype's
        own); tiles are converted on the device, bf16 and tf32 accumulate in fp32 (a CPU
        worker runs tf32 as fp32, and bf16 as bf16 values multiplied in fp32). "tf32x3":
        fp32 data in three TF32 GEMMs of operands split into high and low parts
        (split.py): on the H200 1.1-1.8x the fp32 path's speed, at most its error on sums
        of mixed signs (0.2-0.7x in session 26's record), but about 3x it on sums of one
        sign (a Gram matrix).
        "strassen": float32 or float64 data in its own arithmetic, one Strassen-Winograd
        level (7 GEMMs of 8, strassen.py): a norm-wise error bound, not the classical one.
    devices: None (every GPU, or the CPU when there is none), "cpu", 0, "cuda:1", "0,1"
        or a list; each is a worker pulling tiles from one queue. The CPU listed beside
        GPUs ("0,cpu", once) instead multiplies a band of C's last rows on the host's free
        cores, sized by its measured rate against the GPUs' predicted time (band.py; fp32
        and fp64 only).
    gpu_memory: bytes (or "8GiB") each device may use for tiles and cache.
    tile: T, or (rows, cols[, depth[, copy piece depth]]) to force tile sizes.
    Returns out, or (out, GemmStats) with return_stats=True.
    """
    if (isinstance(out, torch.Tensor) and out.is_inference()
            and not torch.is_inference_mode_enabled()):
        # an out made under inference mode may be written only under it (threadmode.py)
        with torch.inference_mode():
            return matmul(A, B, out, transa=transa, transb=transb, alpha=alpha, beta=beta,
                          devices=devices, gpu_memory=gpu_memory, tile=tile, compute=compute,
                          progress=progress, return_stats=return_stats)
    check_matrix(A, "A")
    check_matrix(B, "B")
    transa, transb = check_flag(transa, "transa"), check_flag(transb, "transb")
    dtype = dtype_of(A)
    if dtype_of(B) != dtype:
        raise TypeError(f"A is {dtype} but B is {dtype_of(B)}: give both the same dtype")
    (m, k), (k2, n) = op_shape(A, transa), op_shape(B, transb)
    if k != k2:
        raise OutcoreError(f"op(A) is {m}x{k} but op(B) is {k2}x{n}: the inner sizes {k} and {k2} "
                           "differ; check the shapes and transa/transb")
    alpha, beta = check_scalar(alpha, "alpha"), check_scalar(beta, "beta")
    if out is None:
        if beta != 0:
            raise OutcoreError(f"beta={beta} needs an out to add to: pass out= or beta=0")
        out = _new_out(A, m, n, dtype)
    else:
        check_out(out, m, n, dtype, A, B)
    compute = resolve_compute(compute, dtype)
    devs = resolve_devices(devices)
    gpus = [d for d in devs if d.type == "cuda"]
    # the CPU listed beside GPUs multiplies a band of C's last rows (band.py), not tiles
    helper = bool(gpus) and len(gpus) < len(devs)
    if helper and len(devs) - len(gpus) > 1:
        # beside GPUs the CPU is one band on every free core (band_threads), not a worker
        # per entry: a second 'cpu' would add nothing, so it is refused, not ignored
        raise OutcoreError(f"devices lists the CPU {len(devs) - len(gpus)} times beside GPUs: "
                           "list 'cpu' once (its band of C's rows uses every free core)")
    workers = gpus if helper else devs
    budget = resolve_budget(gpu_memory, devs)
    labels = _labels(workers) + (["cpu"] if helper else [])
    stats = GemmStats(m, n, k, compute, plan="", devices=[DeviceStats(s) for s in labels])
    if m == 0 or n == 0:
        return (out, stats) if return_stats else out
    if k == 0 or alpha == 0:
        # nothing to multiply, or (BLAS) A and B are not read: NaN or inf in them must not
        # reach out (strassen's sums of blocks carried them there)
        _scale(out, beta)
        if isinstance(out, np.memmap):
            out.flush()
        return (out, stats) if return_stats else out

    t0 = stats.t_start = time.perf_counter()
    hc = HostMatrix(out, "out")
    if hc.flipped:
        # column-major out: compute out.T = op(B).T @ op(A).T into its row-major storage
        A, B, transa, transb, m, n = B, A, not transb, not transa, n, m
    ha, hb = HostMatrix(A, "A"), HostMatrix(B, "B")
    ta, tb = transa ^ ha.flipped, transb ^ hb.flipped
    kw = dict(host_dtype=dtype, compute=compute, budget=budget, tile=tile,
              device_type="cuda" if gpus else "cpu", layout=(ta, tb))
    t_plan = time.perf_counter()
    if compute == STRASSEN:
        return _strassen(ha, hb, hc, ta, tb, alpha, beta, (m, n, k), workers, budget, stats,
                         progress, out, tile, helper, return_stats)
    try:
        whole = GemmJob(make_plan(m, n, k, n_devices=len(workers), **kw), ha, hb, hc,
                        ta=ta, tb=tb, alpha=alpha, beta=beta)
        band = Band(whole, m, band_threads(len(gpus)))
        if helper and runs_on_host(compute, dtype) and band.views() is not None:
            # the GPUs' time for the whole product by the planner's model (a shared plan
            # has no estimate: a lone GPU's, shared evenly). A lone GPU's plan that does
            # not cache everything (out of core) has none either: the time at the GPUs'
            # peak rate then, a lower bound, so that the band still ends before them.
            est = make_plan(m, n, k, n_devices=1, **kw).est_seconds
            if est is None:
                est = 2.0 * m * n * k / Rates().flops[compute]
            gpu_s = est / len(gpus)
            band.r0 = m - band_rows(m, n, k, gpu_s, cpu_rate(dtype, band.threads))
        job = band.job_above(make_plan(band.r0, n, k, n_devices=len(workers), **kw)
                             if band.r0 < m else whole.plan)
    except OutcoreError as e:
        given = parse_bytes(gpu_memory, "gpu_memory")
        if given is None or given == budget:
            raise
        raise OutcoreError(f"{e} (the gpu_memory={fmt_bytes(given)} given, less "
                           f"{fmt_bytes(given - budget)} kept for cuBLAS workspaces)") from None
    stats.plan_s = time.perf_counter() - t_plan
    stats.plan = job.plan.describe()
    if helper:
        why = ("fp64 on the host needs float64 data"
               if compute == "fp64" and not runs_on_host(compute, dtype) else
               f"its share would be under {MIN_ROWS} rows, or {compute} on the host is not "
               "worth it")
        stats.plan += (f"; the CPU: C's last {m - band.r0} rows" if band.r0 < m else
                       f"; the CPU sits out ({why})")
    execute(job, workers, stats, progress, band=band if band.r0 < m else None)
    if isinstance(out, np.memmap):
        out.flush()
    stats.wall_s = time.perf_counter() - t0
    return (out, stats) if return_stats else out


def _strassen(ha, hb, hc, ta, tb, alpha, beta, mnk, workers, budget, stats, progress, out,
              tile, helper, return_stats):
    """matmul's compute="strassen" (strassen.py): the GPUs (or the CPU) run super-tiles."""
    if ha.dtype not in (torch.float32, torch.float64):
        raise OutcoreError(f"compute='strassen' multiplies float32 or float64 matrices, not "
                           f"{ha.dtype}: use compute='bf16' for bfloat16 data")
    if tile is not None:
        raise OutcoreError("tile= does not apply to compute='strassen' (its super-tiles "
                           "follow gpu_memory): drop tile=")
    m, n, k = mnk
    t_plan = time.perf_counter()
    plan = make_strassen_plan(m, n, k, ha.itemsize, budget, len(workers), beta == 0)
    stats.plan_s = time.perf_counter() - t_plan
    stats.plan = plan.describe() + ("; the CPU sits out (not under strassen)" if helper
                                    else "")
    execute(GemmJob(plan, ha, hb, hc, ta=ta, tb=tb, alpha=alpha, beta=beta), workers, stats,
            progress, worker_cls=StrassenWorker)
    if isinstance(out, np.memmap):
        out.flush()
    stats.wall_s = time.perf_counter() - stats.t_start
    return (out, stats) if return_stats else out


def execute(job: GemmJob, devices, stats: GemmStats, progress: bool = False,
            worker_cls=DeviceWorker, band: Band | None = None) -> None:
    """Run `job` (its plan and operands already fixed) on `devices`, one worker each, and
    `band` (C rows below the job's) on the host meanwhile, into stats.devices[-1]."""
    tiles = job.plan.tiles()
    lock = threading.Lock()
    p = job.plan
    total = len(tiles) + (band.chunks if band else 0)
    # no bar object at all without progress: even a disabled tqdm took 0.07 ms of the host's
    # time before the first copy (host-setup-h200*.json), 0.4% of an 18 ms product
    bar_ctx = (tqdm(total=total, unit="tile", desc=f"gemm {p.m}x{p.n}x{p.k} {p.compute}")
               if progress else contextlib.nullcontext(_NoBar()))
    with _precision(p.compute, devices), bar_ctx as bar:
        def tick(n_done: int) -> None:
            with lock:
                bar.update(n_done)
        workers = [worker_cls(d, job, s, tick) for d, s in zip(devices, stats.devices)]
        host = _BandThread(band, stats.devices[-1], tick) if band is not None else None
        # The strips come after every whole tile (also on a lone device, where a prologue's
        # first task then takes the whole tiles and the strips follow: session 14's
        # records ran so)
        try:
            run_workers(TileQueue(tiles, len(workers), tail=p.tail_tasks), workers,
                        first=p.first_task)
        finally:
            if host is not None:
                host.join()     # C's band is written before the product returns


class _NoBar:
    """tqdm's update() where no progress is shown."""

    def update(self, n: int) -> None:
        pass


class _BandThread(threading.Thread):
    """The host's band (band.py) beside the device workers; join() re-raises its error."""

    def __init__(self, band: Band, stats: DeviceStats, tick):
        super().__init__(name="outcore-gemm-band", daemon=True)
        self.band, self.stats, self.tick, self.error = band, stats, tick, None
        self.mode = caller_mode()
        self.start()

    def run(self) -> None:
        try:
            with self.mode():
                self.band.run(self.stats, self.tick)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = e

    def join(self, timeout=None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
