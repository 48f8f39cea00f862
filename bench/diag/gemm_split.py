"""Do bf16 / tf32 GEMMs of a whole-width strip run faster cut into column chunks? (GPU)

    PYTHONPATH=src python3 bench/diag/gemm_split.py        # about a minute on one H200

bf16-32768 and tf32-32768 run in whole-width strips (2048 x 32768 C tiles); once all of B
has landed, bf16's strips compute for 88 ms (session 16's timeline), longer than A's
copies in beside them. On the H200 a bf16 2048 x 32768 x 32768 GEMM ran at 689-757
TFLOP/s in four probes and a 4096 x 16384 x 32768 one at 773. This times
  - in-core kernels, acc += a @ b as gemm/mmacc.py runs them, each shape whole and in
    column chunks (mmacc.COL_CHUNK: strided views, no copies), median of 7;
  - the whole products through outcore.matmul on pinned host matrices, chunks off and on,
    in alternating rounds (runs of one call sit closer together than runs of different
    calls), each product's sample rows checked against float64.
Writes bench/results/gemm-split-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from gemm import fill_, median_s  # noqa: E402

from outcore.gemm import matmul, mmacc  # noqa: E402
from outcore.memory import pin_  # noqa: E402

N = 32768
SHAPES = [(2048, N, N), (2048, N, 8192), (4096, N, N), (4096, 16384, N)]
CHUNKS = [0, 16384, 8192]
ROUNDS, RUNS = 4, 3
DTYPES = {"bf16": (torch.bfloat16,), "tf32": (torch.bfloat16, torch.float32)}


def _median(fn, runs: int) -> float:
    """Median seconds of fn() over `runs` runs, the device synchronized around each."""
    return statistics.median(median_s(fn, runs, torch.cuda.synchronize))


def kernels(compute: str) -> list[dict]:
    dt = torch.bfloat16 if compute == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = compute == "tf32"
    mmacc.COL_CHUNK_DTYPES = DTYPES[compute]
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").to(dt)
        b = torch.randn(k, n, device="cuda").to(dt)
        acc = torch.zeros(m, n, device="cuda")
        for chunk in CHUNKS:
            if chunk and chunk >= n:
                continue
            mmacc.COL_CHUNK = chunk

            def fn(acc=acc, a=a, b=b):
                mmacc.mm_acc(acc, a, b, 1.0, 1.0)
            fn()
            t = _median(fn, 7)
            rows.append({"what": "kernel", "compute": compute, "shape": f"{m}x{n}x{k}",
                         "chunk": chunk, "seconds": t, "tflops": 2.0 * m * n * k / t / 1e12})
            print(rows[-1], flush=True)
        a = b = acc = None   # free the device memory before the next shape
    mmacc.COL_CHUNK = 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.empty_cache()
    return rows


def sample_error(C, A, B, compute: str) -> float:
    """Largest |C - ref| / max|ref| over 4 rows, ref in float64 of the rounded inputs."""
    idx = torch.tensor([0, 4097, 20000, N - 1])
    a = A[idx].cuda()
    b = B.cuda() if compute != "bf16" else B.cuda().to(torch.bfloat16)
    a = a.to(torch.bfloat16) if compute == "bf16" else a
    ref = a.double() @ b.double()
    del b
    err = ((C[idx].cuda().double() - ref).abs().max() / ref.abs().max()).item()
    torch.cuda.empty_cache()
    return err


def products(compute: str, A, B, C) -> list[dict]:
    mmacc.COL_CHUNK_DTYPES = DTYPES[compute]
    flops = 2.0 * N ** 3
    rows = []
    times: dict = {c: [] for c in CHUNKS[:2]}
    for rnd in range(ROUNDS):
        for chunk in (CHUNKS[:2] if rnd % 2 == 0 else CHUNKS[1::-1]):
            mmacc.COL_CHUNK = chunk
            fn = lambda: matmul(A, B, out=C, compute=compute)   # noqa: E731
            if rnd == 0:
                fn()   # warm-up (plan, arena)
            t = _median(fn, RUNS)
            times[chunk].append(t)
            rows.append({"what": "product", "compute": compute, "chunk": chunk,
                         "round": rnd, "seconds": t, "tflops": flops / t / 1e12})
            print(rows[-1], flush=True)
        if rnd == 0:
            rows[-1]["rel_err"] = sample_error(C, A, B, compute)
            rows[-2]["rel_err"] = rows[-1]["rel_err"]   # the same C rows, the other run's
    mmacc.COL_CHUNK = 0
    for chunk, ts in times.items():
        t = statistics.median(ts)
        rows.append({"what": "product median", "compute": compute, "chunk": chunk,
                     "seconds": t, "tflops": flops / t / 1e12})
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/gemm_split.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("gemm-split")
    rows = kernels("bf16") + kernels("tf32")
    A, B, C = (pin_(torch.empty(N, N)) for _ in range(3))
    fill_(A.view(-1))
    fill_(B.view(-1)[1:])   # B's values shifted against A's
    B.view(-1)[0] = 0.5
    for compute in ("bf16", "tf32"):
        rows += products(compute, A, B, C)
    doc["runs"] = rows
    common.write(doc, f"gemm-split-{common.machine_name()}")
    print(common.table(rows, ["what", "compute", "shape", "chunk", "round", "seconds",
                              "tflops", "rel_err"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
