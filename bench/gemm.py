#!/usr/bin/env python3
"""Benchmark outcore.matmul against cuBLASXt, in-core torch and the roofline bound.

    cd <repo> && PYTHONPATH=src python3 bench/gemm.py --budget-s 520   # 1 x H200: 6-10 min
                                                             # 2 x H200: about 2 min
                                                             # 4-8 x H200 (65536): longer
    PYTHONPATH=src python3 bench/gemm.py --smoke             # CPU, every code path, seconds

One GPU  -> bench/results/gemm-h200.json: fp32-16384, fp32-32768, tf32-32768, bf16-32768
            (square, fp32 host matrices, pinned; the prefix is the arithmetic) and training
            shapes train-<layout>-t<tokens>-f<features>-<compute>: a Linear layer's three
            products on tokens 16k..64k, in = out features 8k..16k (NT forward, NN dx, TN dW).
N GPUs   -> bench/results/gemm-h200xN.json (all visible GPUs, or --gpus N): fp32-S-1gpu,
            fp32-S-Ngpu and fp32-S-slowed, S = 32768 on two GPUs and 65536 on more (the
            last GPU shares its time with another process that runs bf16 matmuls nonstop;
            no GPU setting is changed).
Systems: outcore; cublasxt (cublasXtSgemm through ctypes, pinned, best blockDim of
2048/4096/8192; fp32 only); torch-incore (the same product, operands already on the GPU);
bound (max of FLOPs / in-core rate and the least bytes that must cross PCIe / measured
bandwidth; for -slowed the sum of each GPU's outcore rate alone under the same slowing:
on more than two GPUs GPU 0's rate alone stands for every GPU not slowed). One GPU's fp32
cases also have outcore-tf32x3 and torch-incore-tf32x3 (compute="tf32x3", three TF32
GEMMs of split operands, outcore.gemm.split; --no-tf32x3 drops them), and the fp32,
tf32x3 and cuBLASXt rows each a 256-entry check against float64 (`check_rel_error`).
Every row has `tflops` (null in a failed or skipped run, which has `error`). The run
starts no new work after --budget-s seconds (training shapes are dropped largest first,
and listed under "dropped").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from outcore.gemm.cli import TOLERANCE, check_sampled
from outcore.gemm.cublasxt import CublasXt
from outcore.gemm.matmul import matmul
from outcore.gemm.split import mm_acc_split, split_
from outcore.memory import pin_

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Hog  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK_DIMS = (2048, 4096, 8192)
FORCED_TILE: tuple | None = None   # --tile: outcore's C tiles, matmul(tile=)
DTYPE = {"bf16": torch.bfloat16, "fp64": torch.float64}
@dataclass
class Case:
    name: str
    m: int
    n: int
    k: int
    compute: str
    transa: bool = False
    transb: bool = False
    devices: tuple = (0,)
    slowed: bool = False
    train: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def layout(self) -> str:
        return ("T" if self.transa else "N") + ("T" if self.transb else "N")

    def row(self, system: str, **kw) -> dict:
        """A results row; `tflops` is in every row (None in a failed or skipped one)."""
        return {"system": system, "case": self.name, "tflops": None, "m": self.m, "n": self.n,
                "k": self.k, "layout": self.layout, "compute": self.compute,
                "host_dtype": "float32", **kw}


@dataclass
class Env:
    smoke: bool
    runs: int
    deadline: float
    devices: list                     # torch.device per index used by the cases
    bufs: list = field(default_factory=list)
    bw: dict = field(default_factory=dict)
    incore: dict = field(default_factory=dict)
    with_cpu: bool = False            # fp32 square cases: also the GPU with the CPU's band
    tf32x3: bool = True               # fp32 cases: also the row outcore-tf32x3
    strassen: bool = True             # fp32 cases: also the row outcore-strassen
    keep: set | None = None           # --cases: the case names to run (None: all)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def sync(self) -> None:
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)   # host sync: timings end when the GPU is done

    def views(self, c: Case):
        """A, B, C of the case as views of the pinned flat buffers (no allocation)."""
        sa = (c.k, c.m) if c.transa else (c.m, c.k)
        sb = (c.n, c.k) if c.transb else (c.k, c.n)
        return [b[:s[0] * s[1]].view(s) for b, s in zip(self.bufs, (sa, sb, (c.m, c.n)))]


def square_cases(smoke: bool) -> list[Case]:
    s, b = (256, 512) if smoke else (16384, 32768)
    return [Case(f"fp32-{s}", s, s, s, "fp32"), Case(f"fp32-{b}", b, b, b, "fp32"),
            Case(f"tf32-{b}", b, b, b, "tf32"), Case(f"bf16-{b}", b, b, b, "bf16")]


def train_cases(smoke: bool) -> list[Case]:
    tokens, feats = ((512, 1024), (256,)) if smoke else ((16384, 32768, 65536), (8192, 16384))
    out = []
    for compute in ("fp32", "bf16"):
        for t in tokens:
            for f in feats:
                tag = f"t{t}-f{f}-{compute}"
                out += [Case(f"train-NT-{tag}", t, f, f, compute, transb=True, train=True),
                        Case(f"train-NN-{tag}", t, f, f, compute, train=True),
                        Case(f"train-TN-{tag}", f, f, t, compute, transa=True, train=True)]
    return out


def multi_cases(smoke: bool, n: int = 2) -> list[Case]:
    """1 GPU, all n, and all n with the last one slowed; 65536 on more than two GPUs (the
    scaling issue's size: 32768 is a few tiles per GPU on eight)."""
    s = 512 if smoke else (32768 if n <= 2 else 65536)
    every = tuple(range(n))
    return [Case(f"fp32-{s}-1gpu", s, s, s, "fp32", devices=(0,)),
            Case(f"fp32-{s}-{n}gpu", s, s, s, "fp32", devices=every),
            Case(f"fp32-{s}-slowed", s, s, s, "fp32", devices=every, slowed=True)]


# -- measurements ----------------------------------------------------------------------------
def median_s(fn, runs: int, sync) -> list[float]:
    out = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def measure_bandwidth(env: Env) -> dict:
    """Pinned host<->device copy rates (GB/s): each direction, both at once, and h2d on
    every GPU at once. On the CPU (smoke): a host memcpy."""
    n = min(env.bufs[0].numel(), (1 << 28) if not env.smoke else 1 << 18)   # 1 GiB on a GPU
    src = env.bufs[0][:n]
    out = {}
    if env.devices[0].type == "cpu":
        dst = torch.empty(n)
        t = min(median_s(lambda: dst.copy_(src), 3, env.sync))
        rate = n * 4 / t / 1e9
        return {"h2d": rate, "d2h": rate, "both": rate, "h2d_all": rate * len(env.devices)}
    devs = sorted(set(env.devices), key=str)
    dst = {d: torch.empty(n, device=d) for d in devs}
    back = env.bufs[1][:n]
    d0 = devs[0]
    s1, s2 = torch.cuda.Stream(d0), torch.cuda.Stream(d0)

    def both():
        with torch.cuda.stream(s1):
            dst[d0].copy_(src, non_blocking=True)
        with torch.cuda.stream(s2):
            back.copy_(dst[d0], non_blocking=True)

    def all_h2d():
        for d in devs:
            with torch.cuda.device(d):
                dst[d].copy_(src, non_blocking=True)

    tests = {"h2d": lambda: dst[d0].copy_(src, non_blocking=True),
             "d2h": lambda: back.copy_(dst[d0], non_blocking=True),
             "both": both, "h2d_all": all_h2d}
    for name, fn in tests.items():
        fn()
        t = min(median_s(fn, 5, env.sync))
        moved = n * 4 * (2 if name == "both" else len(devs) if name == "h2d_all" else 1)
        out[name] = moved / t / 1e9
    # Strided pieces, as matmul copies them: 2-D DMA (cudaMemcpy2DAsync) of rows of 8 to
    # 64 KiB out of rows 128 KiB apart (a 2048- to 16384-wide piece of a 32768-wide matrix).
    from outcore.gemm.cudacopy import copy2d
    host = env.bufs[0][:n].view(-1, 32768)
    for width in (2048, 4096, 8192, 16384):
        region = host[:, :width]
        dev2 = torch.empty(region.shape, device=d0)
        stream = torch.cuda.current_stream(d0)
        if not copy2d(dev2, region, stream):
            out[f"h2d_2d_{width * 4 // 1024}k"] = out[f"d2h_2d_{width * 4 // 1024}k"] = None
            continue
        t = min(median_s(lambda: copy2d(dev2, region, stream), 5, env.sync))
        out[f"h2d_2d_{width * 4 // 1024}k"] = region.numel() * 4 / t / 1e9
        # the same rows the other way (C's tiles going out): dev2 holds the region's own
        # values after the copies in, so the host buffer is left as it was
        t = min(median_s(lambda: copy2d(region, dev2, stream), 5, env.sync))
        out[f"d2h_2d_{width * 4 // 1024}k"] = region.numel() * 4 / t / 1e9
    return out


def run_incore(env: Env, c: Case, dev: torch.device) -> dict:
    """torch.mm with everything already on `dev`; remembers the rate for the bound.
    tf32x3 (row torch-incore-tf32x3): A and B split into hi and lo parts and the three
    TF32 GEMMs, as outcore's worker runs them (the splits timed with the GEMMs)."""
    A, B, _ = env.views(c)
    dt = DTYPE.get(c.compute, torch.float32)
    a, b = A.to(dev, dt), B.to(dev, dt)
    a, b = (a.t() if c.transa else a), (b.t() if c.transb else b)
    out = torch.empty(c.m, c.n, device=dev, dtype=dt)
    x3 = c.compute == "tf32x3"
    if x3:
        hi_a, lo_a, hi_b, lo_b = (torch.empty_like(x) for x in (a, a, b, b))

        def product():
            hi_a.copy_(a)
            hi_b.copy_(b)
            split_(hi_a, lo_a)
            split_(hi_b, lo_b)
            mm_acc_split(out, hi_a, lo_a, hi_b, lo_b, 1.0, 0.0)
    else:
        def product():
            torch.mm(a, b, out=out)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if c.compute in ("tf32", "tf32x3")
                                       else "highest")
    try:
        times = median_s(product, 1, env.sync)
        times = median_s(product, env.runs, env.sync)
    finally:
        torch.set_float32_matmul_precision(before)
        del a, b, out
        if x3:
            del hi_a, lo_a, hi_b, lo_b
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    t = statistics.median(times)
    if not x3:
        env.incore[(c.name, str(dev))] = c.flops / t
    return c.row("torch-incore-tf32x3" if x3 else "torch-incore", tflops=c.flops / t / 1e12,
                 wall_s=t, runs_s=times, device=str(dev))


def run_outcore(env: Env, c: Case, devices, check: bool = True,
                system: str = "outcore") -> dict:
    A, B, C = env.views(c)
    kw = dict(transa=c.transa, transb=c.transb, compute=c.compute, devices=list(devices),
              tile=FORCED_TILE)
    stats = []

    def once():
        stats.append(matmul(A, B, C, return_stats=True, **kw)[1])

    once()   # warm-up: device buffers, the 2-D copy probe, cuBLAS handles
    times = median_s(once, env.runs, lambda: None)
    t = statistics.median(times)
    st = stats[-1]
    row = c.row(system, tflops=c.flops / t / 1e12, wall_s=t, runs_s=times,
                devices=[str(d) for d in devices], h2d_bytes=st.h2d_bytes,
                d2h_bytes=st.d2h_bytes, plan=st.plan,
                tiles_per_device={d.device: d.tiles for d in st.devices},
                flops_share={d.device: d.flops / st.flops for d in st.devices},
                # the last timed run: when each worker was done (which one held C back)
                done_s={d.device: d.t_synced - st.t_start for d in st.devices if d.t_synced})
    if check:
        row.update(check_row(A, B, C, c))
    return row


# Entries of C checked against float64 dot products: more in the fp32 and tf32x3 rows, whose
# errors (outcore fp32 and tf32x3, cuBLASXt) the results compare
CHECKED = {"fp32": 256, "tf32x3": 256, "strassen": 256}


def check_row(A, B, C, c: Case) -> dict:
    """The sampled check of C = op(A) @ op(B) as a results row's fields; check_rel_error:
    the largest error relative to sum_k |a_ik b_kj| (the same entries in every row)."""
    n = CHECKED.get(c.compute, 16)
    rng = np.random.default_rng(0)
    idx = list(zip(rng.integers(0, c.m, n), rng.integers(0, c.n, n)))
    err, ratio = check_sampled(A, B, C, [0.0] * n, idx, c.transa, c.transb, 1.0, 0.0,
                               c.compute)
    return dict(check_entries=n, check_max_error=err, check_tolerance_ratio=ratio,
                check_rel_error=ratio * TOLERANCE[c.compute], check_ok=ratio <= 1.0)


def run_cublasxt(env: Env, c: Case, devices) -> dict:
    if c.compute != "fp32":
        return c.row("cublasxt", error="cuBLASXt has no tf32/bf16 GEMM (SGEMM/DGEMM only)")
    if env.devices[0].type != "cuda":
        return c.row("cublasxt", error="cuBLASXt needs CUDA (smoke run on the CPU)")
    torch.cuda.empty_cache()   # cuBLASXt allocates outside torch: give back outcore's cache
    A, B, C = env.views(c)
    ids = tuple(d.index for d in devices)
    per_dim, handles = {}, {}
    # The handles live for this row only: a live cuBLASXt handle keeps its host threads and
    # device buffers. With the fp32 cases' handles kept alive, outcore's tf32-32768 row
    # measured 237 TFLOP/s here, where bench/gemm_probe.py (no handle) measured 313 with
    # the same plan on the same H200.
    try:
        for bd in BLOCK_DIMS:
            handles[bd] = xt = CublasXt(list(ids), block_dim=bd)
            x = env.bufs[0][:4096 * 4096].view(4096, 4096)
            xt.gemm(x, x, env.bufs[2][:4096 * 4096].view(4096, 4096))   # warm-up
            per_dim[bd] = median_s(lambda: xt.gemm(A, B, C, transa=c.transa,
                                                   transb=c.transb), 1, lambda: None)
        best = min(per_dim, key=lambda bd: per_dim[bd][0])
        xt = handles[best]
        times = per_dim[best] + median_s(lambda: xt.gemm(A, B, C, transa=c.transa,
                                                          transb=c.transb), 2, lambda: None)
    finally:
        for xt in handles.values():
            xt.close()
    t = statistics.median(times)
    return c.row("cublasxt", tflops=c.flops / t / 1e12, wall_s=t, runs_s=times,
                 block_dim=best, devices=[str(d) for d in devices],
                 tflops_by_block_dim={bd: c.flops / v[0] / 1e12 for bd, v in per_dim.items()},
                 **check_row(A, B, C, c))


def bound_row(env: Env, c: Case, devices) -> dict:
    rates = [env.incore.get((c.name, str(d))) or env.incore.get(("ref", str(d)))
             for d in devices]
    if any(r is None for r in rates):
        return c.row("bound", error="no in-core rate measured for this case")
    bytes_in = (c.m * c.k + c.k * c.n) * 4
    bytes_out = c.m * c.n * 4
    bw = env.bw
    h2d = bw["h2d_all"] if len(devices) > 1 else bw["h2d"]
    t_link = max(bytes_in / (h2d * 1e9), bytes_out / (bw["d2h"] * len(devices) * 1e9),
                 (bytes_in + bytes_out) / (bw["both"] * len(devices) * 1e9))
    t_flop = c.flops / sum(rates)
    t = max(t_link, t_flop)
    return c.row("bound", tflops=c.flops / t / 1e12, wall_s=t,
                 limit="compute" if t_flop >= t_link else "link",
                 incore_tflops=sum(rates) / 1e12, min_bytes_in=bytes_in, min_bytes_out=bytes_out,
                 link_s=t_link, compute_s=t_flop)


# -- driver ----------------------------------------------------------------------------------
def guarded(rows: list, make, c: Case, system: str, env: Env, est_s: float = 0.0) -> dict:
    """Run make() -> row; a failure or an exhausted time budget becomes an error row."""
    if env.left() < est_s:
        row = c.row(system, error=f"skipped: {env.left():.0f} s left of the time budget, "
                    f"needs about {est_s:.0f} s")
    else:
        try:
            row = make()
        except Exception as e:  # noqa: BLE001 - one failed run must not end the benchmark
            row = c.row(system, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    rows.append(row)
    return row


def estimate_s(c: Case, env: Env) -> float:
    """Rough cost of all systems on a case (used to drop cases that would not fit)."""
    if env.smoke:
        return 0.0
    rate = {"fp32": 45e12, "tf32": 300e12, "bf16": 450e12}[c.compute]
    link = (c.m * c.k + c.k * c.n + c.m * c.n) * 4 / 45e9
    one = max(c.flops / rate, link) + 0.05
    runs = (env.runs + 1) * (2 + (c.compute == "fp32") * (env.tf32x3 + env.strassen)) + (
        len(BLOCK_DIMS) + 2 if c.compute == "fp32" else 0)
    return one * runs + 2.0


def one_gpu(env: Env, rows: list, dropped: list, train: bool, bar) -> None:
    dev = env.devices[0]
    cases = [c for c in square_cases(env.smoke) if env.keep is None or c.name in env.keep]
    tcases = [c for c in (train_cases(env.smoke) if train else [])
              if env.keep is None or c.name in env.keep]
    fixed = sum(estimate_s(c, env) for c in cases)
    room = env.left() - fixed - 20
    for c in sorted(tcases, key=lambda c: -c.flops):   # drop the largest first
        if sum(estimate_s(x, env) for x in tcases) <= room:
            break
        tcases.remove(c)
        dropped.append({"case": c.name, "reason": "time budget (largest training shapes "
                        "are dropped first)"})
    bar.total += len(cases + tcases)
    bar.refresh()
    for c in cases + tcases:
        est = estimate_s(c, env) / 4
        guarded(rows, lambda: run_incore(env, c, dev), c, "torch-incore", env, est)
        guarded(rows, lambda: bound_row(env, c, [dev]), c, "bound", env)
        guarded(rows, lambda: run_outcore(env, c, [dev]), c, "outcore", env, est)
        if env.tf32x3 and c.compute == "fp32":
            x3 = replace(c, compute="tf32x3")
            guarded(rows, lambda: run_incore(env, x3, dev), x3, "torch-incore-tf32x3", env,
                    est / 4)
            guarded(rows, lambda: run_outcore(env, x3, [dev], system="outcore-tf32x3"), x3,
                    "outcore-tf32x3", env, est / 2)
        if env.strassen and c.compute == "fp32":
            sc = replace(c, compute="strassen")
            guarded(rows, lambda: run_outcore(env, sc, [dev], system="outcore-strassen"), sc,
                    "outcore-strassen", env, est)
        if env.with_cpu and c in cases and c.compute in ("fp32", "fp64"):
            host = [dev, torch.device("cpu")]
            guarded(rows, lambda: run_outcore(env, c, host, system="outcore+cpu"), c,
                    "outcore+cpu", env, est)
        guarded(rows, lambda: run_cublasxt(env, c, [dev]), c, "cublasxt", env, est)
        bar.update(1)


def multi_gpus(env: Env, rows: list, bar) -> None:
    devs_all = list(env.devices)
    d0, dslow = devs_all[0], devs_all[-1]
    one, every, slowed = multi_cases(env.smoke, len(devs_all))
    bar.total += 3
    bar.refresh()
    # in-core rates feed the bounds: GPU 0's is a row; on two GPUs both are measured, on
    # more GPU 0's stands for all (same model; a 65536 product takes seconds per GPU)
    guarded(rows, lambda: run_incore(env, one, d0), one, "torch-incore", env)
    if len(devs_all) == 2:
        guarded([], lambda: run_incore(env, one, dslow), one, "torch-incore", env)
    for d in devs_all:
        env.incore[("ref", str(d))] = (env.incore.get((one.name, str(d)))
                                       or env.incore.get((one.name, str(d0))))
    by_case = {}
    for c, devs in ((one, [d0]), (every, devs_all)):
        guarded(rows, lambda: bound_row(env, c, devs), c, "bound", env)
        by_case[c.name] = guarded(rows, lambda: run_outcore(env, c, devs), c, "outcore", env)
        if env.strassen:
            sc = replace(c, compute="strassen")
            by_case["s-" + c.name] = guarded(
                rows, lambda: run_outcore(env, sc, devs, system="outcore-strassen"), sc,
                "outcore-strassen", env)
        guarded(rows, lambda: run_cublasxt(env, c, devs), c, "cublasxt", env)
        bar.update(1)
    for prefix in ("", "s-") if env.strassen else ("",):
        r1, rn = by_case[prefix + one.name], by_case[prefix + every.name]
        if r1.get("tflops") and rn.get("tflops"):
            rn["speedup"] = rn["tflops"] / r1["tflops"]
    c, alone, row = slowed, [], {}
    try:
        with Hog(dslow, env.smoke):
            alone = [guarded([], lambda: run_outcore(env, c, [d], check=False), c, "outcore",
                             env) for d in (d0, dslow)]
            row = guarded(rows, lambda: run_outcore(env, c, devs_all), c, "outcore", env)
            guarded(rows, lambda: run_cublasxt(env, c, devs_all), c, "cublasxt", env)
    except Exception as e:  # noqa: BLE001 - the co-running process failed: record, go on
        rows.append(c.row("outcore", error=f"co-running process: {e}"))
    if len(alone) == 2 and all(a.get("tflops") for a in alone):
        total = alone[0]["tflops"] * (len(devs_all) - 1) + alone[1]["tflops"]
        rows.append(c.row("bound", tflops=total, gpu0_alone_tflops=alone[0]["tflops"],
                          slowed_gpu_alone_tflops=alone[1]["tflops"],
                          limit="sum of each GPU's outcore rate alone under the same slowing"
                          + ("" if len(devs_all) == 2 else " (GPU 0's for every GPU not "
                             "slowed)")))
        if row.get("tflops"):
            row["fraction_of_bound"] = row["tflops"] / total
    else:
        rows.append(c.row("bound", error="an alone run failed: " + "; ".join(
            a.get("error", "") for a in alone)))
    bar.update(1)


def fill_(buf: torch.Tensor, salt: int = 0) -> None:
    """Uniform [-1, 1) values, seeded by the size plus `salt` (buffers of one size filled
    with different salts differ). With a GPU every element is drawn, on the device in 1 GiB
    chunks; on the CPU (the smoke run) a random head is copied along, fast for tens of GB.
    Until session 26 the GPU runs also repeated a 2**24-element head, so a case's entries
    summed the same few thousand products many times over (and until session 25 A and B
    held the same values, so an NT or TN product was A's Gram matrix): the sampled errors
    of those records compare the systems on that data, not on independent entries."""
    seed = buf.numel() + salt
    if torch.cuda.is_available():
        gen = torch.Generator(device="cuda").manual_seed(seed)
        chunk = 1 << 28
        for s in range(0, buf.numel(), chunk):
            part = buf[s:s + chunk]
            part.copy_(torch.empty(part.numel(), device="cuda").uniform_(-1, 1, generator=gen))
        return
    head = min(buf.numel(), 1 << 24)
    buf[:head].uniform_(-1, 1, generator=torch.Generator().manual_seed(seed))
    done = head
    while done < buf.numel():
        step = min(done, buf.numel() - done)
        buf[done:done + step].copy_(buf[:step])
        done += step


def host_matrices(c: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Case c's A and B (filled) and C, each its own pinned host tensor, stored as the
    case's layout asks (A as K x M when transa, B as N x K when transb)."""
    sa = (c.k, c.m) if c.transa else (c.m, c.k)
    sb = (c.n, c.k) if c.transb else (c.k, c.n)
    A, B, C = (torch.empty(s) for s in (sa, sb, (c.m, c.n)))
    fill_(A.view(-1))
    fill_(B.view(-1), salt=1)
    return pin_(A), pin_(B), pin_(C)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (seconds)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per system (median)")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="stop starting new work after this many seconds (default 330)")
    ap.add_argument("--no-train", action="store_true", help="skip the training shapes")
    ap.add_argument("--square-tiles", action="store_true", help="the planner does not try "
                    "tiles 2x and 4x wider than tall, or taller (outcore.gemm.lone.FLAT_TILES "
                    "off; on by default since session 11)")
    ap.add_argument("--small-shared-tiles", action="store_true", help="several GPUs: tiles "
                    "small enough to balance throughout (2048 at 32768 on two; the rule before "
                    "session 14's outcore.gemm.shared) instead of the lone tiles with the end "
                    "in strips")
    ap.add_argument("--max-strips", type=int, help="a lone GPU's last tile in up to this "
                    "many row strips (outcore.gemm.plan.MAX_STRIPS, default 4; above 4 a strip "
                    "keeps 256 rows at least instead of 512)")
    ap.add_argument("--gpus", type=int, help="GPUs to use (default: every visible one; with "
                    "--smoke, that many CPU workers for the multi-device cases, default 2)")
    ap.add_argument("--with-cpu", action="store_true", help="one GPU, fp32 square cases: "
                    "also the row outcore+cpu, the GPU with the host's CPU multiplying a band "
                    "of C's rows (outcore.gemm.band)")
    ap.add_argument("--no-tf32x3", action="store_true", help="one GPU, fp32 cases: skip "
                    "the rows outcore-tf32x3 and torch-incore-tf32x3 (compute=\"tf32x3\": "
                    "three TF32 GEMMs of split operands, outcore.gemm.split)")
    ap.add_argument("--no-strassen", action="store_true", help="one GPU, fp32 cases: skip "
                    "the row outcore-strassen (compute=\"strassen\": one Strassen-Winograd "
                    "level in fp32 arithmetic, outcore.gemm.strassen)")
    ap.add_argument("--x3-chunk", type=int, help="K of one GEMM call of tf32x3's large "
                    "term (outcore.gemm.split.BIG_CHUNK; 0: all of it)")
    ap.add_argument("--a-rows", help="comma-separated computes whose plans may copy A's "
                    "panels whole by rows (outcore.gemm.lone.A_ROWS; default bf16, since "
                    "session 16), or 'none'")
    ap.add_argument("--b-rows", help="the same for a transposed B's panels, where K is "
                    "at least outcore.gemm.lone.B_ROWS_MIN_K (16384) (outcore.gemm.lone."
                    "B_ROWS; default bf16, since session 18), or 'none'")
    ap.add_argument("--tall-ta", help="comma-separated computes whose plans with a "
                    "transposed A may take whole-height column strips of C where M is at least "
                    "outcore.gemm.lone.TALL_TA_MIN_M (outcore.gemm.lone.TALL_TA; default bf16, "
                    "since session 18), or 'none'")
    ap.add_argument("--accs", type=int, help="accumulators of a lone GPU's plan without a "
                    "prologue (outcore.gemm.plan.LONE_ACCS, default 4 since session 16)")
    ap.add_argument("--flat-sides", help="comma-separated short sides the planner tries "
                    "flat tiles and whole-width strips with (sets lone.FLAT_SIDES and "
                    "lone.STRIP_ROWS, as session 19's A/Bs ran; default 2048,4096,8192 and "
                    "1024,2048,4096,8192)")
    ap.add_argument("--short-strip-max-m", type=int, help="largest M whose plans may take "
                    "whole-width strips lone.SHORT_STRIP (512) rows tall "
                    "(lone.SHORT_STRIP_MAX_M; default 16384 since session 20; 0: none)")
    ap.add_argument("--d2h-rows", choices=("on", "off"), help="whether the planner's model "
                    "charges C tiles narrower than C for their rows going out "
                    "(model.D2H_ROWS; default on)")
    ap.add_argument("--d2h-table", help="model.D2H_ROW_FACTOR as KIB:FRACTION,... "
                    "(e.g. 16:0.73,32:0.97,64:1.0)")
    ap.add_argument("--eager-pieces", action="store_true", help="a tile's pieces all "
                    "enqueued before its first GEMM (outcore.gemm.loads.LAZY_PIECES off; the "
                    "rule until session 23)")
    ap.add_argument("--torch-stream-ctx", action="store_true", help="the workers switch "
                    "streams by torch.cuda.stream() (outcore.gemm.worker.LIGHT_STREAM_CTX off; "
                    "the rule until session 23)")
    ap.add_argument("--tile", help="ROWS,COLS[,DEPTH[,PIECE]]: outcore's C tiles in every "
                    "case, as matmul(tile=) forces them (default: the planner's)")
    ap.add_argument("--cases", help="one GPU: comma-separated case names to run (default: "
                    "all)")
    ap.add_argument("--out", help="results file, or a bare name for bench/results/NAME.json "
                    "(default bench/results/gemm-<machine>.json; smoke: "
                    "/tmp/outcore-bench/gemm-smoke.json)")
    args = ap.parse_args()
    import outcore.gemm.lone as lone
    if args.square_tiles:
        lone.FLAT_TILES = False
    # the planner's per-compute settings: a comma-separated list of computes, or "none"
    for arg, name in ((args.a_rows, "A_ROWS"), (args.b_rows, "B_ROWS"),
                      (args.tall_ta, "TALL_TA")):
        if arg is not None:
            setattr(lone, name, () if arg == "none" else tuple(arg.split(",")))
    if args.flat_sides:
        lone.FLAT_SIDES = lone.STRIP_ROWS = tuple(int(x) for x in args.flat_sides.split(","))
    if args.short_strip_max_m is not None:
        lone.SHORT_STRIP_MAX_M = args.short_strip_max_m
    import outcore.gemm.plan as plan_mod
    if args.max_strips:
        plan_mod.MAX_STRIPS = args.max_strips
        if args.max_strips > 4:
            plan_mod.MIN_STRIP = dict(plan_mod.MIN_STRIP, cuda=256)
    if args.small_shared_tiles:
        plan_mod.SHARED_LONE_TILES = False
    if args.accs:
        plan_mod.LONE_ACCS = args.accs
    import outcore.gemm.model as model_mod
    if args.d2h_rows:
        model_mod.D2H_ROWS = args.d2h_rows == "on"
    if args.d2h_table:
        model_mod.D2H_ROW_FACTOR = tuple((int(kib) << 10, float(f)) for kib, f in
                                         (x.split(":") for x in args.d2h_table.split(",")))
    import outcore.gemm.loads as loads_mod
    import outcore.gemm.worker as worker_mod
    import outcore.gemm.arena as arena_mod
    if args.eager_pieces:
        loads_mod.LAZY_PIECES = False
    if args.torch_stream_ctx:
        worker_mod.LIGHT_STREAM_CTX = False
    import outcore.gemm.split as split_mod
    if args.x3_chunk is not None:
        split_mod.BIG_CHUNK = args.x3_chunk
    global FORCED_TILE
    if args.tile:
        FORCED_TILE = tuple(int(x) for x in args.tile.split(","))
    t_start = time.perf_counter()
    n_gpu = 0 if args.smoke else min(args.gpus or torch.cuda.device_count(),
                                     torch.cuda.device_count())
    if n_gpu == 0 and not args.smoke:
        print("bench/gemm.py: no CUDA GPU here; use --smoke for the CPU check", file=sys.stderr)
        return 2
    devices = [torch.device("cpu")] * max(2, args.gpus or 2) if args.smoke else \
        [torch.device("cuda", i) for i in range(n_gpu)]
    env = Env(args.smoke, args.runs, t_start + args.budget_s, devices, with_cpu=args.with_cpu,
              tf32x3=not args.no_tf32x3, strassen=not args.no_strassen)
    gpus = [torch.cuda.get_device_name(d) for d in devices] if n_gpu else ["cpu"]
    slug = "h200" if "H200" in gpus[0] else gpus[0].lower().replace(" ", "-")
    machine = "cpu-smoke" if args.smoke else f"nvidia-{slug}" + (f"-x{n_gpu}" if n_gpu >= 2
                                                                  else "")
    out_path = common.out_path(args.out, os.path.join("/tmp/outcore-bench", "gemm-smoke.json")
                               if args.smoke else
                               os.path.join(HERE, "results", f"gemm-{slug}"
                                            f"{f'x{n_gpu}' if n_gpu >= 2 else ''}.json"))
    cases = (multi_cases(args.smoke, n_gpu) if n_gpu >= 2 else []) + (
        [] if n_gpu >= 2 else square_cases(args.smoke) + train_cases(args.smoke))
    if args.smoke:
        cases = square_cases(True) + train_cases(True) + multi_cases(True, len(devices))
    if args.cases:
        keep = set(args.cases.split(","))
        cases = [c for c in cases if c.name in keep]
        if not cases:
            print(f"bench/gemm.py: no case named {args.cases}", file=sys.stderr)
            return 2
        env.keep = keep
    numel = max(max(c.m * c.k, c.k * c.n, c.m * c.n) for c in cases)
    t0 = time.perf_counter()
    env.bufs = [torch.empty(numel) for _ in range(3)]
    for i, b in enumerate(env.bufs):
        fill_(b, salt=i)
    # page-locked once (cudaHostRegister in place; a small buffer comes back as a pinned
    # copy, so keep what pin_ returns; no-op without CUDA)
    env.bufs = [pin_(b) for b in env.bufs]
    print(f"host matrices: 3 x {numel * 4 / 2**30:.1f} GiB pinned and filled in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    env.bw = measure_bandwidth(env)
    print("bandwidth GB/s: " + ", ".join(f"{k} {v:.1f}" if v else f"{k} -"
                                         for k, v in env.bw.items()), flush=True)
    rows: list = []
    dropped: list = []
    with tqdm(total=0, unit="case", desc="gemm bench") as bar:
        if not args.smoke and n_gpu >= 2:
            multi_gpus(env, rows, bar)
        else:
            if args.smoke:
                env.devices = [devices[0]]
            one_gpu(env, rows, dropped, not args.no_train, bar)
            if args.smoke:
                env.devices = devices
                multi_gpus(env, rows, bar)
    commit = common.git_commit()
    result = {
        "benchmark": "gemm", "command": "python3 " + " ".join(sys.argv), "commit": commit,
        "machine": machine, "gpus": gpus, "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bandwidth_gbps": env.bw, "budget_s": args.budget_s, "flat_tiles": not args.square_tiles,
        "a_rows": list(lone.A_ROWS), "b_rows": list(lone.B_ROWS),
        "b_rows_min_k": lone.B_ROWS_MIN_K, "tall_ta": list(lone.TALL_TA),
        "tall_ta_min_m": lone.TALL_TA_MIN_M, "flat_sides": list(lone.FLAT_SIDES),
        "strip_rows": list(lone.STRIP_ROWS), "short_strip": lone.SHORT_STRIP,
        "short_strip_max_m": lone.SHORT_STRIP_MAX_M,
        "lone_accs": plan_mod.LONE_ACCS, "d2h_rows": model_mod.D2H_ROWS,
        "d2h_row_factor": [list(x) for x in model_mod.D2H_ROW_FACTOR],
        "x3_big_chunk": split_mod.BIG_CHUNK, "lazy_pieces": loads_mod.LAZY_PIECES,
        "light_stream_ctx": worker_mod.LIGHT_STREAM_CTX,
        "reuse_streams": worker_mod.REUSE_STREAMS, "skip_snapshot": arena_mod.SKIP_SNAPSHOT,
        "forced_tile": list(FORCED_TILE) if FORCED_TILE else None,
        "elapsed_s": time.perf_counter() - t_start, "dropped": dropped,
        "notes": ["host matrices are float32 and pinned (cudaHostRegister) in every case; "
                  "the case prefix / compute field names the arithmetic",
                  "wall_s is the median of the timed runs after one warm-up; outcore and "
                  "cublasxt times are end to end (host to host)",
                  "A, B and C: uniform [-1, 1), " + ("every element drawn (on the GPU)"
                  if torch.cuda.is_available() else "a 2**24-element random head repeated")],
        "runs": rows}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path + ".tmp", "w") as f:   # a temporary name, then a rename: a reader
        json.dump(result, f, indent=1, default=str)   # never sees half a file
    os.replace(out_path + ".tmp", out_path)
    print_table(rows)
    print(f"wrote {out_path} ({len(rows)} rows, {result['elapsed_s']:.0f} s)")
    return 0


def print_table(rows: list) -> None:
    by: dict = {}
    for r in rows:
        by.setdefault(r["case"], {})[r["system"]] = r
    systems = ["outcore", "cublasxt", "torch-incore", "bound"]
    for extra in ("outcore-strassen", "outcore-tf32x3", "outcore+cpu"):
        if any(r["system"] == extra for r in rows):
            systems.insert(1, extra)
    print(f"\n{'case':34s}" + "".join(f"{s:>14s}" for s in systems) + f"{'out/bound':>11s}"
          f"{'out/xt':>8s}   (TFLOP/s)")
    for case, r in by.items():
        vals = {s: r.get(s, {}).get("tflops") for s in systems}
        cells = "".join(f"{v:14.2f}" if v is not None else f"{'-':>14s}" for v in vals.values())
        ratio = lambda a, b: f"{a / b:.2f}" if a is not None and b else "-"
        print(f"{case:34s}{cells}{ratio(vals['outcore'], vals['bound']):>11s}"
              f"{ratio(vals['outcore'], vals['cublasxt']):>8s}")
    print_errors(by, rows)


def print_errors(by: dict, rows: list) -> None:
    """Per fp32 case: the opt-in computes' speed against cuBLASXt and every row's error."""
    x3 = [r for r in rows if r["system"] in ("outcore-tf32x3", "outcore-strassen")
          and r.get("tflops")]
    if x3:
        print(f"\n{'case':34s}{'x3 in-core':>11s}{'vs xt':>7s}  largest error / sum|a||b| "
              "over the same entries: outcore fp32, tf32x3, strassen, cublasxt")
        for r in x3:
            got = by[r["case"]]
            xt, inc = got.get("cublasxt", {}), got.get("torch-incore-tf32x3", {})
            errs = [got.get(s, {}).get("check_rel_error") for s in
                    ("outcore", "outcore-tf32x3", "outcore-strassen", "cublasxt")]
            print(f"{r['case'] + ' ' + r['system'][8:]:34s}"
                  + (f"{inc['tflops']:11.2f}" if inc.get("tflops") and "x3" in r["system"]
                                        else f"{'-':>11s}")
                  + (f"{r['tflops'] / xt['tflops']:7.2f}" if xt.get("tflops") else f"{'-':>7s}")
                  + "  " + "  ".join(f"{e:.2e}" if e is not None else "-" for e in errs))


if __name__ == "__main__":
    sys.exit(main())
