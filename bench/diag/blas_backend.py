"""Does cuBLASLt multiply the out-of-core GEMM's tiles faster than cuBLAS? (one GPU)

    PYTHONPATH=src python3 bench/diag/blas_backend.py        # about 1 min on one H200

torch sends torch.mm and addmm to cuBLAS by default; with
torch.backends.cuda.preferred_blas_library("cublaslt") they go to cuBLASLt, whose
heuristics may choose other kernels. fp32-16384's tiles run cuBLAS's SGEMM at 51-52
TFLOP/s (gemm-probe-h200.json), and 1.2x cuBLASXt needs about 2% more.

For each backend: the in-core rate of the tile shapes the workers run (acc += a @ b,
median of 5, and the kernel's name from the profiler); then outcore.matmul on the square
cases from pinned host matrices (median of 5 after a warm-up); cuBLASXt at fp32-16384 in
the same run for the ratio. Writes bench/results/blas-backend-<machine>.json; a table last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from gemm import fill_, median_s  # noqa: E402

from outcore.gemm.cublasxt import CublasXt  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.gemm.mmacc import mm_acc  # noqa: E402
from outcore.memory import pin_  # noqa: E402

BACKENDS = ("cublas", "cublaslt")
KERNELS = ([("fp32", s) for s in ((4096, 4096, 16384), (8192, 8192, 16384),
                                  (8192, 16384, 16384), (16384, 16384, 16384),
                                  (8192, 8192, 2048), (2048, 8192, 16384))]
           + [(c, s) for c in ("tf32", "bf16") for s in ((2048, 32768, 8192),
                                                       (2048, 32768, 32768))])
SQUARE = [("fp32", 16384), ("fp32", 32768), ("tf32", 32768), ("bf16", 32768)]


def precision(compute: str) -> None:
    torch.set_float32_matmul_precision("high" if compute == "tf32" else "highest")


def kernel_name(fn) -> str:
    """The longest-running CUDA kernel of one call of fn."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()   # host sync: the kernel is in the trace
    evs = [e for e in prof.key_averages() if e.device_time_total > 0]
    return max(evs, key=lambda e: e.device_time_total).key[:90] if evs else "?"


def kernel_rows(backend: str, runs: int) -> list[dict]:
    rows = []
    for compute, (m, n, k) in KERNELS:
        precision(compute)
        dt = torch.bfloat16 if compute == "bf16" else torch.float32
        a = torch.randn(m, k, device="cuda").to(dt)
        b = torch.randn(k, n, device="cuda").to(dt)
        acc = torch.zeros(m, n, device="cuda")

        def fn():
            mm_acc(acc, a, b, 1.0, 1.0)
        row = {"kind": "kernel", "backend": backend, "compute": compute, "m": m, "n": n,
               "k": k, "tflops": None}
        try:
            fn()
            fn()
            t = statistics.median(median_s(fn, runs, torch.cuda.synchronize))
            row.update(seconds=t, tflops=2.0 * m * n * k / t / 1e12, kernel=kernel_name(fn))
            print(f"{backend} {compute} {m}x{n}x{k}: {row['tflops']:.1f} TFLOP/s "
                  f"[{row['kernel']}]", flush=True)
        except RuntimeError as e:   # a backend without this GEMM: say so, go on
            row["error"] = str(e).splitlines()[0][:200]
            print(f"{backend} {compute} {m}x{n}x{k}: {row['error']}", flush=True)
        rows.append(row)
        a = b = acc = None   # buffer release: free this shape before the next one
        torch.cuda.empty_cache()
    precision("fp32")
    return rows


def outcore_rows(backend: str, bufs, runs: int, cases) -> list[dict]:
    rows = []
    for compute, n in cases:
        A, B, C = (x[:n * n].view(n, n) for x in bufs)
        st = []

        def once():
            st.append(matmul(A, B, C, compute=compute, return_stats=True)[1])
        once()   # warm-up: buffers, handles, the plan
        times = median_s(once, runs, lambda: None)   # matmul returns when C is on the host
        t = statistics.median(times)
        rows.append({"kind": "outcore", "backend": backend, "case": f"{compute}-{n}",
                     "wall_s": t, "runs_s": times, "tflops": 2.0 * n ** 3 / t / 1e12,
                     "plan": st[-1].plan})
        print(f"{backend} outcore {compute}-{n}: {t * 1e3:.1f} ms "
              f"{rows[-1]['tflops']:.1f} TFLOP/s (runs {[round(x * 1e3, 1) for x in times]})",
              flush=True)
        torch.cuda.empty_cache()
    return rows


def cublasxt_row(bufs, n: int = 16384) -> dict:
    A, B, C = (x[:n * n].view(n, n) for x in bufs)
    best = None
    for bd in (2048, 4096, 8192):
        xt = CublasXt([0], block_dim=bd)
        try:
            xt.gemm(A, B, C)   # warm-up
            times = median_s(lambda: xt.gemm(A, B, C), 3, lambda: None)
        finally:
            xt.close()
        t = statistics.median(times)
        if best is None or t < best["wall_s"]:
            best = {"kind": "cublasxt", "case": f"fp32-{n}", "block_dim": bd, "wall_s": t,
                    "runs_s": times, "tflops": 2.0 * n ** 3 / t / 1e12}
    print(f"cublasxt fp32-{n}: {best['wall_s'] * 1e3:.1f} ms {best['tflops']:.1f} TFLOP/s "
          f"(block {best['block_dim']})", flush=True)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-square", action="store_true", help="the kernels only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/diag/blas_backend.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("blas-backend")
    before = torch.backends.cuda.preferred_blas_library()
    doc["default_backend"] = str(before)
    bufs = []
    if not args.no_square:
        n = max(s for _, s in SQUARE)
        bufs = [torch.empty(n * n) for _ in range(3)]
        for x in bufs:
            fill_(x)
        bufs = [pin_(x) for x in bufs]   # pinned once, as in bench/gemm.py
    try:
        for backend in BACKENDS:
            torch.backends.cuda.preferred_blas_library(backend)
            doc["runs"] += kernel_rows(backend, args.runs)
        for backend in BACKENDS if bufs else ():
            torch.backends.cuda.preferred_blas_library(backend)
            doc["runs"] += outcore_rows(backend, bufs, args.runs, SQUARE)
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    if bufs:
        torch.cuda.empty_cache()   # cuBLASXt allocates outside torch
        doc["runs"].append(cublasxt_row(bufs))
    common.write(doc, f"blas-backend-{common.machine_name()}")
    print(common.table([r for r in doc["runs"] if r["kind"] == "kernel"],
                       ["backend", "compute", "m", "n", "k", "tflops", "kernel"]))
    print(common.table([r for r in doc["runs"] if r["kind"] != "kernel"],
                       ["kind", "backend", "case", "tflops", "wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
