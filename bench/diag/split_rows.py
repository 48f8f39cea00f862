"""Do 2-D copies of narrow rows cross the link faster split over several streams? (GPU)

    PYTHONPATH=src python3 bench/diag/split_rows.py        # about 40 s on one H200

One cudaMemcpy2DAsync of 8 KiB rows moves about 33 GB/s on the H200 where a contiguous
copy moves 55 (copy-rows-h200.json), while a kernel's loads of the same rows moved 47-50
(zcopy-h200.json): the link has the room, one copy engine's row rate does not. This times
REPEAT copies of a 128 MiB region of a 16384-wide fp32 pinned matrix (fp32-16384's
pitch), each cut into
`streams` bands of rows, one band per stream (one stream: the copy whole), from an event
all of them wait on to the last band's end; each way, alone and beside a contiguous
1 GiB copy the other way. Writes bench/results/split-rows-<machine>.json, a table last.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from copy_rows import seconds  # noqa: E402   (its events around a stream's work)

from outcore.gemm.cudacopy import copy2d  # noqa: E402
from outcore.memory import pin_  # noqa: E402

WIDE = 16384                       # the host matrix's row, in fp32 elements (64 KiB)
COPY_BYTES = 128 << 20
REPEAT = 4
BESIDE_BYTES = 1 << 30
WIDTHS = (1024, 2048, 4096, 8192)  # row widths in elements: 4 .. 32 KiB
STREAMS = (1, 2, 3, 4)
RUNS = 5


def run_split(region: torch.Tensor, dbuf: torch.Tensor, way: str, streams: list) -> tuple:
    """Enqueue REPEAT copies of `region` (host) <-> `dbuf` (device), each cut into
    len(streams) bands of rows, one per stream; returns (start, end) events on streams[0]."""
    s0 = streams[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(s0)
    for s in streams[1:]:
        s.wait_event(start)   # stream wait: every band starts after the start mark
    n = region.shape[0]
    cuts = [n * i // len(streams) for i in range(len(streams) + 1)]
    for _ in range(REPEAT):
        for s, r0, r1 in zip(streams, cuts, cuts[1:]):
            dst, src = (dbuf[r0:r1], region[r0:r1]) if way == "h2d" else \
                (region[r0:r1], dbuf[r0:r1])
            if not copy2d(dst, src, s):
                raise RuntimeError("the 2-D copy is unavailable on this machine")
    for s in streams[1:]:
        ev = torch.cuda.Event()
        ev.record(s)
        s0.wait_event(ev)     # stream wait: the end mark follows every band
    end.record(s0)
    return start, end


def main() -> int:
    if not torch.cuda.is_available():
        print("split_rows.py needs a GPU")
        return 1
    dev = torch.device("cuda", 0)
    rows = COPY_BYTES // (WIDTHS[0] * 4)
    host = pin_(torch.empty(rows, WIDE))
    host.normal_()
    big_h = pin_(torch.empty(BESIDE_BYTES // 4))
    big_d = torch.empty(BESIDE_BYTES // 4, device=dev)
    pool = [torch.cuda.Stream(dev) for _ in range(max(STREAMS))]
    s_other = torch.cuda.Stream(dev)
    out = []
    for width in WIDTHS:
        n_rows = COPY_BYTES // (width * 4)
        region = host[:n_rows, :width]
        dbuf = torch.empty(n_rows, width, device=dev)
        for way in ("h2d", "d2h"):
            for beside in (False, True):
                for ns in STREAMS:
                    rates, others = [], []
                    for _ in range(RUNS + 1):
                        torch.cuda.synchronize(dev)   # host sync: each run starts on idle links
                        o = None
                        if beside:
                            o = (torch.cuda.Event(enable_timing=True),
                                 torch.cuda.Event(enable_timing=True))
                            o[0].record(s_other)
                            with torch.cuda.stream(s_other):
                                if way == "h2d":
                                    big_h.copy_(big_d, non_blocking=True)
                                else:
                                    big_d.copy_(big_h, non_blocking=True)
                            o[1].record(s_other)
                        t = run_split(region, dbuf, way, pool[:ns])
                        rates.append(REPEAT * COPY_BYTES / seconds(t) / 1e9)
                        if o is not None:
                            others.append(BESIDE_BYTES / seconds(o) / 1e9)
                    row = {"way": way, "row_kib": width * 4 // 1024, "beside": beside,
                           "streams": ns, "gbps": statistics.median(rates[1:]),
                           "gbps_runs": rates[1:]}
                    if others:
                        row["other_gbps"] = statistics.median(others[1:])
                    out.append(row)
        # the bands land where the whole copy would: check the last one both ways
        back = torch.empty_like(region).pin_memory()
        s = pool[0]
        run_split(region, dbuf, "h2d", pool[:2])
        torch.cuda.synchronize(dev)   # host sync: the copy in is done before its check
        with torch.cuda.stream(s):
            back.copy_(dbuf, non_blocking=True)
        s.synchronize()               # host sync: the check reads `back` below
        if not torch.equal(back, region):
            raise RuntimeError(f"split copy at {width * 4 // 1024} KiB rows is not exact")
    doc = common.header("split-rows")
    doc["copy_bytes"], doc["beside_bytes"], doc["runs"] = COPY_BYTES, BESIDE_BYTES, out
    path = common.write(doc, f"split-rows-{common.machine_name()}")
    print(f"\n{'way':5s}{'row KiB':>9s}{'beside':>8s}"
          + "".join(f"{f'{n} str GB/s':>13s}" for n in STREAMS) + f"{'other way':>11s}")
    for r in out:
        if r["streams"] != 1:
            continue
        same = [x for x in out if (x["way"], x["row_kib"], x["beside"])
                == (r["way"], r["row_kib"], r["beside"])]
        other = max((x.get("other_gbps", 0.0) for x in same), default=0.0)
        print(f"{r['way']:5s}{r['row_kib']:>9d}{str(r['beside']):>8s}"
              + "".join(f"{x['gbps']:>13.1f}" for x in same)
              + (f"{other:>11.1f}" if r["beside"] else ""))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
