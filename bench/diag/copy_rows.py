"""How fast do 2-D copies of narrow rows cross the link, each way, alone and beside a
contiguous copy the other way? (GPU)

    PYTHONPATH=src python3 bench/diag/copy_rows.py        # about 30 s on one H200

The gemm planner's timing model (outcore/gemm/model.py) charges copies of rows narrower
than the matrix at a fraction of the contiguous rate: ROW_FACTOR for A's and B's pieces
going in, D2H_ROW_FACTOR for C's tiles going out. A product runs both directions at once,
so each 2-D copy is timed alone and beside a contiguous 1 GiB copy the other way (the
pair's times are each copy's own, by events on its stream: the 2-D copy's, and the
contiguous one's while the 2-D ones ran). Rows of 8 to 128 KiB
out of a 32768-wide fp32 matrix (rows 128 KiB apart), 4 copies of 256 MiB a run.
Writes bench/results/copy-rows-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm.cudacopy import copy2d  # noqa: E402
from outcore.memory import pin_  # noqa: E402

WIDE = 32768                       # the host matrix's row, in fp32 elements (128 KiB)
COPY_BYTES = 256 << 20             # one 2-D copy; REPEAT of them make the timed stretch
REPEAT = 4
BESIDE_BYTES = 1 << 30             # the contiguous copy the other way
WIDTHS = (2048, 4096, 8192, 16384, 32768)   # row widths in elements: 8 .. 128 KiB
RUNS = 5


def timed(stream, fn):
    """Enqueue `fn` on `stream` between two timing events; returns the pair."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        a.record(stream)
        fn()
        b.record(stream)
    return a, b


def seconds(pair) -> float:
    pair[1].synchronize()   # host sync: the timed copies are done before their time is read
    return pair[0].elapsed_time(pair[1]) / 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("copy_rows.py needs a GPU")
        return 1
    dev = torch.device("cuda", 0)
    rows = COPY_BYTES // (WIDTHS[0] * 4)
    host = pin_(torch.empty(rows, WIDE))          # A/B pieces' or C's host side
    host.normal_()
    big_h = pin_(torch.empty(BESIDE_BYTES // 4))
    big_d = torch.empty(BESIDE_BYTES // 4, device=dev)
    s_2d, s_other = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    out = []
    for width in WIDTHS:
        n_rows = COPY_BYTES // (width * 4)
        region = host[:n_rows, :width]            # rows of width x 4 bytes, 128 KiB apart
        dbuf = torch.empty(n_rows, width, device=dev)
        for way in ("h2d", "d2h"):
            def copy():
                dst, src = (dbuf, region) if way == "h2d" else (region, dbuf)
                ok = copy2d(dst, src, s_2d) if width < WIDE else \
                    (dst.copy_(src, non_blocking=True) is not None)
                if not ok:
                    raise RuntimeError("the 2-D copy is unavailable on this machine")

            def other():
                with torch.cuda.stream(s_other):
                    if way == "h2d":     # the other way: device -> host
                        big_h.copy_(big_d, non_blocking=True)
                    else:
                        big_d.copy_(big_h, non_blocking=True)

            for beside in (False, True):
                rates, others = [], []
                for _ in range(RUNS + 1):
                    torch.cuda.synchronize(dev)   # host sync: each run starts on idle links
                    o = timed(s_other, other) if beside else None
                    t2 = timed(s_2d, lambda: [copy() for _ in range(REPEAT)])
                    rates.append(REPEAT * n_rows * width * 4 / seconds(t2) / 1e9)
                    if o is not None:
                        others.append(BESIDE_BYTES / seconds(o) / 1e9)
                row = {"way": way, "row_kib": width * 4 // 1024, "beside": beside,
                       "contiguous": width == WIDE, "gbps": statistics.median(rates[1:]),
                       "gbps_runs": rates[1:]}
                if others:
                    # the contiguous copy the other way, while the 2-D ones ran (it is
                    # about as long as their REPEAT copies)
                    row["other_gbps"] = statistics.median(others[1:])
                out.append(row)
    doc = common.header("copy-rows")
    doc["copy_bytes"], doc["beside_bytes"], doc["runs"] = COPY_BYTES, BESIDE_BYTES, out
    path = common.write(doc, f"copy-rows-{common.machine_name()}")
    print(f"\n{'way':5s}{'row KiB':>9s}{'alone GB/s':>12s}{'beside GB/s':>13s}"
          f"{'other way GB/s':>16s}")
    for r in out:
        if not r["beside"]:
            b = next(x for x in out if x["way"] == r["way"] and x["row_kib"] == r["row_kib"]
                     and x["beside"])
            print(f"{r['way']:5s}{r['row_kib']:>9d}{r['gbps']:>12.1f}{b['gbps']:>13.1f}"
                  f"{b['other_gbps']:>16.1f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
