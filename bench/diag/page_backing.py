"""Does how a host matrix's pages were made set the rate of its narrow-row 2-D copies? (GPU)

    PYTHONPATH=src python3 bench/diag/page_backing.py        # about a minute on one H200

bench/gemm.py's probe of 2-D copies of 8 KiB rows (rows 128 KiB apart) measured 33 GB/s
in four of its six runs of session 24's first call and 48-49 in the other two, each run a
fresh process with fresh host matrices; split_rows.py, in the same call, 54.5 for 8 KiB
rows 64 KiB apart. This allocates a 1 GiB host matrix TRIALS times in each of several
ways, registers it (cudaHostRegister, as outcore.memory.pin_ does) or takes it pinned
from torch, and times 2-D copies of 8 and 16 KiB rows at 64 and 128 KiB pitch each way
(median of RUNS): `torch` (torch.empty, filled by parallel copies: the bench's way),
`serial` (filled by one thread), `huge` (an anonymous mapping advised MADV_HUGEPAGE, 2 MiB
aligned: transparent huge pages, where the kernel allows them), `cudahost` (torch's pinned
allocator, cudaHostAlloc). Writes bench/results/page-backing-<machine>.json, a table last.
"""

from __future__ import annotations

import mmap
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from outcore.gemm.cudacopy import copy2d  # noqa: E402
from outcore.memory import pin_, unpin_  # noqa: E402

NBYTES = 1 << 30
TRIALS = 3
RUNS = 5
GEOMETRIES = ((8, 64), (8, 128), (16, 128))     # (row KiB, pitch KiB)
HUGE_PAGE = 2 << 20


def huge_empty(n: int) -> torch.Tensor:
    """n fp32 elements, uninitialized, in an anonymous mapping advised MADV_HUGEPAGE and
    2 MiB aligned (the tensor holds the mapping while any view of it lives)."""
    m = mmap.mmap(-1, n * 4 + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(m, dtype=torch.uint8)
    skip = (-whole.data_ptr()) % HUGE_PAGE
    return whole[skip:skip + n * 4].view(torch.float32)


def anon_huge_kib() -> int:
    """AnonHugePages of this process, KiB (transparent huge pages in use)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def make(kind: str):
    """A flat fp32 tensor of NBYTES made the `kind` way, filled."""
    n = NBYTES // 4
    if kind == "huge":
        t = huge_empty(n)
        t.fill_(1.0)
        return t
    if kind == "cudahost":
        t = torch.empty(n, pin_memory=True)
        t.fill_(1.0)
        return t
    t = torch.empty(n)
    if kind == "serial":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t.fill_(1.0)
        finally:
            torch.set_num_threads(threads)
    else:   # the bench's fill_: a head, copied along by torch's parallel copies
        t[:1 << 24].uniform_(-1, 1)
        done = 1 << 24
        while done < n:
            step = min(done, n - done)
            t[done:done + step].copy_(t[:step])
            done += step
    return t


def rates(flat: torch.Tensor, dev: torch.device) -> dict:
    """GB/s of 2-D copies each way for every geometry (median of RUNS, 4 copies a run)."""
    out = {}
    stream = torch.cuda.current_stream(dev)
    for row_kib, pitch_kib in GEOMETRIES:
        host = flat.view(-1, pitch_kib * 256)
        region = host[:, :row_kib * 256]
        dbuf = torch.empty(region.shape, device=dev)
        for way in ("h2d", "d2h"):
            got = []
            for _ in range(RUNS + 1):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(dev)   # host sync: each run starts on idle links
                a.record(stream)
                for _ in range(4):
                    ok = copy2d(dbuf, region, stream) if way == "h2d" else \
                        copy2d(region, dbuf, stream)
                    if not ok:
                        raise RuntimeError("no 2-D copy on this machine")
                b.record(stream)
                b.synchronize()               # host sync: the time is read right below
                got.append(4 * region.numel() * 4 / (a.elapsed_time(b) / 1e3) / 1e9)
            out[f"{way}_{row_kib}k_p{pitch_kib}k"] = statistics.median(got[1:])
        del dbuf
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("page_backing.py needs a GPU")
        return 1
    dev = torch.device("cuda", 0)
    rows = []
    for trial in range(TRIALS):
        for kind in ("torch", "serial", "huge", "cudahost"):
            before = anon_huge_kib()
            t = make(kind)
            huge_kib = anon_huge_kib() - before
            pinned = t if kind == "cudahost" else pin_(t)
            r = {"kind": kind, "trial": trial, "anon_huge_mib": huge_kib / 1024}
            r.update(rates(pinned, dev))
            rows.append(r)
            if kind != "cudahost":
                unpin_(pinned)
            del t, pinned
    doc = common.header("page-backing")
    doc["thp"], doc["nbytes"], doc["runs"] = thp_mode(), NBYTES, rows
    path = common.write(doc, f"page-backing-{common.machine_name()}")
    keys = [k for k in rows[0] if k.startswith(("h2d", "d2h"))]
    print(f"\nTHP: {doc['thp']}")
    print(f"{'kind':9s}{'trial':>6s}{'huge MiB':>9s}" + "".join(f"{k:>14s}" for k in keys))
    for r in rows:
        print(f"{r['kind']:9s}{r['trial']:>6d}{r['anon_huge_mib']:>9.0f}"
              + "".join(f"{r[k]:>14.1f}" for k in keys))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
