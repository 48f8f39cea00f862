"""compute="tf32x3": fp32 products from three TF32 tensor-core GEMMs of split operands.

Each fp32 value x is split as it lands on the device into hi = x rounded to TF32 (10
mantissa bits, to nearest) and lo = x - hi (exact in fp32, |lo| <= 2^-11 |x|). Then

    a @ b  ~=  a_lo @ b_hi + a_hi @ b_lo + a_hi @ b_hi

in three TF32 GEMMs accumulating in fp32, small terms first. hi is exactly a TF32 value,
so the tensor cores read it without loss; lo loses at most 2^-11 of itself (about 2^-22 of
x) in its TF32 reading, and the dropped a_lo @ b_lo term is as small. The tensor cores
truncate their running fp32 sum where an fp32 GEMM rounds each add to nearest, so the
large term's GEMMs are kept short over K (BIG_CHUNK below).

Measured on the H200 (session 26; largest error relative to sum_k |a_ik b_kj| against
float64):
  - where a sum's terms mix signs (bench/gemm.py's record, gemm-h200.json, 20 fp32
    products with every element drawn uniform in [-1, 1), 256 sampled entries each, then
    1024-deep calls): 0.3-1.3x the error of outcore's own fp32 path and 0.7-3.8x
    cuBLASXt's (3.5e-8 to 1.25e-7); 512-deep calls halve it (tile-ab-h200-x3chunk.json);
  - where every term of a sum has one sign (A A^T, 4096 x 16384, bench/diag/x3_gram.py,
    x3-gram-h200.json), the truncations add up, about (BIG_CHUNK / 8) x 2^-24 of the sum:
    1.3e-5 at 2048-deep calls, 6.3e-6 at 1024, 3.0e-6 at 512 and 1.7e-6 at 256, against
    1.0e-6 to 1.8e-6 for outcore's fp32 path. So not fp32's accuracy there: within about
    3x at this module's 512.
  - speed (512-deep calls): 6-9% below 1024's in one process (tile-ab-h200-x3chunk.json);
    in session 26's record 1.8x cuBLASXt at 16384 and 32768, and 1.4-1.8x outcore's fp32
    path on the square and NN and NT shapes, 1.13-1.21x on TN (TF32 GEMMs with a
    transposed A run slower).
Not for data with infinities or values within 0.03% of fp32's largest (|x| above about
3.4025e38): hi rounds to infinity there and lo = x - hi is infinite or NaN, so the entries
they reach come out NaN, where an fp32 GEMM gives a finite value (x times a small number)
or an infinity. Mending it would cost a pass over every piece on the conversion stream
(a torch.where back to truncation); the fp32 and tf32 computes have no such limit.

Each block is split once, on the conversion stream, when its piece lands (loads.py), and
is cached as both parts (cache.py: a split slot is twice as long); the planner counts the
cache at 8 bytes per element (plan.cached_itemsize).
"""

from __future__ import annotations

import torch

from .mmacc import mm_acc

_HALF_ULP = 1 << 12          # half a TF32 ulp in fp32's bit pattern (13 mantissa bits dropped)
_KEEP = -(1 << 13)           # mask: sign, exponent and TF32's 10 mantissa bits


def split_(hi: torch.Tensor, lo: torch.Tensor) -> None:
    """hi (fp32, any strides) <- hi rounded to TF32, to nearest (ties away from zero);
    lo (same shape) <- what the rounding took off: old hi == hi + lo exactly."""
    lo.copy_(hi)
    bits = hi.view(torch.int32)   # same element size: a view of the same memory
    bits.add_(_HALF_ULP).bitwise_and_(_KEEP)
    lo.sub_(hi)


def lo_part(view: torch.Tensor, lo: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """The region of `lo` that `part` (a view into `view`) is of `view`: `view` and `lo`
    are laid out alike, so the same strides at the same offset from each one's start."""
    return lo.as_strided(part.shape, part.stride(),
                         lo.storage_offset() + part.storage_offset() - view.storage_offset())


# K one GEMM call of the large hi @ hi term sums at most (0: all of it). The H200's tensor
# cores truncate their running fp32 sum where an fp32 GEMM rounds each add to nearest, so
# the error of one call grows with its K; calls accumulate into C through the GEMM's
# epilogue, which rounds to nearest. In-core 4096^2 products against float64
# (bench/diag/x3_accuracy.py, session 25: x3-accuracy-h200-s25a.json for whole K,
# x3-accuracy-h200.json for the rest), largest error relative to sum |a||b| as a multiple
# of the fp32 GEMM's, and TFLOP/s:
#   K 16384:  whole 6.4x at 136;  4096-deep calls 1.5x at 123;  2048: 0.81x at 114;
#             1024: 0.40x at 109
#   K 65536:  whole 13.6x at 125; 4096: 0.80x at 119;  2048: 0.41x at 105;  1024: 0.21x at 103
# The small terms are 2^-11 as large, and so is their truncation: they stay whole.
# Through outcore (bench/gemm.py --x3-chunk, gemm-h200-s25-x3k{2048,1024}-{1,2}.json, one
# process each, two rounds), fp32-16384 and the fp32 NT and NN shapes at 16384 tokens and
# 8192 features, largest sampled error against float64 as a multiple of cuBLASXt's:
# 2048-deep calls 2.4-3.4x at 62-90 TFLOP/s, 1024-deep 1.4-1.7x at 75-87 (outcore's fp32
# path: 1.1-1.9x); 1024 also halved the error of the GPU test's small tiles.
# Session 26 (bench/diag/tile_ab.py, tile-ab-h200-x3chunk.json: five fp32 cases, 1024,
# 512 and 256 alternating in one process, 3 rounds of 3 runs): 512 ran 6-9% slower than
# 1024 (fp32-16384 83.1 TFLOP/s against 88.7) and 256 19-28% slower; the sampled errors
# halved from 1024 to 512 and fell by a third to a half from 512 to 256, as the one-signed
# sums' did (x3_gram.py: 6.2e-6, 3.1e-6, 1.7e-6). 512 keeps most of the speed for half
# the error.
BIG_CHUNK = 512


def split_calls(k: int) -> int:
    """GEMM calls mm_acc_split makes over K = k."""
    return 2 + -(-k // (BIG_CHUNK or k))


def mm_acc_split(acc: torch.Tensor, a: torch.Tensor, a_lo: torch.Tensor, b: torch.Tensor,
                 b_lo: torch.Tensor, alpha: float, beta: float) -> bool:
    """acc = alpha * (a + a_lo) @ (b + b_lo) + beta * acc, less alpha * a_lo @ b_lo.

    a: rows x k, b: k x cols (hi parts), a_lo and b_lo alike; the small terms first, so
    they are not rounded away against the large one in the fp32 accumulator, then the
    large one in calls of at most BIG_CHUNK of K. True where a GEMM ran on mm_acc's
    cuBLASLt fp32 kernel (never under TF32 on a GPU)."""
    lt = mm_acc(acc, a_lo, b, alpha, beta)
    lt |= mm_acc(acc, a, b_lo, alpha, 1.0)
    step = BIG_CHUNK or a.shape[1]
    for k0 in range(0, a.shape[1], step):
        lt |= mm_acc(acc, a[:, k0:k0 + step], b[k0:k0 + step], alpha, 1.0)
    return lt
