#!/usr/bin/env python3
"""bf16-32768 in whole-width strips with a lead of j strips, in an event model (CPU only).

    python3 bench/lead_model.py        # prints the end time for j = 1..5

The plan of record (2048 x 32768 strips, B 32768 x 32768 in four 8192-row pieces, A's
strips by rows, 4 accumulators, the last strip in 4 sub-strips) runs B's copies in first
and can finish no strip before all of B has landed. A lead of j strips loads their A
strips first and runs them piece by piece as B lands, so that fewer strips compute after
B. The rates are the timeline's of session 16 (`gemm-probe-h200-s16.json`, variant
a-rows): h2d 54 GB/s alone and 51.7 beside C's copies out, d2h 51.8 GB/s, the strips'
GEMMs 749 TFLOP/s; `--flops 801e12` gives DESIGN.md's in-core rate instead.
"""

from __future__ import annotations

import argparse

N, ROWS, PIECES, SUBS, ACCS = 32768, 2048, 4, 4, 4
STRIPS = N // ROWS
A_BYTES = ROWS * N * 4                 # one strip of fp32 A
B_PIECE = N // PIECES * N * 4          # one 8192-row piece of fp32 B
FLOP = 2.0 * ROWS * N * N              # one strip's GEMMs


def end_seconds(lead: int, h2d_alone: float, h2d_duplex: float, d2h: float,
                flops: float) -> tuple[float, float]:
    """(when the product ends, when B's last piece lands) for a lead of `lead` strips."""
    link = comp = out = 0.0
    landed, copied = {}, {}
    for s in range(lead):
        link += A_BYTES / h2d_alone
        landed[s] = link
    b_pieces = []
    for _ in range(PIECES):
        link += B_PIECE / h2d_alone
        b_pieces.append(link)
    for p in range(PIECES):                      # the lead, piece-major as B lands
        for s in range(lead):
            comp = max(comp, b_pieces[p], landed[s]) + FLOP / PIECES / flops
    for s in range(lead):                        # all of them are done when B is
        out = max(out, comp) + A_BYTES / d2h
        copied[s] = out
    for s in range(lead, STRIPS):                # the rest strip by strip
        link += A_BYTES / h2d_duplex
        landed[s] = link
        free = copied.get(s - ACCS, 0.0)         # its accumulator's last copy out
        if s < STRIPS - 1:
            comp = max(comp, landed[s], free) + FLOP / flops
            out = max(out, comp) + A_BYTES / d2h
        else:                                    # sub-strips start as their rows land
            for q in range(SUBS):
                rows_in = landed[s] - A_BYTES / h2d_duplex * (SUBS - 1 - q) / SUBS
                comp = max(comp, rows_in, free) + FLOP / SUBS / flops
                out = max(out, comp) + A_BYTES / SUBS / d2h
        copied[s] = out
    return max(comp, out), b_pieces[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flops", type=float, default=749e12)
    args = ap.parse_args()
    print(f"{'lead':>4} {'end ms':>7} {'B landed ms':>12}")
    for lead in range(1, 6):
        t, b = end_seconds(lead, 54e9, 51.7e9, 51.8e9, args.flops)
        print(f"{lead:>4} {t * 1e3:7.1f} {b * 1e3:12.1f}")


if __name__ == "__main__":
    main()
