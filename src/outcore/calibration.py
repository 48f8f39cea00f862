"""This machine's rates for `outcore plan` and `outcore train`'s MFU: a matmul's FLOP
rate, a host memcpy, a pinned host->device copy on a GPU, and the CPU AdamW alone and
while copies run both ways (planner.py turns them into a step estimate)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Calibration:
    """Measured rates of this machine (bytes/s, FLOP/s, params/s)."""

    device: str
    flops: float            # matmul in the compute dtype on `device`
    host_copy: float        # host memcpy
    h2d: float | None       # pinned host -> device (None on the CPU)
    adamw: float            # CPU AdamW, params/s, its state out of cache
    adamw_loaded: float | None = None   # the same while pinned copies run both ways (GPU)


def _timed(fn, reps: int, sync) -> float:
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()  # host sync: the timing must cover the device's work
    return (time.perf_counter() - t) / reps


def _fastest_s(fn, reps: int) -> float:
    """The fastest of `reps` host-side calls of fn (after one warm-up call): a peak."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def median_s(fn, reps: int) -> float:
    """The median seconds of `reps` host-side calls of fn (after one warm-up call): the
    CPU AdamW's rate on the H200 host spread 3.0-5.6 G params/s over the 3-call means of
    five processes (plan-h200.json, plan-h200-7b.json)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# 64M: p, grad, m, v are 1 GiB. At 16M (256 MB) the H200 machine's host measured 8-16 G
# params/s alone, where the engine's AdamW runs at 4.3-4.8 (bench/results/plan-h200-s38a.json):
# its L3 holds most of 256 MB.
ADAMW_PARAMS = 1 << 26
COPY_BYTES = 512 << 20   # each way, while the AdamW is timed under copies


def matmul_rate(device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a square matmul on `device` (4096^2 on a GPU, the mean of 10; 1024^2 on
    the CPU, the fastest of 7): the peak `train` divides by for MFU; nothing large is
    allocated. On the CPU a mean of five 512^2 products read 15-17 GFLOP/s on a busy
    2-core host that trains at 100+, which put the demo's MFU above 1."""
    cuda = device.startswith("cuda")
    a = torch.randn(*(2 * (4096 if cuda else 1024,)), device=device, dtype=dtype)
    if cuda:
        seconds = _timed(lambda: a @ a, 10, lambda: torch.cuda.synchronize(device))
    else:
        seconds = _fastest_s(lambda: a @ a, 7)
    return 2 * a.shape[0] ** 3 / seconds


def calibrate(device: str = "cpu", dtype: torch.dtype = torch.float32) -> Calibration:
    """A second or so of measurements on `device` (`outcore plan`; about 2 GiB of host
    memory for the AdamW and the copies, freed on return)."""
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    flops = matmul_rate(device, dtype)
    src = torch.ones(COPY_BYTES, dtype=torch.uint8)   # past the host's caches, as ADAMW_PARAMS
    dst = torch.empty_like(src)
    host_copy = src.numel() / _timed(lambda: dst.copy_(src), 2, lambda: None)
    p = torch.zeros(ADAMW_PARAMS, requires_grad=True)
    p.grad = torch.randn_like(p)
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    adamw = p.numel() / median_s(opt.step, 5 if cuda else 1)
    h2d = loaded = None
    if cuda:
        pinned = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
        back = torch.empty_like(pinned, pin_memory=True)
        dev = torch.empty_like(pinned, device=device)
        h2d = pinned.numel() / _timed(lambda: dev.copy_(pinned, non_blocking=True), 3, sync)
        loaded = _adamw_under_copies(opt, p.numel(), pinned, back, dev, h2d, sync)
    return Calibration(device, flops, host_copy, h2d, adamw, loaded)


def _adamw_under_copies(opt, numel: int, pinned, back, dev, h2d: float, sync) -> float:
    """The CPU AdamW's rate while pinned copies run both ways, as in a streamed step (they
    share the host's memory bandwidth with it)."""
    ins, outs = torch.cuda.Stream(dev.device), torch.cuda.Stream(dev.device)
    other = torch.empty_like(dev)
    reps = 5
    # enough copies queued to outlast the AdamW steps at a third of their rate alone
    per_copy = pinned.numel() / h2d
    copies = max(4, int(3 * reps * median_s(opt.step, 1) / per_copy) + 2)
    with torch.cuda.stream(ins):
        for _ in range(copies):
            dev.copy_(pinned, non_blocking=True)
    with torch.cuda.stream(outs):
        for _ in range(copies):
            back.copy_(other, non_blocking=True)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    sync()   # host sync: the queued copies finish before their buffers go
    return numel / statistics.median(times)
