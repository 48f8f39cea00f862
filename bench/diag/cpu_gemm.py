"""How fast does the GPU machine's host CPU multiply? (any machine; a GPU is not used)

    PYTHONPATH=src python3 bench/diag/cpu_gemm.py          # about 30 s on 16 cores

A CPU worker next to the GPUs (`outcore.matmul(devices="0,cpu")`) can only help where it
multiplies a useful share of the product in the GPU's time: fp32-16384 runs about 176 ms
on one H200 at about 50 TFLOP/s, so a CPU at 1.5 TFLOP/s would take about 3% of it. This
times torch.mm on the host for row bands of the square benchmark products (R x 16384 @
16384 x 16384 and R x 32768 @ 32768 x 32768), fp32 and fp64, with all the cores' threads
and with two fewer (one for each GPU worker's host thread, one spare). Median of 3 after
one warm-up. Writes bench/results/cpu-gemm-<machine>.json and prints a table last.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

# (dtype, rows, k = n)
SHAPES = [(torch.float32, 256, 16384), (torch.float32, 512, 16384),
          (torch.float32, 256, 32768), (torch.float64, 256, 16384)]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def time_mm(dtype, rows: int, kn: int, threads: int, runs: int = 3) -> float:
    """Median seconds of one rows x kn @ kn x kn product on the host with `threads`."""
    torch.set_num_threads(threads)
    a = torch.randn(rows, kn, dtype=dtype)
    b = torch.randn(kn, kn, dtype=dtype)
    c = torch.empty(rows, kn, dtype=dtype)
    torch.mm(a, b, out=c)                      # warm-up: the thread pool and packing buffers
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shrink", type=int, default=1,
                    help="divide k = n by this (a quick look on a slow machine)")
    args = ap.parse_args()
    doc = common.header("cpu-gemm")
    cores = os.cpu_count() or 1
    doc.update(cpu_model=cpu_model(), torch_threads=torch.get_num_threads(),
               parallel_info=torch.__config__.parallel_info().splitlines()[:6])
    threads = sorted({cores, max(1, cores - 2), max(1, cores // 2)}, reverse=True)
    for dtype, rows, kn in SHAPES:
        for th in threads:
            s = time_mm(dtype, rows, kn // args.shrink, th)
            doc["runs"].append({"dtype": str(dtype).removeprefix("torch."), "rows": rows,
                                "k": kn // args.shrink, "n": kn // args.shrink, "threads": th, "seconds": s,
                                "tflops": 2 * rows * (kn // args.shrink) ** 2 / s / 1e12})
    path = common.write(doc, f"cpu-gemm-{common.machine_name()}")
    print(f"{doc['cpu_model']}, {cores} CPUs, torch threads {doc['torch_threads']}; {path}")
    print(common.table(doc["runs"], ["dtype", "rows", "k", "threads", "seconds", "tflops"]))


if __name__ == "__main__":
    main()
