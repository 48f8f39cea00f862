"""Does cuBLASLt offer a faster fp32 kernel for outcore's tiles than cuBLAS picks? One GPU.

    PYTHONPATH=src python3 bench/diag/lt_algos.py        # about a minute on one H200

Written in session 20 and NOT RUN YET (that session had no device time left). Session 20
found fp32-16384's GEMMs slower in tiles than as one (bench/diag/fp32_overlap.py: 171 ms
for the planner's 4096^2 tiles against 163 for one 16384^3 GEMM, on the device alone):
cuBLAS runs the whole product on `cutlass_80_simt_sgemm_256x128_8x4` (54.0 TFLOP/s) and the
tiles on an `sm80_xmma_gemm_..._ffma` kernel (50.1-51.3; fp32-shapes-h200.json). This asks
cuBLASLt's heuristic for up to REQUESTED algorithms for each tile shape (fp32 compute, no
TF32, accumulating: beta = 1) and times every one it offers (CUDA events over repeated
calls, median of 5 samples), beside torch's own GEMM of the same shape; each algorithm is
named by its config attributes (id, tile, split-K, stages). Then it sweeps every algorithm
id, tile and stage count cuBLASLt accepts for the 4096^2 tiles (no split-K; a quick screen,
the fastest few timed fully), since the heuristic may not offer the SIMT kernel. If one runs the 4096^2 x 16384
tiles near 54 TFLOP/s, a worker path that calls cuBLASLt with that algorithm could close
most of the 8 ms. Writes bench/results/lt-algos-<machine>.json, a table last.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
import common  # noqa: E402
from fp32_shapes import per_call_s  # noqa: E402

from outcore.gemm.cudacopy import _loaded_lib  # noqa: E402

REQUESTED = 32
WORKSPACE = 32 << 20
# (rows, cols, depth) of C += A @ B, row-major as the worker calls them
SHAPES = [(4096, 4096, 16384), (4096, 4096, 2048), (8192, 8192, 16384), (16384, 16384, 16384)]
COMPUTE_32F, R_32F = 68, 0                    # cublasComputeType_t, cudaDataType_t
PREF_MAX_WORKSPACE = 1                        # cublasLtMatmulPreferenceAttributes_t
CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5,
          "stages": 6}                        # cublasLtMatmulAlgoConfigAttributes_t
CAP_TILE_IDS, CAP_STAGES_IDS = 6, 13          # cublasLtMatmulAlgoCapAttributes_t
DESC_TRANSA = 3                               # cublasLtMatmulDescAttributes_t
SWEEP_SHAPES = [(4096, 4096, 16384), (4096, 4096, 2048)]
# LT_SWEEP=MxNxK,... sweeps those shapes instead and skips the heuristic's list; the file
# is then lt-algos-<machine>-sweep.json, or -sweep-<LT_TAG> with LT_TAG set. A shape ending
# in "t" has b column-contiguous (b = bt.t(), as the NT products' blocks): op T in
# cuBLASLt's terms.
if os.environ.get("LT_SWEEP"):
    SHAPES = []
    SWEEP_SHAPES = [tuple(int(x) for x in s.rstrip("t").split("x")) + (s.endswith("t"),)
                    for s in os.environ["LT_SWEEP"].split(",")]
SWEEP_S = 90.0                                # the sweep's screening time per shape, at most
SWEEP_TOP = 6                                 # configs per shape timed fully after the screen


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]          # cublasLtMatmulAlgo_t


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class Lt:
    """The few cuBLASLt calls this needs, on the library torch loaded."""

    def __init__(self):
        x = torch.ones(2, 2, device="cuda")
        (x @ x).sum().item()   # host sync: torch has loaded its cuBLAS(Lt) by now
        path = _loaded_lib("libcublasLt.so")
        if path is None:
            raise RuntimeError("libcublasLt is not loaded in this process")
        self.lib = ctypes.CDLL(path)
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    def layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        """A column-major fp32 matrix layout."""
        out = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), R_32F,
                                                   ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                                   ctypes.c_int64(ld)), "LayoutCreate")
        return out

    def problem(self, m: int, n: int, k: int, tb: bool = False):
        """Descriptors of row-major C (m x n) += A (m x k) @ B (k x n), as the column-major
        C.T (n x m) = B.T (n x k) @ A.T (k x m); with tb, B column-contiguous (its memory
        is B as a column-major k x n matrix: op T)."""
        desc = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F),
               "MatmulDescCreate")
        if tb:
            op = ctypes.c_int32(1)
            _check(self.lib.cublasLtMatmulDescSetAttribute(desc, DESC_TRANSA, ctypes.byref(op),
                                                           4), "DescSetAttribute")
        lb = self.layout(k, n, k) if tb else self.layout(n, k, n)
        return desc, lb, self.layout(k, m, k), self.layout(n, m, n)

    def algos(self, desc, la, lb, lc) -> list[Heuristic]:
        pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(
            pref, PREF_MAX_WORKSPACE, ctypes.byref(ws), ctypes.sizeof(ws)), "SetAttribute")
        got = (Heuristic * REQUESTED)()
        count = ctypes.c_int()
        _check(self.lib.cublasLtMatmulAlgoGetHeuristic(
            self.handle, desc, la, lb, lc, lc, pref, REQUESTED, got, ctypes.byref(count)),
            "AlgoGetHeuristic")
        self.lib.cublasLtMatmulPreferenceDestroy(pref)
        return [got[i] for i in range(count.value) if got[i].state == 0]

    def config(self, algo: Algo) -> dict:
        out = {}
        for name, attr in CONFIG.items():
            val, written = ctypes.c_uint32(), ctypes.c_size_t()
            if self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                    ctypes.byref(algo), attr, ctypes.byref(val), ctypes.sizeof(val),
                    ctypes.byref(written)) == 0:
                out[name] = val.value
        return out

    def matmul(self, desc, la, lb, lc, a, b, c, algo: Algo, ws_bytes: int) -> None:
        """c += a @ b (row-major torch tensors) with `algo` on the current stream."""
        one = ctypes.c_float(1.0)
        _check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(one), ctypes.c_void_p(b.data_ptr()), la,
            ctypes.c_void_p(a.data_ptr()), lb, ctypes.byref(one),
            ctypes.c_void_p(c.data_ptr()), lc, ctypes.c_void_p(c.data_ptr()), lc,
            ctypes.byref(algo), ctypes.c_void_p(self.workspace.data_ptr()),
            ctypes.c_size_t(ws_bytes), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
            "cublasLtMatmul")


    def ids(self) -> list[int]:
        """Every algorithm id cuBLASLt has for fp32 in, out and compute."""
        got, count = (ctypes.c_int * 256)(), ctypes.c_int()
        _check(self.lib.cublasLtMatmulAlgoGetIds(self.handle, COMPUTE_32F, R_32F, R_32F, R_32F,
                                                 R_32F, R_32F, 256, got, ctypes.byref(count)),
               "AlgoGetIds")
        return list(got[:count.value])

    def caps(self, algo: Algo, attr: int) -> list[int]:
        """An array-valued capability of `algo` (tile ids, stage ids)."""
        size = ctypes.c_size_t()
        self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0,
                                                   ctypes.byref(size))
        n = size.value // 4
        if n == 0:
            return []
        buf = (ctypes.c_uint32 * n)()
        _check(self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, buf, 4 * n,
                                                          ctypes.byref(size)), "CapGetAttribute")
        return list(buf)

    def configured(self, desc, la, lb, lc, algo_id: int, tile: int | None,
                   stages: int | None) -> Heuristic | None:
        """Algorithm `algo_id` with this tile and stage count, if cuBLASLt accepts it for
        the problem (cublasLtMatmulAlgoCheck), with the workspace it needs."""
        algo, h = Algo(), Heuristic()
        if self.lib.cublasLtMatmulAlgoInit(self.handle, COMPUTE_32F, R_32F, R_32F, R_32F, R_32F,
                                           R_32F, algo_id, ctypes.byref(algo)) != 0:
            return None
        for attr, val in ((CONFIG["tile"], tile), (CONFIG["stages"], stages),
                          (CONFIG["splitk"], 1)):
            if val is not None:
                v = ctypes.c_uint32(val)
                if self.lib.cublasLtMatmulAlgoConfigSetAttribute(
                        ctypes.byref(algo), attr, ctypes.byref(v), 4) != 0:
                    return None
        if self.lib.cublasLtMatmulAlgoCheck(self.handle, desc, la, lb, lc, lc,
                                            ctypes.byref(algo), ctypes.byref(h)) != 0:
            return None
        h.algo = algo
        return h if h.workspaceSize <= WORKSPACE else None


def screen_s(fn) -> float:
    """Seconds of one call of fn after one warm-up call: a quick, rough figure."""
    fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()   # host sync: read the figure
    return s.elapsed_time(e) / 1e3


def rate(fn, flops: float) -> float:
    """TFLOP/s of fn, a GEMM of `flops` (fp32_shapes.per_call_s)."""
    return flops / per_call_s(fn, flops)[0] / 1e12


def shape_rows(lt: Lt, m: int, n: int, k: int) -> list[dict]:
    """torch's rate for c += a @ b at this shape, then each algorithm cuBLASLt offers
    (checked against torch's product first; a wrong one is listed, not timed)."""
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.zeros(m, n, device="cuda")
    flops = 2.0 * m * n * k
    ref = torch.addmm(c, a, b)
    rows = [{"m": m, "n": n, "k": k, "algo": "torch",
             "tflops": rate(lambda: c.addmm_(a, b), flops)}]
    print(rows[-1], flush=True)
    desc, la, lb, lc = lt.problem(m, n, k)
    for x, h in enumerate(lt.algos(desc, la, lb, lc)):
        c.zero_()
        lt.matmul(desc, la, lb, lc, a, b, c, h.algo, h.workspaceSize)
        err = ((c - ref).abs().max() / ref.abs().max()).item()   # host sync: the check
        row = {"m": m, "n": n, "k": k, "algo": x, "config": lt.config(h.algo),
               "workspace": h.workspaceSize, "waves": h.wavesCount, "rel_err": err}
        row["tflops"] = (rate(lambda: lt.matmul(desc, la, lb, lc, a, b, c, h.algo,
                                                h.workspaceSize), flops)
                         if err < 1e-4 else None)
        rows.append(row)
        print(row, flush=True)
    return rows


def sweep_rows(lt: Lt, m: int, n: int, k: int, tb: bool = False) -> list[dict]:
    """Every (algorithm id, tile, stages) cuBLASLt accepts for c += a @ b at this shape,
    without split-K: each screened by one timed call (for at most SWEEP_S seconds in all),
    the SWEEP_TOP fastest then timed as the heuristic's are; torch's own rate first."""
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda").t() if tb else torch.randn(k, n, device="cuda")
    c = torch.zeros(m, n, device="cuda")
    flops = 2.0 * m * n * k
    ref = torch.addmm(c, a, b)
    rows = [{"m": m, "n": n, "k": k, "tb": tb, "algo": "torch",
             "tflops": rate(lambda: c.addmm_(a, b), flops)}]
    print(rows[-1], flush=True)
    desc, la, lb, lc = lt.problem(m, n, k, tb)
    screened, start = [], time.perf_counter()
    for algo_id in lt.ids():
        probe = Algo()
        if lt.lib.cublasLtMatmulAlgoInit(lt.handle, COMPUTE_32F, R_32F, R_32F, R_32F, R_32F,
                                         R_32F, algo_id, ctypes.byref(probe)) != 0:
            continue
        for tile in lt.caps(probe, CAP_TILE_IDS) or [None]:
            for stages in lt.caps(probe, CAP_STAGES_IDS) or [None]:
                if time.perf_counter() - start > SWEEP_S:
                    break
                h = lt.configured(desc, la, lb, lc, algo_id, tile, stages)
                if h is None:
                    continue
                try:
                    secs = screen_s(lambda: lt.matmul(desc, la, lb, lc, a, b, c, h.algo,
                                                      h.workspaceSize))
                except RuntimeError:
                    continue   # accepted by the check, refused by the call: not a candidate
                screened.append((secs, algo_id, tile, stages, h))
    screened.sort(key=lambda t: t[0])
    print(f"{m}x{n}x{k}{'t' if tb else ''}: {len(screened)} configs screened in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    for secs, algo_id, tile, stages, h in screened[:SWEEP_TOP]:
        c.zero_()
        lt.matmul(desc, la, lb, lc, a, b, c, h.algo, h.workspaceSize)
        err = ((c - ref).abs().max() / ref.abs().max()).item()   # host sync: the check
        row = {"m": m, "n": n, "k": k, "tb": tb, "algo": f"sweep-{algo_id}",
               "config": lt.config(h.algo),
               "screen_tflops": flops / secs / 1e12, "rel_err": err,
               "tflops": (rate(lambda: lt.matmul(desc, la, lb, lc, a, b, c, h.algo,
                                                 h.workspaceSize), flops)
                          if err < 1e-4 else None)}
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/lt_algos.py needs a CUDA GPU", file=sys.stderr)
        return 2
    assert ctypes.sizeof(Heuristic) == 96, ctypes.sizeof(Heuristic)
    doc = common.header("lt-algos")
    doc["env"] = {k: os.environ.get(k) for k in ("LT_SWEEP", "LT_TAG")}   # not in the command
    torch.backends.cuda.matmul.allow_tf32 = False
    lt = Lt()
    rows = []
    for m, n, k in SHAPES:
        rows += shape_rows(lt, m, n, k)
        torch.cuda.empty_cache()   # this shape's operands are gone: free them for the next
    for m, n, k, *tb in SWEEP_SHAPES:
        rows += sweep_rows(lt, m, n, k, bool(tb and tb[0]))
        torch.cuda.empty_cache()   # as above
    doc["runs"] = rows
    tag = ("-sweep" + (f"-{os.environ['LT_TAG']}" if os.environ.get("LT_TAG") else "")
           if not SHAPES else "")
    common.write(doc, f"lt-algos-{common.machine_name()}{tag}")
    print(common.table(rows, ["m", "n", "k", "tb", "algo", "tflops", "config"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
