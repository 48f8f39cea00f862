"""Can the GPU's own loads (a kernel reading pinned host memory, "zero-copy") move the 2-D
regions the gemm planner shuns faster than the DMA engines? (GPU, Triton)

    PYTHONPATH=src python3 bench/diag/zcopy.py        # about a minute on one H200

The DMA engines take rows of 8 KiB at ~34 GB/s and 16 KiB at ~48 (copy-rows-h200.json)
against ~55 for contiguous ones, so the planner (model.ROW_FACTOR) avoids narrow pieces,
and C tiles narrower than C pay likewise going out. Pinned host memory registered with
cudaHostRegister is mapped into the device's address space (unified addressing), so a
kernel can load it directly, with no per-row descriptor. Measured here, each the median
of RUNS runs of REPEAT copies of a region of a 16384 x 32768 fp32 host matrix:
- h2d: rows of 4 to 128 KiB by DMA, by a Triton tile kernel (several tile shapes), by the
  same kernel casting to bf16 on the way, alone and beside a 1 GiB DMA the other way;
- d2h: the kernel storing into the host region against the 2-D DMA, likewise;
- the kernel on a fixed number of programs (how many SMs the link needs);
- a kernel copy beside a bf16 and an fp32 GEMM stream: what each costs the other.
Every copy's result is checked against the host region once.
Writes bench/results/zcopy-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from copy_rows import seconds, timed  # noqa: E402   (its events around a stream's work)

from outcore.gemm.cudacopy import copy2d  # noqa: E402
from outcore.memory import pin_  # noqa: E402

ROWS, WIDE = 16384, 32768          # the host matrix, fp32 (2 GiB), rows 128 KiB apart
COPY_BYTES = 128 << 20             # one region; REPEAT of them a timed run
REPEAT = 4
RUNS = 5
WIDTHS = (1024, 2048, 4096, 8192, 32768)
TILES = ((8, 512, 4), (16, 512, 8), (8, 1024, 8), (32, 256, 8), (4, 2048, 8))
PROGRAMS = (8, 16, 32, 66, 132, 264)

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy2d(src, dst, rows, cols, s_stride, d_stride,
                BR: tl.constexpr, BC: tl.constexpr):
        """dst[r, c] = src[r, c] over a rows x cols region (row strides in elements)."""
        r = tl.program_id(0) * BR + tl.arange(0, BR)[:, None]
        c = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
        m = (r < rows) & (c < cols)
        x = tl.load(src + r.to(tl.int64) * s_stride + c, mask=m)
        tl.store(dst + r.to(tl.int64) * d_stride + c, x.to(dst.dtype.element_ty), mask=m)

    @triton.jit
    def _copy2d_p(src, dst, rows, cols, s_stride, d_stride, n_c, n_tiles,
                  BR: tl.constexpr, BC: tl.constexpr):
        """_copy2d on a fixed grid: program p takes tiles p, p + grid, ..."""
        for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            r = (t // n_c) * BR + tl.arange(0, BR)[:, None]
            c = (t % n_c) * BC + tl.arange(0, BC)[None, :]
            m = (r < rows) & (c < cols)
            x = tl.load(src + r.to(tl.int64) * s_stride + c, mask=m)
            tl.store(dst + r.to(tl.int64) * d_stride + c, x.to(dst.dtype.element_ty), mask=m)
except ImportError:            # reported by main()
    triton = None


def kcopy(dst: torch.Tensor, src: torch.Tensor, tile=(8, 1024, 8), programs: int = 0):
    """dst <- src (2-D, last dim contiguous; either may be pinned host memory) by a kernel
    on the current stream."""
    br, bc, warps = tile
    rows, cols = src.shape
    if programs:
        n_c = triton.cdiv(cols, bc)
        n = triton.cdiv(rows, br) * n_c
        _copy2d_p[(programs,)](src, dst, rows, cols, src.stride(0), dst.stride(0), n_c, n,
                               BR=br, BC=bc, num_warps=warps)
    else:
        grid = (triton.cdiv(rows, br), triton.cdiv(cols, bc))
        _copy2d[grid](src, dst, rows, cols, src.stride(0), dst.stride(0),
                      BR=br, BC=bc, num_warps=warps)


def rate(dev, s_main, s_other, fn, nbytes, other=None):
    """Median GB/s of REPEAT x fn on s_main (and of `other` on s_other beside it)."""
    rs, os_ = [], []
    for _ in range(RUNS + 1):
        torch.cuda.synchronize(dev)   # host sync: each run starts on idle links
        o = timed(s_other, other) if other else None
        t = timed(s_main, lambda: [fn() for _ in range(REPEAT)])
        rs.append(REPEAT * nbytes / seconds(t) / 1e9)
        if o is not None:
            os_.append(seconds(o))
    return statistics.median(rs[1:]), (statistics.median(os_[1:]) if os_ else None)


def main() -> int:
    if not torch.cuda.is_available() or triton is None:
        print("zcopy.py needs a GPU and Triton")
        return 1
    dev = torch.device("cuda", 0)
    host = pin_(torch.empty(ROWS, WIDE))
    host.normal_()
    big_h = pin_(torch.empty(1 << 28))
    big_d = torch.empty(1 << 28, device=dev)
    s_main = torch.cuda.Stream(dev, priority=-1)
    s_other = torch.cuda.Stream(dev)
    out = []

    def d2h_beside():
        big_h.copy_(big_d, non_blocking=True)

    def h2d_beside():
        big_d.copy_(big_h, non_blocking=True)

    for width in WIDTHS:
        n_rows = min(ROWS, COPY_BYTES // (width * 4))
        region = host[:n_rows, :width]
        nbytes = n_rows * width * 4
        d32 = torch.empty(n_rows, width, device=dev)
        d16 = torch.empty(n_rows, width, device=dev, dtype=torch.bfloat16)
        methods = {"dma": lambda: (copy2d(d32, region, s_main) if width < WIDE
                                   else d32.copy_(region, non_blocking=True))}
        for tile in TILES:
            methods[f"k{tile[0]}x{tile[1]}w{tile[2]}"] = (lambda t=tile: kcopy(d32, region, t))
        methods["k-bf16"] = lambda: kcopy(d16, region)
        for name, fn in methods.items():
            with torch.cuda.stream(s_main):
                fn()
            torch.cuda.synchronize(dev)   # host sync: check the copy once
            got = (d16.float() if name == "k-bf16" else d32).cpu()
            want = region.to(torch.bfloat16).float() if name == "k-bf16" else region
            ok = bool(torch.equal(got, want))
            for beside in (False, True):
                g, o = rate(dev, s_main, s_other, fn, nbytes, d2h_beside if beside else None)
                out.append({"way": "h2d", "row_kib": width * 4 // 1024, "method": name,
                            "beside": beside, "gbps": g, "exact": ok,
                            "other_gbps": (1 << 30) / o / 1e9 if o else None})
        # d2h: the kernel storing into the host region, against the 2-D DMA
        d32.copy_(region)
        for name, fn in {"dma": lambda: (copy2d(region, d32, s_main) if width < WIDE
                                         else region.copy_(d32, non_blocking=True)),
                         "k8x1024w8": lambda: kcopy(region, d32)}.items():
            for beside in (False, True):
                g, o = rate(dev, s_main, s_other, fn, nbytes, h2d_beside if beside else None)
                out.append({"way": "d2h", "row_kib": width * 4 // 1024, "method": name,
                            "beside": beside, "gbps": g,
                            "other_gbps": (1 << 30) / o / 1e9 if o else None})
        torch.cuda.synchronize(dev)
        ok = bool(torch.equal(region, d32.cpu()))
        out.append({"way": "d2h-check", "row_kib": width * 4 // 1024, "exact": ok})
    # how many programs the link needs (8 KiB rows)
    n_rows = COPY_BYTES // (2048 * 4)
    region = host[:n_rows, :2048]
    d32 = torch.empty(n_rows, 2048, device=dev)
    for p in PROGRAMS:
        g, _ = rate(dev, s_main, s_other, lambda p=p: kcopy(d32, region, programs=p),
                    n_rows * 2048 * 4)
        out.append({"way": "h2d-programs", "row_kib": 8, "programs": p, "gbps": g})
    # beside GEMMs: 1 GiB of 8 KiB rows by kernel or DMA, against a GEMM stream
    n_rows = (1 << 30) // (2048 * 4)
    region = host[:n_rows, :2048]
    d32 = torch.empty(n_rows, 2048, device=dev)
    s_gemm = torch.cuda.Stream(dev)
    for comp, (m, n, k), dt in (("bf16", (8192, 8192, 8192), torch.bfloat16),
                                ("fp32", (4096, 4096, 16384), torch.float32)):
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        c = torch.empty(m, n, device=dev, dtype=dt)
        reps = 40 if comp == "bf16" else 12

        def gemms():
            for _ in range(reps):
                torch.mm(a, b, out=c)
        for mode in ("alone", "dma", "kernel", "kernel-32"):
            gs, cs = [], []
            for _ in range(RUNS + 1):
                torch.cuda.synchronize(dev)   # host sync: each run starts idle
                tc = None
                if mode == "dma":
                    tc = timed(s_main, lambda: copy2d(d32, region, s_main))
                elif mode == "kernel":
                    tc = timed(s_main, lambda: kcopy(d32, region))
                elif mode == "kernel-32":
                    tc = timed(s_main, lambda: kcopy(d32, region, programs=32))
                tg = timed(s_gemm, gemms)
                gs.append(seconds(tg))
                if tc is not None:
                    cs.append(seconds(tc))
            flops = 2.0 * m * n * k * reps
            out.append({"way": "beside-gemm", "compute": comp, "mode": mode,
                        "gemm_tflops": flops / statistics.median(gs[1:]) / 1e12,
                        "copy_gbps": ((1 << 30) / statistics.median(cs[1:]) / 1e9
                                      if cs else None),
                        "gemm_s": statistics.median(gs[1:])})
    doc = common.header("zcopy")
    doc["copy_bytes"], doc["runs"] = COPY_BYTES, out
    path = common.write(doc, f"zcopy-{common.machine_name()}")
    print(f"\n{'way':6s}{'KiB':>5s} {'method':14s}{'alone':>8s}{'beside':>8s}{'other':>8s}"
          f"{'exact':>7s}")
    for r in out:
        if r["way"] in ("h2d", "d2h") and not r["beside"]:
            b = next(x for x in out if x["way"] == r["way"] and x["row_kib"] == r["row_kib"]
                     and x["method"] == r["method"] and x["beside"])
            print(f"{r['way']:6s}{r['row_kib']:>5d} {r['method']:14s}{r['gbps']:>8.1f}"
                  f"{b['gbps']:>8.1f}{b['other_gbps']:>8.1f}{str(r.get('exact', '')):>7s}")
    for r in out:
        if r["way"] == "d2h-check":
            print(f"d2h kernel exact at {r['row_kib']} KiB: {r['exact']}")
        if r["way"] == "h2d-programs":
            print(f"h2d 8 KiB rows, {r['programs']:4d} programs: {r['gbps']:.1f} GB/s")
        if r["way"] == "beside-gemm":
            cg = f"{r['copy_gbps']:.1f}" if r["copy_gbps"] else "-"
            print(f"{r['compute']} GEMMs {r['mode']:10s}: {r['gemm_tflops']:.1f} TFLOP/s, "
                  f"copy {cg} GB/s")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
