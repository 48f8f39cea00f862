"""Do two tile GEMMs at once, on two streams, run faster than one after the other? (GPU)

    PYTHONPATH=src python3 bench/diag/gemm_streams.py        # under a minute on one H200

The out-of-core GEMM runs its tiles' GEMMs one after the other on one compute stream. In
session 11's probe a 4096 x 4096 x 16384 fp32 tile ran at 51.3 TFLOP/s against 52.8-54.0
for the whole 16384^3 product in-core: a tile has few waves of thread blocks, and the last
one leaves SMs idle. This times, for each (compute, m, n, k) of SHAPES, two such GEMMs
(acc += a @ b, each into its own accumulator, as gemm/mmacc.py runs them) one after the
other on one stream, and the same two at once on two streams; then the whole square
product of the case in one GEMM. Median of 5 after 2 warm-ups. Writes
bench/results/gemm-streams-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm.mmacc import mm_acc  # noqa: E402

# (compute, m, n, k): fp32-16384's and fp32-32768's tiles, tf32-32768's and bf16-32768's
SHAPES = [("fp32", 4096, 4096, 16384), ("fp32", 8192, 8192, 16384),
          ("fp32", 4096, 16384, 16384), ("fp32", 8192, 8192, 32768),
          ("tf32", 8192, 8192, 32768), ("tf32", 4096, 8192, 32768),
          ("bf16", 4096, 16384, 16384), ("bf16", 2048, 8192, 32768)]
WHOLE = [("fp32", 16384), ("fp32", 32768), ("tf32", 32768), ("bf16", 32768)]


def _operands(compute: str, m: int, n: int, k: int):
    dt = torch.bfloat16 if compute == "bf16" else torch.float32
    torch.set_float32_matmul_precision("high" if compute == "tf32" else "highest")
    a = torch.randn(m, k, device="cuda").to(dt)
    b = torch.randn(k, n, device="cuda").to(dt)
    return a, b


def _time(fn) -> float:
    """Median seconds of fn() over 5 runs after 2 warm-ups (device synchronized)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()   # the GEMMs are asynchronous: wait for them to time them
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def pair_rates(compute: str, m: int, n: int, k: int) -> dict:
    a, b = _operands(compute, m, n, k)
    accs = [torch.zeros(m, n, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    main = torch.cuda.current_stream()

    def serial():
        for acc in accs:
            mm_acc(acc, a, b, 1.0, 1.0)

    def parallel():
        for s, acc in zip(streams, accs):
            s.wait_stream(main)   # start after whatever the main stream has queued
            with torch.cuda.stream(s):
                mm_acc(acc, a, b, 1.0, 1.0)
        for s in streams:
            main.wait_stream(s)   # the timer's synchronize covers both streams anyway

    flops = 2 * 2.0 * m * n * k
    t1, t2 = _time(serial), _time(parallel)
    return {"compute": compute, "m": m, "n": n, "k": k, "one_stream_tflops": flops / t1 / 1e12,
            "two_streams_tflops": flops / t2 / 1e12, "gain": t1 / t2}


def whole_rate(compute: str, n: int) -> dict:
    a, b = _operands(compute, n, n, n)
    acc = torch.zeros(n, n, device="cuda")
    t = _time(lambda: mm_acc(acc, a, b, 1.0, 1.0))
    return {"compute": compute, "m": n, "n": n, "k": n,
            "one_stream_tflops": 2.0 * n ** 3 / t / 1e12}


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/gemm_streams.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("gemm-streams")
    doc["pairs"], doc["whole"] = [], []
    for shape in SHAPES:
        doc["pairs"].append(pair_rates(*shape))
        print(doc["pairs"][-1], flush=True)
        torch.cuda.empty_cache()
    for compute, n in WHOLE:
        doc["whole"].append(whole_rate(compute, n))
        print(doc["whole"][-1], flush=True)
        torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")
    common.write(doc, f"gemm-streams-{common.machine_name()}")
    print(common.table(doc["pairs"] + doc["whole"],
                       ["compute", "m", "n", "k", "one_stream_tflops", "two_streams_tflops",
                        "gain"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
