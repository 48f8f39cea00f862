"""Which fp32 GEMM shapes run at the in-core 16384^3 rate? Kernel rates on one GPU.

    PYTHONPATH=src python3 bench/diag/fp32_shapes.py        # about 30 s on one H200

bench/diag/fp32_overlap.py (session 20) found fp32-16384's GEMMs slower in pieces than as
one: one 16384^3 mm 163 ms, the planner's 4096^2 tiles 171, rank-d updates of all of C
(K outermost) 174, and copies running beside one mm cost it nothing. This times each
GEMM shape a schedule could be made of, operands already on the device: rate from CUDA
events over repeated calls (at least ~40 ms of work a sample), median of 5 samples, and
the name of the kernel cuBLAS picked (torch.profiler, one call). Writes
bench/results/fp32-shapes-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402

N = 16384
# (name, m, n, k, beta, A as a strided view of an N x N matrix)
SHAPES = [
    ("whole", N, N, N, 0, False),
    ("kpiece-4096", N, N, 4096, 0, False),
    ("kpiece-4096-strided", N, N, 4096, 0, True),
    ("kpiece-4096-acc", N, N, 4096, 1, True),
    ("kpiece-8192-acc", N, N, 8192, 1, True),
    ("kpiece-512-acc", N, N, 512, 1, True),
    ("kpiece-128-acc", N, N, 128, 1, True),
    ("tile-8192", 8192, 8192, N, 0, False),
    ("tile-4096", 4096, 4096, N, 0, False),
    ("tile-4096-k2048-acc", 4096, 4096, 2048, 1, True),
    ("rows-8192", 8192, N, N, 0, False),
    ("rows-4096", 4096, N, N, 0, False),
    ("rows-2048", 2048, N, N, 0, False),
    ("cols-4096", N, 4096, N, 0, False),
    ("cols-8192", N, 8192, N, 0, False),
    ("strip-512-k4096-acc", 512, N, 4096, 1, True),
    ("rows-4096-k4096-acc", 4096, N, 4096, 1, True),
    ("tile-8192-k4096-acc", 8192, 8192, 4096, 1, True),
]


def kernel_name(fn) -> str:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()   # host sync: the kernel is in the trace
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return max(set(names), key=len) if names else "?"


def per_call_s(fn, flops: float) -> tuple[float, int]:
    """Seconds per call of `fn` (a GEMM of `flops`), the median of 5 samples of repeated
    calls (about 40 ms of work each at 54 TFLOP/s) after a warm-up, and the repeats."""
    reps = max(1, int(40e-3 * 54e12 / flops))
    fn()
    torch.cuda.synchronize()   # host sync: the warm-up is done before timing
    samples = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()   # host sync: read the sample
        samples.append(s.elapsed_time(e) / 1e3 / reps)
    return statistics.median(samples), reps


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/fp32_shapes.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("fp32-shapes")
    torch.manual_seed(0)
    big_a, big_b = torch.randn(N, N, device="cuda"), torch.randn(N, N, device="cuda")
    out = torch.empty(N, N, device="cuda")
    rows = []
    for name, m, n, k, beta, strided in SHAPES:
        a = big_a[:m, :k] if strided else big_a.view(-1)[:m * k].view(m, k)
        b = big_b.view(-1)[:k * n].view(k, n)
        c = out.view(-1)[:m * n].view(m, n)

        def fn():
            if beta:
                c.addmm_(a, b)
            else:
                torch.mm(a, b, out=c)
        flops = 2.0 * m * n * k
        t, reps = per_call_s(fn, flops)
        rows.append({"shape": name, "m": m, "n": n, "k": k, "beta": beta, "strided_a": strided,
                     "seconds": t, "tflops": flops / t / 1e12, "reps": reps,
                     "kernel": kernel_name(fn)})
        print(rows[-1], flush=True)
    doc["runs"] = rows
    common.write(doc, f"fp32-shapes-{common.machine_name()}")
    print(common.table(rows, ["shape", "tflops", "kernel"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
