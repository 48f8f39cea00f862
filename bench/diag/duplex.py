"""Does a paced GPU->host stream leave the host->GPU one its full rate? (GPU)

    PYTHONPATH=src python3 bench/diag/duplex.py        # under a minute on one H200

The bf16-32768 product is bound by its 8.6 GB of fp32 inputs going in; its 4.3 GB of C go
out beside them, and in session 11's timeline the copies in ran at 48.4 GB/s against 55
alone. C's tiles go out in bursts at the full rate. This times 4 GiB in (64 MiB copies)
with 2 GiB out beside it in 16 MiB copies, each followed on the out stream by a spin
kernel of `gap` times the copy's own duration (pacing on the device, no host timing), for
several gaps; and each direction alone. Rates are from CUDA events on each stream. Writes
bench/results/duplex-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.memory import pin_  # noqa: E402

GIB = 1 << 30
IN_CHUNK, OUT_CHUNK = 64 << 20, 16 << 20
GAPS = [None, 0.0, 0.5, 1.0, 2.0]     # None: nothing goes out


def _cycles_per_s() -> float:
    """Clock rate of torch.cuda._sleep's spin, measured (it counts SM clock cycles)."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 50_000_000
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(n)
    e.record()
    e.synchronize()   # host sync: read the elapsed time
    return n / (s.elapsed_time(e) / 1e3)


def run(gap, dev_in, host_in, dev_out, host_out, cps: float, out_only: bool = False) -> dict:
    h2d, d2h = torch.cuda.Stream(), torch.cuda.Stream()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda.synchronize()
    if not out_only:
        ev[0].record(h2d)
        with torch.cuda.stream(h2d):
            for i in range(0, dev_in.numel(), IN_CHUNK):
                dev_in[i:i + IN_CHUNK].copy_(host_in[i:i + IN_CHUNK], non_blocking=True)
        ev[1].record(h2d)
    if gap is not None:
        spin = int(gap * OUT_CHUNK / 55e9 * cps)
        ev[2].record(d2h)
        with torch.cuda.stream(d2h):
            for i in range(0, dev_out.numel(), OUT_CHUNK):
                host_out[i:i + OUT_CHUNK].copy_(dev_out[i:i + OUT_CHUNK], non_blocking=True)
                if spin:
                    torch.cuda._sleep(spin)
        ev[3].record(d2h)
    torch.cuda.synchronize()   # host sync: every copy done before the events are read
    row = {"gap": gap, "out_only": out_only}
    if not out_only:
        t = ev[0].elapsed_time(ev[1]) / 1e3
        row.update(in_s=t, in_gbps=dev_in.numel() / t / 1e9)
    if gap is not None:
        t = ev[2].elapsed_time(ev[3]) / 1e3
        row.update(out_s=t, out_gbps=dev_out.numel() / t / 1e9)
    return row


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/duplex.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("duplex")
    cps = _cycles_per_s()
    doc["spin_cycles_per_s"] = cps
    host_in = pin_(torch.ones(4 * GIB, dtype=torch.uint8))
    host_out = pin_(torch.empty(2 * GIB, dtype=torch.uint8))
    dev_in = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    dev_out = torch.ones(2 * GIB, dtype=torch.uint8, device="cuda")
    args = (dev_in, host_in, dev_out, host_out, cps)
    run(0.0, *args)   # warm-up
    rows = [run(0.0, *args, out_only=True)]
    for gap in GAPS:
        rs = [run(gap, *args) for _ in range(3)]
        rs.sort(key=lambda r: r["in_s"])
        rows.append(rs[1])   # the median by the copies in
        print(rows[-1], flush=True)
    doc["runs"] = rows
    common.write(doc, f"duplex-{common.machine_name()}")
    print(common.table(rows, ["gap", "out_only", "in_gbps", "in_s", "out_gbps", "out_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
