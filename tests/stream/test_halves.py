"""halves.py: fp32 weights as their bf16 and a 16-bit remainder, and the CPU AdamW pass
over them (cast_kernel.step_halves), against the one pass over fp32 weights."""

import torch

from outcore.stream import cast_kernel
from outcore.stream.halves import join, nudge_ties, split

BF16 = torch.bfloat16


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def specials() -> torch.Tensor:
    """Zeros, infinities, the largest float, subnormals, values that round up to inf, and
    ties of both parities and signs."""
    u = torch.tensor([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                      0x00000001, 0x80000001, 0x007FFFFF, 0x7F7F8000, 0x7F7F8001,
                      0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x00008000,
                      0x80008000, 0x3F807FFF, 0x3F808001], dtype=torch.int64)
    return u.to(torch.int32).view(torch.float32)     # two's complement wrap: the bits


def test_split_gives_the_cast_and_join_gives_the_weights_back():
    gen = torch.Generator().manual_seed(0)
    scales = torch.logspace(-30, 30, 61)
    p = torch.cat([torch.randn(61, 5000, generator=gen).mul(scales[:, None]).flatten(),
                   specials()])
    hi, r = split(p)
    assert hi.dtype == BF16 and r.dtype == torch.int16 and hi.shape == p.shape
    assert torch.equal(hi, p.to(BF16))             # round to nearest even, ties included
    q = nudge_ties(p)
    assert torch.equal(bits(join(hi, r)), bits(q))
    tie = (bits(p) & 0xFFFF) == 0x8000
    assert tie.sum() >= 8                          # the specials' ties at least
    assert torch.equal(bits(q)[~tie], bits(p)[~tie])
    assert ((bits(q) - bits(p))[tie].abs() == 1).all()          # one ulp
    assert torch.equal(q[tie].to(BF16), p[tie].to(BF16))       # towards their bf16
    nan = split(torch.tensor([float("nan"), -float("nan")]))
    assert torch.isnan(join(*nan)).all() and torch.isnan(nan[0].float()).all()


def test_the_pass_over_halves_writes_the_one_pass_weights_split():
    """Each step from the same weights, moments and gradient: the halves pass's hi and r
    are the one pass's new weights split (ties included), its m and v the same bits, and
    hi the one pass's bf16 copy."""
    mod = cast_kernel.load()
    assert mod is not None, cast_kernel._built.get("error")
    gen = torch.Generator().manual_seed(3)
    n = 1_000_003
    hi, r = split(torch.randn(n, generator=gen))
    m, v = torch.zeros(n), torch.zeros(n)
    kw = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    ties = 0
    for step in range(1, 4):
        grad = torch.randn(n, generator=gen).to(BF16 if step == 2 else torch.float32)
        p, m1, v1 = join(hi, r).clone(), m.clone(), v.clone()
        out = torch.empty(n, dtype=BF16)
        cast_kernel.step_cast(mod, p, grad, m1, v1, out, step=step, scale=0.5, **kw)
        cast_kernel.step_halves(mod, hi, r, grad, m, v, step=step, scale=0.5, **kw)
        want_hi, want_r = split(p)
        assert torch.equal(hi, want_hi) and torch.equal(r, want_r)
        assert torch.equal(hi, out)
        assert torch.equal(m, m1) and torch.equal(v, v1)
        ties += int(((bits(p) & 0xFFFF) == 0x8000).sum())
    assert ties > 0    # ~15 a step expected: the kernel's tie path ran
