#!/usr/bin/env python3
"""Where the compute stream idles in a profiled stream step (read offline, on any machine).

    python3 bench/diag/timeline.py bench/results/stream-timeline-outcore-3b-16384.json.gz

Reads the compact timeline that bench/stream.py --profile writes (common.trace_timeline)
and prints, per step: its span, the compute stream's busy time, its idle time by phase
(forward, backward, between them and around the step's edges) and the longest idle gaps
with what the copy streams and the host were doing meanwhile.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict


def load(path: str) -> list[list]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["rows"]


def busy_in(iv: list[tuple[float, float]], a: float, b: float) -> float:
    """Time of the intervals `iv` inside [a, b)."""
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in iv)


def phase_at(phases: list[tuple[float, float, str]], t: float) -> str:
    """The device-side phase (forward_block.g / backward_block.g) open at t, else the last
    one that closed before t (as 'after ...')."""
    last = None
    for s, e, name in phases:
        if s <= t < e:
            return name
        if e <= t:
            last = name
    return f"after {last}" if last else "before any"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline")
    ap.add_argument("--gap-ms", type=float, default=0.3, help="gaps listed from this long")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = load(args.timeline)
    kern = defaultdict(list)
    copies = {"h2d": [], "d2h": []}
    for st, s, d, cat, name, nbytes in rows:
        if cat == "kernel":
            kern[st].append((s, s + d, name))
        elif cat == "gpu_memcpy":
            key = "h2d" if "HtoD" in name else "d2h" if "DtoH" in name else None
            if key:
                copies[key].append((s, s + d))
    comp = max(kern, key=lambda k: sum(e - s for s, e, _ in kern[k]))
    ks = sorted(kern[comp])
    # the phases as the device saw them (from the first to the last op launched in each)
    phases = sorted((s, s + d, name.removeprefix("outcore.")) for st, s, d, cat, name, _ in rows
                    if cat == "gpu_user_annotation" and "_block." in name)
    host = [(s, s + d, name) for st, s, d, cat, name, _ in rows if st == -1]
    fwd = [int(n.split(".")[1]) for _, _, n in phases if n.startswith("forward_block.")]
    first = f"forward_block.{min(fwd)}" if fwd else None
    starts = [s for s, _, n in phases if n == first]
    print(f"compute stream {comp}: {len(ks)} kernels; {len(starts)} steps start in the "
          f"trace; copies: h2d {len(copies['h2d'])}, d2h {len(copies['d2h'])}")
    edges = starts + [ks[-1][1]]
    for q, (a, b) in enumerate(zip(edges, edges[1:])):
        iv = [(s, e) for s, e, _ in ks if a <= s < b]
        busy = sum(e - s for s, e in iv)
        gaps = [(iv[i + 1][0] - iv[i][1], iv[i][1], iv[i + 1][0]) for i in range(len(iv) - 1)]
        if iv and q < len(edges) - 2:   # up to the next step's first kernel
            gaps.append((b - iv[-1][1], iv[-1][1], b))
        by_phase = defaultdict(float)
        for g, s, e in gaps:
            ph = phase_at(phases, s + 1e-3)
            by_phase[ph.split(".")[0] if not ph.startswith("after") else "between"] += g
        print(f"\nstep {q}: span {(b - a) / 1e3:.1f} ms, compute busy {busy / 1e3:.1f} ms, "
              f"idle {(b - a - busy) / 1e3:.1f} ms: " + ", ".join(
                  f"{k} {v / 1e3:.1f}" for k, v in sorted(by_phase.items())))
        print(f"  h2d busy {busy_in(copies['h2d'], a, b) / 1e3:.1f} ms, d2h busy "
              f"{busy_in(copies['d2h'], a, b) / 1e3:.1f} ms")
        fwd = [(s, e) for s, e, n in phases if a <= s < b and n.startswith("forward")]
        bwd = [(s, e) for s, e, n in phases if a <= s < b and n.startswith("backward")]
        if fwd and bwd:
            print(f"  forward {(fwd[-1][1] - fwd[0][0]) / 1e3:.1f} ms, backward "
                  f"{(bwd[-1][1] - bwd[0][0]) / 1e3:.1f} ms (device phases, first to last)")
        long = sorted((g for g in gaps if g[0] >= args.gap_ms * 1e3), reverse=True)[:args.top]
        for g, s, e in sorted(long, key=lambda x: x[1]):
            hc = [f"{n} {busy_in([(hs, he)], s, e) / 1e3:.1f}" for hs, he, n in host
                  if hs < e and he > s and not n.startswith("outcore.")][:3]
            print(f"  gap {g / 1e3:5.2f} ms at {(s - a) / 1e3:6.1f} ms in "
                  f"{phase_at(phases, s + 1e-3):22s} h2d {busy_in(copies['h2d'], s, e) / g:4.0%}"
                  f" d2h {busy_in(copies['d2h'], s, e) / g:4.0%}  host: {'; '.join(hc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
