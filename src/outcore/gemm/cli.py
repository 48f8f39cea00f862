"""`outcore gemm`: one out-of-core product on random data, checked and timed.

    outcore gemm --m 32768 --n 32768 --k 32768 --compute bf16 --gpu-memory 8GiB
    outcore gemm --m 65536 --n 65536 --k 65536 --memmap /scratch/gemm    # larger than RAM

Prints TFLOP/s, the bytes that crossed to and from the devices (and the minimum that had
to), and checks sampled entries of the result against float64 dot products.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from ..errors import OutcoreError
from ..memory import pin_, unpin_
from ..planner import host_available
from ..units import fmt_bytes
from .matmul import matmul
from .computes import COMPUTE, DEFAULT_COMPUTE

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
# allowed error, relative to sum_k |alpha a_ik b_kj| + |beta c_ij|
TOLERANCE = {"fp64": 1e-10, "fp32": 1e-4, "tf32": 4e-3, "tf32x3": 1e-4, "bf16": 2e-2,
             "strassen": 1e-4}


def register(sub) -> None:
    """Add the `gemm` subcommand to an argparse subparsers object."""
    p = sub.add_parser("gemm", help="one out-of-core matrix product on random host data: "
                       "TFLOP/s, bytes moved, sampled check against float64",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=8192, help="rows of op(A) and C (default 8192)")
    p.add_argument("--n", type=int, default=8192, help="columns of op(B) and C (default 8192)")
    p.add_argument("--k", type=int, default=8192, help="inner size (default 8192)")
    p.add_argument("--dtype", choices=list(_DTYPES), default="float32",
                   help="dtype of the host matrices (default float32)")
    p.add_argument("--compute", choices=list(COMPUTE), default=None,
                   help="arithmetic (default: the dtype's own; bf16/tf32 accumulate in fp32; "
                   "tf32x3: three TF32 GEMMs of split operands, near fp32's error where sums mix "
                   "signs, about 3x it where a sum's terms share one sign: outcore.gemm.split; "
                   "strassen: the dtype's own arithmetic, one Strassen-Winograd level, 7 GEMMs "
                   "of 8, a norm-wise error bound: outcore.gemm.strassen)")
    p.add_argument("--devices", default=None,
                   help="'0,1', 'cuda:0', 'cpu' ... (default: every GPU, else the CPU)")
    p.add_argument("--gpu-memory", default=None, help="per-device budget, e.g. 8GiB "
                   "(default: the free memory less 1 GiB)")
    p.add_argument("--layout", choices=["NN", "NT", "TN", "TT"], default="NN",
                   help="transposes of A and B as stored (default NN)")
    p.add_argument("--tile", type=int, default=None, help="C tile size (default: planned)")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--memmap", metavar="DIR", default=None,
                   help="keep A, B and C in files in DIR (numpy memmaps) instead of RAM")
    p.add_argument("--no-pin", action="store_true",
                   help="leave host matrices pageable (default: page-lock them with CUDA)")
    p.add_argument("--repeat", type=int, default=4,
                   help="products run (default 4); from 2 on, the first is a warm-up (kernel "
                        "picks, allocations, the plan) and the median of the rest is reported")
    p.add_argument("--check", type=int, default=64, help="entries checked (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def _random(shape, dtype: torch.dtype, gen: torch.Generator, path: str | None):
    """Uniform [-1, 1) host matrix: a torch tensor, or a memmap file at `path`."""
    if path is None:
        return torch.empty(shape, dtype=dtype).uniform_(-1, 1, generator=gen)
    npdt = np.float32 if dtype == torch.float32 else np.float64
    mm = np.memmap(path, dtype=npdt, mode="w+", shape=shape)
    rng = np.random.default_rng(int(torch.randint(1 << 30, (1,), generator=gen)))
    step = max(1, (64 << 20) // max(1, shape[1] * mm.itemsize))
    for r in range(0, shape[0], step):
        mm[r:r + step] = rng.random((min(step, shape[0] - r), shape[1]), dtype=npdt) * 2 - 1
    return mm


def _as64(x, rows, cols) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return np.asarray(x[rows][:, cols], dtype=np.float64)
    return x[rows][:, cols].to(torch.float64).numpy()


CHECK_CHUNK = 64   # sampled entries whose rows and columns are gathered at once


def check_sampled(A, B, C, c0, idx, ta: bool, tb: bool, alpha: float, beta: float,
                  compute: str, stored: str | None = None):
    """(largest error, largest error / tolerance) over the sampled entries (i, j) of C; a
    non-finite entry counts as an infinite error.

    The tolerance is the compute's, or the stored dtype's arithmetic's where that is the
    coarser (`stored`: fp32 data multiplied in fp64 still rounds its result to fp32).

    The rows of op(A) and columns of op(B) of CHECK_CHUNK entries are gathered in one
    indexing each (one pass over a memmap's pages, not one per entry: a column of a
    16384^2 matrix gathered alone took 12 ms on the development CPU)."""
    tol = max(TOLERANCE[compute], TOLERANCE[stored] if stored else 0.0)
    worst = ratio = 0.0
    for s in range(0, len(idx), CHECK_CHUNK):
        ii = [int(i) for i, _ in idx[s:s + CHECK_CHUNK]]
        jj = [int(j) for _, j in idx[s:s + CHECK_CHUNK]]
        a = _as64(A, slice(None), ii).T if ta else _as64(A, ii, slice(None))   # n x K
        b = _as64(B, jj, slice(None)) if tb else _as64(B, slice(None), jj).T   # n x K
        c_init = np.asarray(c0[s:s + CHECK_CHUNK], dtype=np.float64)
        ref = alpha * np.einsum("nk,nk->n", a, b) + beta * c_init
        scale = abs(alpha) * np.einsum("nk,nk->n", np.abs(a), np.abs(b)) + np.abs(beta * c_init)
        got = np.array([float(_as64(C, [i], [j])[0, 0]) for i, j in zip(ii, jj)])
        # nan -> inf: max() would pass a NaN over (max(0.0, nan) is 0.0)
        err = np.nan_to_num(np.abs(got - ref), nan=np.inf)
        worst = max(worst, float(err.max()))
        ratio = max(ratio, float((err / (tol * scale + 1e-300)).max()))
    return worst, ratio


def run(args) -> int:
    """Run `outcore gemm`; 0 when the sampled check passes, 1 when it fails, 2 on bad input."""
    try:
        return _run(args)
    except (OutcoreError, TypeError, OSError) as e:
        from ..cli import as_flags   # matmul's tile=... as --tile ...
        print(f"outcore gemm: error: {as_flags(str(e), getattr(args, 'flag_names', {}))}",
              file=sys.stderr)
        return 2


def _run(args) -> int:
    m, n, k = args.m, args.n, args.k
    if min(m, n, k) <= 0:
        raise OutcoreError(f"--m {m} --n {n} --k {k}: all three sizes must be positive")
    if args.check < 0 or args.repeat < 1:
        raise OutcoreError(f"--check {args.check} --repeat {args.repeat}: --check must be >= 0 "
                           "and --repeat >= 1")
    if not (math.isfinite(args.alpha) and math.isfinite(args.beta)):
        raise OutcoreError(f"--alpha {args.alpha} --beta {args.beta}: both must be finite")
    if args.memmap and os.path.exists(args.memmap) and not os.path.isdir(args.memmap):
        raise OutcoreError(f"--memmap {args.memmap} is a file: give a directory for A, B and C")
    if args.memmap and args.dtype == "bfloat16":
        raise OutcoreError("--memmap stores numpy files, which have no bfloat16: use "
                           "--dtype float32 or float64")
    dtype = _DTYPES[args.dtype]
    need = (m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size()
    room = None if args.memmap else host_available()
    if room is not None and need > room:
        raise OutcoreError(f"A, B and C need {fmt_bytes(need)} of host memory but "
                           f"{fmt_bytes(room)} is available: use smaller --m/--n/--k, or "
                           "--memmap DIR to keep them in files")
    ta, tb = args.layout[0] == "T", args.layout[1] == "T"
    gen = torch.Generator().manual_seed(args.seed)
    if args.memmap:
        os.makedirs(args.memmap, exist_ok=True)
    path = (lambda s: os.path.join(args.memmap, s)) if args.memmap else (lambda s: None)
    t0 = time.perf_counter()
    A = _random((k, m) if ta else (m, k), dtype, gen, path("a.bin"))
    B = _random((n, k) if tb else (k, n), dtype, gen, path("b.bin"))
    C = _random((m, n), dtype, gen, path("c.bin"))
    pinned, locked = [], []
    if torch.cuda.is_available() and not args.no_pin and not args.memmap:
        # pin_ registers large tensors in place and returns a pinned copy of small ones:
        # use what it returns, and unregister only what it registered
        locked = [pin_(x) for x in (A, B, C)]
        pinned = [y for x, y in zip((A, B, C), locked) if y is x]
        A, B, C = locked
    print(f"data: A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)} {args.dtype}"
          f"{' in ' + args.memmap if args.memmap else ''}{', pinned' if locked else ''}, "
          f"ready in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(args.seed + 1)
    idx = list(zip(rng.integers(0, m, args.check), rng.integers(0, n, args.check)))
    c0 = [float(_as64(C, [i], [j])[0, 0]) for i, j in idx]
    runs = []
    try:
        for r in range(max(1, args.repeat)):
            if r:
                for (i, j), v in zip(idx, c0):  # beta reads C: restore the sampled entries
                    C[i, j] = v
            _, st = matmul(A, B, C, transa=ta, transb=tb, alpha=args.alpha, beta=args.beta,
                           devices=args.devices, gpu_memory=args.gpu_memory, tile=args.tile,
                           compute=args.compute, progress=True, return_stats=True)
            runs.append(st)
    finally:
        for x in pinned:
            unpin_(x)
    # the first product pays one-time costs (CUDA's and cuBLASLt's set-up, the kernel picked
    # by measurement, the arena, the plan's search): a warm-up whenever another follows
    timed = sorted(runs[1:] or runs, key=lambda st: st.wall_s)
    shown = timed[len(timed) // 2]    # the median (the slower middle one of an even count)
    if len(runs) > 1:
        print(f"first product {runs[0].wall_s:.3f} s (warm-up); median of the {len(timed)} "
              f"after it {shown.wall_s:.3f} s (" + ", ".join(f"{st.wall_s:.3f}" for st in
                                                         runs[1:]) + ")")
    else:
        print(f"one product, {shown.wall_s:.3f} s, one-time set-up included (--repeat 4 "
              f"reports the median after a warm-up)")
    worst, ratio = check_sampled(A, B, C, c0, idx, ta, tb, args.alpha, args.beta, shown.compute,
                                 stored=DEFAULT_COMPUTE[dtype])
    es = torch.empty((), dtype=dtype).element_size()
    min_in = (m * k + k * n + (m * n if args.beta else 0)) * es
    print(shown.summary())
    print(f"{shown.tflops:.2f} TFLOP/s; moved {fmt_bytes(shown.h2d_bytes)} to the devices "
          f"(minimum {fmt_bytes(min_in)}) and {fmt_bytes(shown.d2h_bytes)} back "
          f"(minimum {fmt_bytes(m * n * es)})")
    ok = ratio <= 1.0
    print(f"check: {len(idx)} sampled entries against float64, max error {worst:.3g}, at most "
          f"{ratio:.2g} of the tolerance ({shown.compute} arithmetic, {args.dtype} stored): "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1
