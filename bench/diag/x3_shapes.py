"""tf32x3's GEMM rate by tile shape, and its error on small tiles by BIG_CHUNK. (GPU)

    PYTHONPATH=src python3 bench/diag/x3_shapes.py        # about 60 s on one H200

Session 25's second fp32 run (gemm-h200-s25-x3b.json) had tf32x3 slower than fp32 at 16384
tokens and 8192 features: the planner, pricing tf32x3 at one flat rate, cut it into 512-row
strips, whose three GEMMs (the large one in 2048-deep calls) run far below the rate of
large tiles. Part 1 times split.mm_acc_split (acc += ..., operands already split on the
device) for tiles `ROWS` x `COLS` and merged runs `KS` deep: the rate the planner's model
(model.kernel_rate) should price, fitted below as peak x (1 - edge/rows - edge/cols) x
k / (k + depth). Part 2: the GPU test's product (1024 x 768 x 16384 in 512^2 tiles, K
blocks 4096), whose NT layout had tf32x3 at 3.7x the in-memory fp32 GEMM's error where the
large tiles of x3-accuracy-h200.json had 0.84x: the error by split.BIG_CHUNK and layout.
Writes bench/results/x3-shapes-<machine>.json (X3_SHAPES_TAG=T: -T.json), tables last;
the large term's calls are split.BIG_CHUNK deep (512 since session 26; 2048 in session
25's file).
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm import split as split_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.gemm.split import BIG_CHUNK, mm_acc_split  # noqa: E402
from outcore.memory import unpin_  # noqa: E402
from x3_accuracy import layout_operands  # noqa: E402  (bench/diag: this script's folder)

ROWS = (512, 1024, 2048, 4096, 8192)
COLS = (4096, 8192, 16384)
KS = (2048, 4096, 16384)
CHUNKS = (2048, 1024, 512)


def rate(rows: int, cols: int, k: int, ops) -> float:
    """FLOP/s of acc += a @ b through mm_acc_split, from CUDA events, median of 5 samples
    of at least ~30 ms of work."""
    ah, al, bh, bl, acc = ops
    args = (acc[:rows, :cols], ah[:rows, :k], al[:rows, :k], bh[:k, :cols], bl[:k, :cols])
    flop = 2.0 * rows * cols * k
    reps = max(1, int(30e-3 * 110e12 / flop))
    mm_acc_split(*args, 1.0, 1.0)
    samples = []
    for _ in range(5):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(reps):
            mm_acc_split(*args, 1.0, 1.0)
        t1.record()
        t1.synchronize()      # host sync: the sample's kernels are done before it is read
        samples.append(flop * reps / (t0.elapsed_time(t1) / 1e3))
    return statistics.median(samples)


def fit(rows: list[dict]) -> dict:
    """Least squares (relative) of peak, edge and depth over a grid."""
    best = None
    for edge in range(0, 801, 10):
        for depth in range(0, 4001, 50):
            shape = [max(0.5, 1 - edge / r["rows"] - edge / r["cols"]) * r["k"] /
                     (r["k"] + depth) for r in rows]
            peak = statistics.median(r["tflops"] / s for r, s in zip(rows, shape))
            err = [abs(peak * s / r["tflops"] - 1) for r, s in zip(rows, shape)]
            score = sum(e * e for e in err)
            if best is None or score < best["score"]:
                best = {"peak_tflops": peak, "edge": edge, "depth": depth, "score": score,
                        "max_rel_dev": max(err)}
    return best


def accuracy() -> list[dict]:
    out = []
    g = torch.Generator().manual_seed(7)
    m, n, k = 1024, 768, 16384
    for layout in ("NN", "NT", "TN"):
        ta, tb = layout[0] == "T", layout[1] == "T"
        A, B, oa, ob, ref, scale = layout_operands(m, n, k, layout, g)
        runs = {"sgemm-incore": lambda: oa @ ob,
                "outcore-fp32": lambda: matmul(A, B, transa=ta, transb=tb, devices=0,
                                               compute="fp32", tile=(512, 512, 4096))}
        for kc in CHUNKS:
            def run(kc=kc):
                split_mod.BIG_CHUNK = kc
                try:
                    return matmul(A, B, transa=ta, transb=tb, devices=0, compute="tf32x3",
                                  tile=(512, 512, 4096))
                finally:
                    split_mod.BIG_CHUNK = BIG_CHUNK
            runs[f"outcore-tf32x3-k{kc}"] = run
            runs[f"outcore-tf32x3-k{kc}-planned"] = lambda kc=kc: _planned(A, B, ta, tb, kc)
        errs = {}
        for name, fn in runs.items():
            errs[name] = ((fn().cuda().double() - ref).abs() / scale).max().item()
        for name, e in errs.items():
            out.append({"layout": layout, "variant": name, "max_rel_error": e,
                        "vs_sgemm": e / errs["sgemm-incore"]})
        unpin_(A)
        unpin_(B)
    return out


def _planned(A, B, ta, tb, kc):
    split_mod.BIG_CHUNK = kc
    try:
        return matmul(A, B, transa=ta, transb=tb, devices=0, compute="tf32x3")
    finally:
        split_mod.BIG_CHUNK = BIG_CHUNK


def main() -> int:
    if not torch.cuda.is_available():
        print("x3_shapes.py needs a GPU")
        return 1
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    g = torch.Generator(device="cuda").manual_seed(0)
    r, c, k = max(ROWS), max(COLS), max(KS)
    ah, al = (torch.rand(r, k, device="cuda", generator=g) for _ in range(2))
    bh, bl = (torch.rand(k, c, device="cuda", generator=g) for _ in range(2))
    acc = torch.zeros(r, c, device="cuda")
    rows = []
    try:
        for rr, cc, kk in itertools.product(ROWS, COLS, KS):
            rows.append({"rows": rr, "cols": cc, "k": kk,
                         "tflops": rate(rr, cc, kk, (ah, al, bh, bl, acc)) / 1e12})
    finally:
        torch.set_float32_matmul_precision(before)
    del ah, al, bh, bl, acc
    torch.cuda.empty_cache()
    best = fit(rows)
    acc_rows = accuracy()
    doc = common.header("x3-shapes")
    doc.update(runs=rows, fit=best, accuracy=acc_rows, big_chunk=BIG_CHUNK)
    tag = os.environ.get("X3_SHAPES_TAG")   # a name of its own: x3-shapes-<machine>-TAG.json
    path = common.write(doc, f"x3-shapes-{common.machine_name()}" + (f"-{tag}" if tag else ""))
    print(common.table(rows, ["rows", "cols", "k", "tflops"]))
    print(f"fit: {best}")
    print(common.table(acc_rows, ["layout", "variant", "max_rel_error", "vs_sgemm"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
