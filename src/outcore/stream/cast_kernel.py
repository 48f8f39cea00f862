"""AdamW and the 16-bit cast of the weights in one pass over host memory (a C++ kernel).

With host_weight_copy the CPU keeps a bf16 copy of each block's weights for the loads that
need no fp32 (2 B/param over PCIe instead of 4). Made as torch's fused AdamW followed by a
cast, it slowed the CPU AdamW from 3.9 to 2.9 G params/s on the H200's 16 cores (session
8), and the CPU bounds the step. This kernel writes the copy as it writes the weights: on
the 2-core development machine (`bench/adamw_cast.py --params 40e6`, one run) torch's fused
AdamW ran 1.51 G params/s, with the cast after it 1.04, and this one pass 1.36 (0.90 of
the fused rate, against 0.69). On the H200's host (200M params, 16 threads) 3.69-3.86 G
params/s against torch's fused 4.29-4.95 alone, 2.46 against 2.74 beside copies both ways
(the four runs in bench/results/adamw-cast-h200*.json).

The update is torch.optim.AdamW's (decoupled weight decay, bias corrections, eps outside
the square root), in fp32; it matches torch's fused CPU kernel bit for bit in m, and in v
and the weights but for the last bit of a few elements (about 1 in 10^5 of v, 1 in 100 of
the weights after 4 steps). The cast rounds to
nearest even, as torch's `.to(bfloat16)`.

Built on first use with torch.utils.cpp_extension (a C++ compiler and ninja; about 25 s
the first time, then cached under torch's extensions directory) for the CPU it is built on
(-march=native: about 0.9 of the fused rate against 0.78 without, here); a home directory
shared by machines of different CPUs wants TORCH_EXTENSIONS_DIR set per machine. When it
cannot be built, `load()` returns None and says why once, and the engine casts after
torch's AdamW.
"""

from __future__ import annotations

import math
import threading
import warnings

import torch

_SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;   // round to nearest even
  uint32_t nan = (u >> 16) | 0x40u;                            // a NaN stays a NaN
  return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

static inline float load(const float* g, int64_t i) { return g[i]; }
static inline float load(const uint16_t* g, int64_t i) {   // bf16: the top half of a float
  uint32_t u = (uint32_t)g[i] << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Coef {   // the step's constants, in fp32
  float scale, one_minus_b1, b2, one_minus_b2, decay, bc2_sqrt, eps, step_size;
};

// One element's AdamW: m and v updated in place, the new weight returned.
template <typename G>
static inline float adam(float p, const G* __restrict__ g, float* __restrict__ m,
                         float* __restrict__ v, int64_t i, const Coef& c) {
  // torch's order of operations where it is known (its lerp and addcmul fuse a
  // multiply-add; -ffp-contract=off keeps every other one rounded on its own): m then
  // equals torch's fused AdamW bit for bit, v and the weights but for a few last bits
  float gi = load(g, i) * c.scale;
  float mi = std::fma(c.one_minus_b1, gi - m[i], m[i]);
  float vi = std::fma(c.one_minus_b2 * gi, gi, v[i] * c.b2);
  float pi = p * c.decay;
  pi = pi - c.step_size * (mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps));
  m[i] = mi;
  v[i] = vi;
  return pi;
}

// One element: m, v and p updated in place, the bf16 of the new p returned; inlined into
// the `omp simd` loops of run().
template <typename G>
static inline uint16_t update(float* __restrict__ p, const G* __restrict__ g,
                              float* __restrict__ m, float* __restrict__ v, int64_t i,
                              const Coef& c) {
  float pi = adam(p[i], g, m, v, i, c);
  p[i] = pi;
  return to_bf16(pi);
}

// The weights as halves (stream/halves.py): hi, the bf16 that rounds them to nearest even,
// and r = bits(p) - (hi << 16) in [-0x7fff, 0x7fff] once a tie (low half 0x8000) is moved
// one ulp towards hi; a NaN keeps hi a NaN.
static inline float join(uint16_t hi, int16_t r) {
  uint32_t u = ((uint32_t)hi << 16) + (uint32_t)(int32_t)r;
  float p;
  std::memcpy(&p, &u, 4);
  return p;
}

static inline void split(float p, uint16_t* hi, int16_t* r) {
  uint32_t u;
  std::memcpy(&u, &p, 4);
  uint32_t tie = (u & 0xffffu) == 0x8000u;
  u += tie * (((u >> 16) & 1u) * 2u - 1u);        // +1 if the tie rounds up, else -1
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  *hi = (uint16_t)(nan ? ((u >> 16) | 0x40u) : rounded);
  *r = (int16_t)(int32_t)(u - (rounded << 16));
}

template <typename G>
static void run(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m,
                float* __restrict__ v, uint16_t* __restrict__ out, int64_t n,
                const Coef& c, bool stream) {
  int64_t i = 0;
#if defined(__SSE2__)
  if (stream) {
    // The bf16 copy goes out by non-temporal stores: an ordinary store first reads each
    // line of `out` from memory (it is not cached: the DMA read it a step ago), 2 B/param
    // of host memory traffic the copies and this pass share. p, m, v are written where
    // they were just read, so their lines are in cache already.
    for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 15); ++i)
      out[i] = update(p, g, m, v, i, c);   // up to 7 elements to the first 16-byte line
    alignas(64) uint16_t tmp[64];
    for (; i + 64 <= n; i += 64) {
      #pragma omp simd
      for (int j = 0; j < 64; ++j) tmp[j] = update(p, g, m, v, i + j, c);
      for (int j = 0; j < 64; j += 8)
        _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + j),
                         _mm_load_si128(reinterpret_cast<const __m128i*>(tmp + j)));
    }
  }
#endif
  #pragma omp simd
  for (int64_t k = i; k < n; ++k) out[k] = update(p, g, m, v, k, c);
#if defined(__SSE2__)
  // Non-temporal stores are weakly ordered: fenced before parallel_for's join, after
  // which the caller records the copy as current and a DMA may read it.
  if (stream) _mm_sfence();
#endif
}

// In tiles of 256 through a buffer on the stack: three loops the compiler vectorizes (one
// loop doing all three did not vectorize, and ran 8x slower).
template <typename G>
static void run_halves(uint16_t* __restrict__ hi, int16_t* __restrict__ r,
                       const G* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                       int64_t n, const Coef& c) {
  alignas(64) float p[256];
  for (int64_t s = 0; s < n; s += 256) {
    const int64_t k = n - s < 256 ? n - s : 256;
    #pragma omp simd
    for (int64_t j = 0; j < k; ++j) p[j] = join(hi[s + j], r[s + j]);
    #pragma omp simd
    for (int64_t j = 0; j < k; ++j) p[j] = adam(p[j], g + s, m + s, v + s, j, c);
    #pragma omp simd
    for (int64_t j = 0; j < k; ++j) split(p[j], hi + s + j, r + s + j);
  }
}

// The step's constants, in fp32, from the caller's doubles.
static Coef coef(double lr, double b1, double b2, double eps, double wd, double bc1,
                 double bc2_sqrt, double scale) {
  return Coef{(float)scale, (float)(1.0 - b1), (float)b2, (float)(1.0 - b2),
              (float)(1.0 - lr * wd), (float)bc2_sqrt, (float)eps, (float)(lr / bc1)};
}

// body(G) with the gradient's data as fp32 or as bf16 (uint16_t) elements.
template <typename F>
static void with_grad(const torch::Tensor& g, F body) {
  TORCH_CHECK(g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16,
              "outcore AdamW kernel: an fp32 or bf16 gradient");
  if (g.scalar_type() == at::kBFloat16)
    body(reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()));
  else
    body(g.data_ptr<float>());
}

void adamw_halves(torch::Tensor hi, torch::Tensor r, torch::Tensor g, torch::Tensor m,
                  torch::Tensor v, double lr, double b1, double b2, double eps, double wd,
                  double bc1, double bc2_sqrt, double scale) {
  TORCH_CHECK(hi.is_contiguous() && r.is_contiguous() && g.is_contiguous() &&
              m.is_contiguous() && v.is_contiguous(), "adamw_halves: contiguous tensors");
  TORCH_CHECK(hi.scalar_type() == at::kBFloat16 && r.scalar_type() == at::kShort &&
              m.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
              (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16),
              "adamw_halves: bf16 hi, int16 r, fp32 m and v, fp32 or bf16 gradient");
  const int64_t n = hi.numel();
  TORCH_CHECK(r.numel() == n && g.numel() == n && m.numel() == n && v.numel() == n,
              "adamw_halves: sizes differ");
  uint16_t* H = reinterpret_cast<uint16_t*>(hi.data_ptr<at::BFloat16>());
  int16_t* R = r.data_ptr<int16_t>();
  float* M = m.data_ptr<float>();
  float* V = v.data_ptr<float>();
  const Coef c = coef(lr, b1, b2, eps, wd, bc1, bc2_sqrt, scale);
  pybind11::gil_scoped_release no_gil;   // as in adamw_cast
  with_grad(g, [&](auto G) {
    at::parallel_for(0, n, 1 << 16, [&](int64_t s, int64_t e) {
      run_halves(H + s, R + s, G + s, M + s, V + s, e - s, c);
    });
  });
}

void adamw_cast(torch::Tensor p, torch::Tensor g, torch::Tensor m, torch::Tensor v,
                torch::Tensor out, double lr, double b1, double b2, double eps, double wd,
                double bc1, double bc2_sqrt, double scale, bool stream) {
  TORCH_CHECK(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() &&
              v.is_contiguous() && out.is_contiguous(), "adamw_cast: contiguous tensors");
  TORCH_CHECK(p.scalar_type() == at::kFloat && m.scalar_type() == at::kFloat &&
              v.scalar_type() == at::kFloat && out.scalar_type() == at::kBFloat16 &&
              (g.scalar_type() == at::kFloat || g.scalar_type() == at::kBFloat16),
              "adamw_cast: fp32 state, fp32 or bf16 gradient, bf16 out");
  const int64_t n = p.numel();
  TORCH_CHECK(g.numel() == n && m.numel() == n && v.numel() == n && out.numel() == n,
              "adamw_cast: sizes differ");
  float* P = p.data_ptr<float>();
  float* M = m.data_ptr<float>();
  float* V = v.data_ptr<float>();
  uint16_t* O = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const Coef c = coef(lr, b1, b2, eps, wd, bc1, bc2_sqrt, scale);
  // The GIL is let go for the pass, as torch's own ops do: it runs on the CPU worker
  // thread, and holding the GIL for it (~25 ms a 3B block) kept the main thread from
  // launching the backward's kernels (session 10 on the H200: backward 0.89 s against
  // 0.70 s). Nothing below touches a Python object.
  pybind11::gil_scoped_release no_gil;
  with_grad(g, [&](auto G) {
    at::parallel_for(0, n, 1 << 16, [&](int64_t s, int64_t e) {
      // each thread's range shifted to 0: the stream path aligns on `out + i` itself
      run(P + s, G + s, M + s, V + s, O + s, e - s, c, stream);
    });
  });
}
"""

# The bf16 copy written by non-temporal stores (x86; elsewhere ignored): 2 B/param less
# host memory traffic where `out` is not in cache. Opt-in: on the H200's host (session 32,
# fp32 gradients) 8% faster alone, no faster beside copies both ways (bench/adamw_cast.py
# --copies, adamw-cast-h200-s32.json) or at 3b-16k in one round (bench/stream.py
# --copy-stores stream); with bf16 gradients, the engine's, 11% faster beside the copies
# (session 35, adamw-cast-h200-s35.json); in a 3b-16k step no faster (session 36: on one
# fixed plan 0.883 and 0.880 s against 0.871, stream-h200-ab-s36{e,f}-*.json).
STREAM_STORES = False

_lock = threading.Lock()
_built: dict = {}   # "mod": the extension or None once tried, "error": why it failed


def load(quiet: bool = False):
    """The built extension (module with `adamw_cast`), or None when it cannot be built
    (said once in a warning unless `quiet`: host_weight_copy="auto" then keeps no copies)."""
    with _lock:
        if "mod" not in _built:
            try:
                from torch.utils.cpp_extension import load_inline
                _built["mod"] = load_inline(
                    "outcore_adamw_cast", cpp_sources=_SRC,
                    functions=["adamw_cast", "adamw_halves"],
                    extra_cflags=["-O3", "-march=native", "-ffp-contract=off", "-fopenmp",
                                  "-fno-math-errno"],
                    extra_ldflags=["-fopenmp"], verbose=False)
            except Exception as e:   # no compiler, no ninja, a failed build: cast after
                _built["mod"] = None
                _built["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                if not quiet:
                    warnings.warn("outcore: the AdamW+cast kernel could not be built "
                                  f"({_built['error']}); the CPU casts after torch's AdamW")
        return _built["mod"]


def step_cast(mod, p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, *, lr: float, betas: tuple[float, float], eps: float,
              weight_decay: float, step: int, scale: float = 1.0,
              stream: bool | None = None) -> None:
    """AdamW step number `step` (1-based) of p with `grad` times `scale`, m and v in place,
    and out = p cast to bf16; every tensor flat, contiguous, on the CPU. grad: fp32, or
    bf16 (read as the fp32 of the same value: 2 B/param less to read). stream: write
    `out` by non-temporal stores (None: STREAM_STORES)."""
    b1, b2 = betas
    stream = STREAM_STORES if stream is None else stream
    mod.adamw_cast(p, grad, m, v, out, float(lr), float(b1), float(b2), float(eps),
                   float(weight_decay), 1.0 - b1 ** step, math.sqrt(1.0 - b2 ** step),
                   float(scale), bool(stream))


def step_halves(mod, hi: torch.Tensor, r: torch.Tensor, grad: torch.Tensor, m: torch.Tensor,
                v: torch.Tensor, *, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float, step: int, scale: float = 1.0) -> None:
    """step_cast's AdamW on weights held as halves (stream/halves.py: hi, the bf16 they
    round to, and r, their remainder; both updated in place): the pass reads and writes 4
    B/param of weights where step_cast reads 4 and writes 6. A measured prototype (bench/
    adamw_cast.py's "halves" way), not used by the engine."""
    b1, b2 = betas
    mod.adamw_halves(hi, r, grad, m, v, float(lr), float(b1), float(b2), float(eps),
                     float(weight_decay), 1.0 - b1 ** step, math.sqrt(1.0 - b2 ** step),
                     float(scale))
