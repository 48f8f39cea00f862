"""Can the host cast part of an fp32 operand to bf16 fast enough to shorten its copy in? (GPU)

    PYTHONPATH=src python3 bench/diag/host_cast.py        # about a minute on one H200

A bf16 product of fp32 host matrices is bound by the link: 4 bytes an element cross it and
the GPU casts them. Where the host casts a share x of the rows into pinned bf16 buffers,
those cross at 2 bytes an element, while the rest goes as before; the host's cast (read 4,
write 2 bytes) and the DMA share host DRAM. This times a 32768 x 32768 fp32 operand into
a device bf16 copy of it, in chunks of CHUNK rows:
  - the host's cast alone, into a ring of pinned bf16 buffers (G elements/s, per thread
    count), and the same while copies run both ways (the product's second phase);
  - every chunk by fp32 DMA into a landing buffer, cast on the GPU (outcore today);
  - the hybrid: a share x of the chunks cast by a host thread and DMA'd as bf16 on a
    stream of their own, the rest as above; alone, and with a stream of copies out beside
    it (C's tiles going out).
Writes bench/results/host-cast-<machine>.json and prints a table last.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.memory import pin_  # noqa: E402

N = 32768
CHUNK = 512          # rows a copy: 64 MiB of fp32, 32 MiB of bf16
RING = 4             # pinned bf16 buffers the host's cast fills ahead of their DMA
SHARES = [0.0, 0.2, 0.3, 0.4, 0.5, 0.6]
THREADS = [16, 12, 8]


def cast_alone(host: torch.Tensor, ring: list, threads: int) -> float:
    """G elements/s of the host's fp32 -> bf16 cast of all of `host`, chunk by chunk."""
    torch.set_num_threads(threads)
    t = time.perf_counter()
    for j, r in enumerate(range(0, N, CHUNK)):
        ring[j % RING].copy_(host[r:r + CHUNK])
    return host.numel() / (time.perf_counter() - t) / 1e9


def is_cast(j: int, x: float) -> bool:
    """Chunk j goes through the host's cast: spread evenly, a share x of the chunks."""
    return int((j + 1) * x) > int(j * x)


def hybrid(host, dev, land, ring, x: float, out_pair=None) -> dict:
    """dev (bf16) <- host (fp32): a share x of the chunks cast on the host; seconds."""
    h2d, cast_s, conv = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    n_chunks = N // CHUNK
    mine = [j for j in range(n_chunks) if is_cast(j, x)]
    freed = [None] * RING
    cast_busy = [0.0]

    def caster():
        for i, j in enumerate(mine):
            b = i % RING
            if freed[b] is not None:
                freed[b].synchronize()   # host sync: buffer reuse, its last DMA has read it
            t = time.perf_counter()
            ring[b].copy_(host[j * CHUNK:(j + 1) * CHUNK])
            cast_busy[0] += time.perf_counter() - t
            with torch.cuda.stream(cast_s):
                dev[j * CHUNK:(j + 1) * CHUNK].copy_(ring[b], non_blocking=True)
                freed[b] = torch.cuda.Event()
                freed[b].record(cast_s)

    torch.cuda.synchronize()
    if out_pair is not None:
        d2h = torch.cuda.Stream()
        with torch.cuda.stream(d2h):
            out_pair[1].copy_(out_pair[0], non_blocking=True)
    t0 = time.perf_counter()
    th = threading.Thread(target=caster)
    th.start()
    land_free = [None, None]
    q = 0
    for j in range(n_chunks):
        if j in mine:
            continue
        with torch.cuda.stream(h2d):
            if land_free[q] is not None:
                h2d.wait_event(land_free[q])   # buffer reuse: its cast on the GPU is done
            land[q].copy_(host[j * CHUNK:(j + 1) * CHUNK], non_blocking=True)
            landed = torch.cuda.Event()
            landed.record(h2d)
        with torch.cuda.stream(conv):
            conv.wait_event(landed)            # stream wait: cast only what has landed
            dev[j * CHUNK:(j + 1) * CHUNK].copy_(land[q])
            land_free[q] = torch.cuda.Event()
            land_free[q].record(conv)
        q ^= 1
    th.join()
    h2d.synchronize()
    conv.synchronize()
    cast_s.synchronize()   # host sync: every chunk is on the device before the clock stops
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return {"x": x, "seconds": t, "fp32_equiv_gbps": host.numel() * 4 / t / 1e9,
            "cast_busy_s": cast_busy[0], "n_cast": len(mine),
            "with_out": out_pair is not None}


def cast_under_copies(host, ring, out_pair, in_pair) -> float:
    """G elements/s of the host's cast while copies run both ways on the GPU."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        out_pair[1].copy_(out_pair[0], non_blocking=True)
    with torch.cuda.stream(s2):
        in_pair[1].copy_(in_pair[0], non_blocking=True)
    n = 8192 * N   # a quarter: done while the 4 GiB copies still run
    t = time.perf_counter()
    for j, r in enumerate(range(0, 8192, CHUNK)):
        ring[j % RING].copy_(host[r:r + CHUNK])
    rate = n / (time.perf_counter() - t) / 1e9
    torch.cuda.synchronize()
    return rate


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/diag/host_cast.py needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = common.header("host-cast")
    host = pin_(torch.randn(N, N))
    ring = [pin_(torch.empty(CHUNK, N, dtype=torch.bfloat16)) for _ in range(RING)]
    dev = torch.empty(N, N, dtype=torch.bfloat16, device="cuda")
    land = [torch.empty(CHUNK, N, device="cuda") for _ in range(2)]
    out_pair = (torch.ones(1 << 30, device="cuda"), pin_(torch.empty(1 << 30)))
    in_pair = (pin_(torch.ones(1 << 30)), torch.empty(1 << 30, device="cuda"))
    default_threads = torch.get_num_threads()
    rows = []
    for th in THREADS:
        cast_alone(host, ring, th)   # warm-up (first touch of the ring)
        rates = [cast_alone(host, ring, th) for _ in range(3)]
        rows.append({"what": "cast alone", "threads": th, "gelem_s": statistics.median(rates)})
        print(rows[-1], flush=True)
    torch.set_num_threads(default_threads)
    rates = [cast_under_copies(host, ring, out_pair, in_pair) for _ in range(3)]
    rows.append({"what": "cast under copies both ways", "threads": default_threads,
                 "gelem_s": statistics.median(rates)})
    print(rows[-1], flush=True)
    hybrid(host, dev, land, ring, 0.5)   # warm-up
    ref = host.to(torch.bfloat16)
    for with_out in (False, True):
        for x in SHARES:
            rs = [hybrid(host, dev, land, ring, x, out_pair if with_out else None)
                  for _ in range(3)]
            r = sorted(rs, key=lambda r: r["seconds"])[1]
            r.update(what="hybrid", threads=default_threads,
                     exact=bool(torch.equal(dev[::4096].cpu(), ref[::4096])))
            rows.append(r)
            print(r, flush=True)
    doc["runs"] = rows
    doc["chunk_rows"], doc["ring"] = CHUNK, RING
    common.write(doc, f"host-cast-{common.machine_name()}")
    print(common.table(rows, ["what", "threads", "gelem_s", "x", "with_out", "seconds",
                              "fp32_equiv_gbps", "cast_busy_s", "n_cast", "exact"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
