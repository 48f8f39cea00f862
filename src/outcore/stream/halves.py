"""fp32 weights as two 16-bit halves: the bf16 they round to, and what remains.

    hi = bf16(p)                 round to nearest even, as torch casts: what bf16 compute
                                 would load, with no separate 16-bit copy of the weights
    r  = bits(p) - (bits(hi) << 16)    int16

A tie (the low 16 bits of p exactly 0x8000) would need r = +-0x8000 beside the 65535 other
values, one more than 16 bits hold, so such a p is first moved one ulp towards hi (2^-16 of
random weights; the fp32 AdamW's own rounding is that size every step). `join` then gives
that p back bit for bit; hi is the bf16 of the weight either way. A NaN stays a NaN.

Measured as a prototype only (bench/adamw_cast.py's "halves" way and
cast_kernel.step_halves): the CPU AdamW pass over halves moves 26 B/param of host memory
where the one pass with a 16-bit copy moves 28-30.
"""

from __future__ import annotations

import torch


def nudge_ties(p: torch.Tensor) -> torch.Tensor:
    """p (fp32) with every tie moved one ulp towards the bf16 it rounds to (a new tensor)."""
    u = p.contiguous().view(torch.int32)
    tie = (u & 0xFFFF) == 0x8000
    odd = (u >> 16) & 1            # bit 16: the truncated half is odd, so the tie rounds up
    return (u + tie.to(torch.int32) * (2 * odd - 1)).view(torch.float32)


def split(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p (fp32, any shape) -> (hi bf16, r int16) of its shape."""
    q = nudge_ties(p)
    hi = q.to(torch.bfloat16)
    r = q.view(torch.int32) - (hi.view(torch.int16).to(torch.int32) << 16)
    return hi, r.to(torch.int16)


def join(hi: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """(hi bf16, r int16) -> the fp32 weights they hold."""
    u = (hi.view(torch.int16).to(torch.int32) << 16) + r.to(torch.int32)
    return u.view(torch.float32)
