"""How exact is compute="tf32x3" on the GPU, and what do shorter GEMMs over K buy? (GPU)

    PYTHONPATH=src python3 bench/diag/x3_accuracy.py        # about 40 s on one H200

Session 25's first run of tf32x3 (gemm-h200-s25-x3.json) measured its largest error,
relative to sum_k |a_ik b_kj|, at 12-22 times the fp32 GEMM's on the square cases, where the
CPU (fp32 arithmetic rounding to nearest) had it within 1.3 times. A tensor core that
truncates its running sum, where the fp32 GEMM rounds each add to nearest, would do that,
and its error would grow with the K one GEMM call sums. This runs in-core products of
M x N x K random uniform [-1, 1) fp32 matrices (all on the GPU), against float64, as:
fp32; tf32; tf32x3 in one GEMM per part over all of K (split.mm_acc_split); tf32x3 in
calls over KC-deep chunks of K accumulating into C (beta=1, as outcore's K pieces do);
tf32x3 with only the large hi @ hi product in chunks (what split.py does since). Then
through outcore.matmul on pinned host matrices, NN, NT and TN: the fp32 GEMM in memory
against outcore fp32 and outcore tf32x3 with split.BIG_CHUNK 0 (whole), 4096, 2048 and
1024. The time of each beside it (median of RUNS). Writes
bench/results/x3-accuracy-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm import split as split_mod  # noqa: E402
from outcore.gemm.matmul import matmul  # noqa: E402
from outcore.gemm.split import BIG_CHUNK, mm_acc_split, split_  # noqa: E402
from outcore.memory import pin_, unpin_  # noqa: E402

SHAPES = ((4096, 4096, 16384), (4096, 4096, 65536))
CHUNKS = (8192, 4096, 2048, 1024, 512)
RUNS = 5
OUTCORE_SHAPE = (8192, 8192, 16384)
OUTCORE_CHUNKS = (0, 4096, 2048, 1024)


def timed(fn) -> float:
    fn()
    times = []
    for _ in range(RUNS):
        torch.cuda.synchronize()      # host sync: each run starts on an idle device
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()      # host sync: the run's kernels are done
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def variants(a, b, ah, al, bh, bl, out):
    """name -> a function that writes the product into `out`."""
    def chunked(kc, big_only):
        def run():
            k = a.shape[1]
            if big_only:                  # the small terms whole, first
                torch.mm(al, bh, out=out)
                out.addmm_(ah, bl)
            for i, k0 in enumerate(range(0, k, kc)):
                s = slice(k0, k0 + kc)
                if big_only:
                    out.addmm_(ah[:, s], bh[s])
                else:
                    mm_acc_split(out, ah[:, s], al[:, s], bh[s], bl[s], 1.0,
                                 0.0 if i == 0 else 1.0)
        return run

    v = {"fp32": ("highest", lambda: torch.mm(a, b, out=out)),
         "tf32": ("high", lambda: torch.mm(a, b, out=out)),
         "tf32x3": ("high", lambda: mm_acc_split(out, ah, al, bh, bl, 1.0, 0.0))}
    for kc in CHUNKS:
        v[f"tf32x3-k{kc}"] = ("high", chunked(kc, False))
        v[f"tf32x3-big-k{kc}"] = ("high", chunked(kc, True))
    return v


def layout_operands(m: int, n: int, k: int, layout: str, g: torch.Generator):
    """Uniform [-1, 1) pinned host A and B stored for `layout` ("NT": B stored N x K),
    op(A) and op(B) on the GPU, and the float64 product and sum |a||b| to judge by."""
    ta, tb = layout[0] == "T", layout[1] == "T"
    A = pin_(torch.rand(*((k, m) if ta else (m, k)), generator=g) * 2 - 1)
    B = pin_(torch.rand(*((n, k) if tb else (k, n)), generator=g) * 2 - 1)
    a, b = A.cuda(), B.cuda()
    oa, ob = (a.t() if ta else a), (b.t() if tb else b)
    return A, B, oa, ob, oa.double() @ ob.double(), oa.double().abs() @ ob.double().abs()


def through_outcore() -> list[dict]:
    """The same question through outcore.matmul on pinned host matrices, per layout: the
    fp32 GEMM in memory (cuBLAS, all of K in one call), outcore fp32, and outcore tf32x3
    with the large term's calls BIG_CHUNK deep for each of OUTCORE_CHUNKS."""
    rows = []
    m, n, k = OUTCORE_SHAPE
    g = torch.Generator().manual_seed(1)
    for layout in ("NN", "NT", "TN"):
        ta, tb = layout[0] == "T", layout[1] == "T"
        A, B, oa, ob, ref, scale = layout_operands(m, n, k, layout, g)
        runs = {"sgemm-incore": lambda: oa @ ob}
        for compute in ("fp32", "tf32x3"):
            for kc in (OUTCORE_CHUNKS if compute == "tf32x3" else (None,)):
                def run(compute=compute, kc=kc):
                    if kc is not None:
                        split_mod.BIG_CHUNK = kc
                    try:
                        return matmul(A, B, transa=ta, transb=tb, devices=0, compute=compute)
                    finally:
                        split_mod.BIG_CHUNK = BIG_CHUNK
                runs[f"outcore-{compute}" + ("" if kc is None else f"-k{kc}")] = run
        torch.backends.cuda.matmul.allow_tf32 = False
        for name, fn in runs.items():
            out = fn()
            t = timed(fn)
            rel = (out.cuda().double() - ref).abs() / scale
            rows.append({"m": m, "n": n, "k": k, "layout": layout, "variant": name,
                         "max_rel_error": rel.max().item(), "mean_rel_error": rel.mean().item(),
                         "ms": t * 1e3, "tflops": 2.0 * m * n * k / t / 1e12})
        unpin_(A)
        unpin_(B)
        del ref, scale
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("x3_accuracy.py needs a GPU")
        return 1
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in SHAPES:
        a = torch.rand(m, k, device="cuda", generator=g) * 2 - 1
        b = torch.rand(k, n, device="cuda", generator=g) * 2 - 1
        ref = a.double() @ b.double()
        scale = a.double().abs() @ b.double().abs()
        ah, bh = a.clone(), b.clone()
        al, bl = torch.empty_like(a), torch.empty_like(b)
        split_(ah, al)
        split_(bh, bl)
        out = torch.empty(m, n, device="cuda")
        before = torch.get_float32_matmul_precision()
        for name, (prec, fn) in variants(a, b, ah, al, bh, bl, out).items():
            torch.set_float32_matmul_precision(prec)
            try:
                t = timed(fn)
            finally:
                torch.set_float32_matmul_precision(before)
            rel = ((out.double() - ref).abs() / scale)
            rows.append({"m": m, "n": n, "k": k, "variant": name,
                         "max_rel_error": rel.max().item(),
                         "mean_rel_error": rel.mean().item(),
                         "ms": t * 1e3, "tflops": 2.0 * m * n * k / t / 1e12})
        del a, b, ref, scale, ah, bh, al, bl, out
        torch.cuda.empty_cache()
    rows += through_outcore()
    fp32 = {(r["k"], r.get("layout")): r["max_rel_error"] for r in rows
            if r["variant"] in ("fp32", "sgemm-incore")}
    for r in rows:
        r["vs_fp32"] = r["max_rel_error"] / fp32[(r["k"], r.get("layout"))]
    doc = common.header("x3-accuracy")
    doc["runs"] = rows
    path = common.write(doc, f"x3-accuracy-{common.machine_name()}")
    print(common.table(rows, ["m", "n", "k", "layout", "variant", "max_rel_error", "mean_rel_error",
                              "vs_fp32", "ms", "tflops"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
