"""Compiled float32 decode kernels for AVX2 CPUs: a few-row ``x @ W^T`` and a whole
decode step of a Llama-family model.

A decode step of a small model at a GRPO batch (8-32 rows) is its weight matrices streamed
from memory once each, ~0.5 GB a step for SmolLM2-135M in float32. torch's CPU GEMMs (MKL,
oneDNN, packed or not) stream a cold ``[1536, 576]`` weight against 16 rows at ~6 GB/s on
the 2-core AVX2 machine, a third of what the cores read in a plain sum
(``benchmarks/sampler_profile.py --gemm``). :func:`skinny_linear` is the loop such a shape
wants: each weight element is loaded once, broadcast, and multiplied into 8-32
accumulating columns held in registers (the rows of ``x``, transposed and zero-padded to 8,
16 or 32, stay in L1); the output rows are split over torch's intra-op threads.

Around those GEMMs the rest of a step is ~35 small torch ops a layer (norms, RoPE,
attention over the cache, SiLU, residual adds), ~1,000 a step for 30 layers, each paying
Python and dispatch cost on tensors of a few KB. :func:`decode_step` runs the whole step
(:class:`agentrl.samplers.fast_decode.FastDecoder` prepares its arguments) as one call:
the hidden state stays transposed between the layers (the GEMMs' input layout), the
element-wise work is fused into passes over it, attention is one pass per row and
key/value head (AVX2 dot products and exponentials), the new keys/values are written into
the sampler's cache buffers, and the head's GEMM writes ``[rows, vocab]`` logits directly.
Both calls release the GIL while they compute.

They are built on first use with torch's C++ extension loader (g++, ``-O3 -mavx2 -mfma``;
under a minute, cached on disk under :func:`agentrl.models.cache_root`; ``make setup``
builds them). :func:`available` is False, with the reason logged once, on a machine
without AVX2/FMA or a compiler, when the build fails, or with ``AGENTRL_SKINNY_GEMM=0``;
the caller keeps torch's ops. Results equal ``x @ W^T`` and the Python step up to float32
summation order (``tests/samplers/test_skinny_gemm.py``, ``test_fast_decode.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch
from torch import Tensor

from agentrl.cpu import cpu_flags

log = logging.getLogger(__name__)

MAX_ROWS = 32  # above this many rows torch's GEMM is as fast (the rows no longer fit registers)
STALE_LOCK_S = 120.0  # a build takes seconds; a lock file older than this was left by a kill

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <vector>

// bf16 (ties to even, as torch's cast), kept in a float32: the upper 16 bits of the value
static inline __m256 bf16r(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_and_si256(
      _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))),
      _mm256_set1_epi32((int)0xFFFF0000u));
  // a NaN stays a NaN (the rounding could carry its payload into the exponent)
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), nan);
}

static inline float bf16r(float x) {
  if (std::isnan(x)) return x;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &b, 4);
  return x;
}

// a float32 holding a bf16 value <-> its bf16 bits
static inline uint16_t bf16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (uint16_t)(b >> 16);
}

static inline float bf16_float(uint16_t h) {
  const uint32_t b = (uint32_t)h << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

static inline __m256 load8_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128((const __m128i*)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// n floats of x rounded to bf16 in place
static inline void round_bf16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, bf16r(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = bf16r(x[i]);
}

// out[o, c] = sum_k w[o, k] * xt[k, c] for NV * 8 columns c, output rows [o0, o1).
// ROWMAJOR: out[c, o] instead (an [R, O] result), for the columns c < R only.
// ROUND: each weight is rounded to bf16 as it is loaded (the float32 weight is not changed).
template <int NV, bool ROWMAJOR, bool ROUND>
static void block(const float* w, const float* xt, float* out, int64_t K, int64_t o0, int64_t o1,
                  int64_t R, int64_t O) {
  constexpr int NC = 8 * NV;   // columns (padded rows of x)
  constexpr int OB = 8 / NV;   // output rows a pass: OB * NV = 8 accumulators
  auto store = [&](int64_t o, int j, __m256 acc) {
    if (!ROWMAJOR) {
      _mm256_storeu_ps(out + o * NC + 8 * j, acc);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc);
      for (int c = 0; c < 8 && 8 * j + c < R; ++c) out[(8 * j + c) * O + o] = tmp[c];
    }
  };
  int64_t o = o0;
  for (; o + OB <= o1; o += OB) {
    __m256 acc[OB][NV];
    for (int i = 0; i < OB; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
    const float* wr = w + o * K;
    int64_t k = 0;
    if (ROUND) {  // 8 weights of each output row rounded at a time, then broadcast
      alignas(32) float wt[OB][8];
      for (; k + 8 <= K; k += 8) {
        for (int i = 0; i < OB; ++i) _mm256_store_ps(wt[i], bf16r(_mm256_loadu_ps(wr + i * K + k)));
        for (int kk = 0; kk < 8; ++kk) {
          __m256 xv[NV];
          for (int j = 0; j < NV; ++j) xv[j] = _mm256_loadu_ps(xt + (k + kk) * NC + 8 * j);
          for (int i = 0; i < OB; ++i) {
            const __m256 wb = _mm256_broadcast_ss(&wt[i][kk]);
            for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(wb, xv[j], acc[i][j]);
          }
        }
      }
    }
    for (; k < K; ++k) {
      __m256 xv[NV];
      for (int j = 0; j < NV; ++j) xv[j] = _mm256_loadu_ps(xt + k * NC + 8 * j);
      for (int i = 0; i < OB; ++i) {
        const __m256 wb = ROUND ? _mm256_set1_ps(bf16r(wr[i * K + k])) : _mm256_broadcast_ss(wr + i * K + k);
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(wb, xv[j], acc[i][j]);
      }
    }
    for (int i = 0; i < OB; ++i)
      for (int j = 0; j < NV; ++j) store(o + i, j, acc[i][j]);
  }
  for (; o < o1; ++o) {  // the last output rows, one at a time
    __m256 acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
    const float* wr = w + o * K;
    for (int64_t k = 0; k < K; ++k) {
      const __m256 wb = ROUND ? _mm256_set1_ps(bf16r(wr[k])) : _mm256_broadcast_ss(wr + k);
      for (int j = 0; j < NV; ++j)
        acc[j] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(xt + k * NC + 8 * j), acc[j]);
    }
    for (int j = 0; j < NV; ++j) store(o, j, acc[j]);
  }
}

// One weight of a GEMM whose weights share an input: rows [0, rows) of w into out.
struct Seg {
  const float* w;
  float* out;
  int64_t rows;
};

template <int NV, bool ROWMAJOR, bool ROUND>
static void gemm_nv(const std::vector<Seg>& segs, const float* xt, int64_t K, int64_t R) {
  int64_t total = 0;
  for (const Seg& s : segs) total += s.rows;
  // one parallel region for all the weights: their output rows split over the threads
  at::parallel_for(0, total, 64, [&](int64_t b, int64_t e) {
    int64_t base = 0;
    for (const Seg& s : segs) {
      const int64_t s0 = std::max(b, base), s1 = std::min(e, base + s.rows);
      if (s0 < s1) block<NV, ROWMAJOR, ROUND>(s.w, xt, s.out, K, s0 - base, s1 - base, R, s.rows);
      base += s.rows;
    }
  });
}

template <bool ROWMAJOR = false, bool ROUND = false>
static void gemm(const std::vector<Seg>& segs, const float* xt, int64_t K, int64_t R, int NV) {
  if (NV == 1) gemm_nv<1, ROWMAJOR, ROUND>(segs, xt, K, R);
  else if (NV == 2) gemm_nv<2, ROWMAJOR, ROUND>(segs, xt, K, R);
  else gemm_nv<4, ROWMAJOR, ROUND>(segs, xt, K, R);
}

static int columns_nv(int64_t R) { return R <= 8 ? 1 : (R <= 16 ? 2 : 4); }

// e^x for 8 floats (Cephes' expf: a degree-6 polynomial on x - n ln2, scaled by 2^n; within
// 2 ulp of expf; inputs clamped to [-87.3, 88.3], so e^x of a very negative x is ~1e-38)
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), s1);
  }
  for (; d + 8 <= n; d += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
  float s = hsum8(_mm256_add_ps(s0, s1));
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

// acc[0, n) += p * v[0, n)
static inline void axpy(float* acc, float p, const float* v, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
  for (; d < n; ++d) acc[d] += p * v[d];
}

// the same two over bf16 keys/values (a rounded step's cache)
static inline float dot(const float* a, const uint16_t* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), load8_bf16(b + d), s0);
  float s = hsum8(s0);
  for (; d < n; ++d) s += a[d] * bf16_float(b[d]);
  return s;
}

static inline void axpy(float* acc, float p, const uint16_t* v, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, load8_bf16(v + d), _mm256_loadu_ps(acc + d)));
  for (; d < n; ++d) acc[d] += p * bf16_float(v[d]);
}

// a key/value element as the cache holds it: float32, or bf16 bits (rounded)
static inline float to_kv(float x, float*) { return x; }
static inline uint16_t to_kv(float x, uint16_t*) { return bf16_bits(bf16r(x)); }

// x [R, K] float32 (R <= 32), w [O, K] float32 contiguous -> [O, C] with C = R rounded up
// to 8, 16 or 32; columns >= R are zero.
torch::Tensor skinny_mm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "skinny_mm: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "skinny_mm: float32");
  TORCH_CHECK(w.is_contiguous(), "skinny_mm: contiguous weight");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "skinny_mm: CPU tensors");
  const int64_t R = x.size(0), K = x.size(1), O = w.size(0);
  TORCH_CHECK(R >= 1 && R <= 32, "skinny_mm: 1..32 rows");
  pybind11::gil_scoped_release no_gil;  // other Python threads run meanwhile
  const int NV = columns_nv(R);
  const int64_t C = 8 * NV;
  auto xt = torch::zeros({K, C}, x.options());
  xt.narrow(1, 0, R).copy_(x.t());
  auto out = torch::empty({O, C}, x.options());
  gemm({{w.data_ptr<float>(), out.data_ptr<float>(), O}}, xt.data_ptr<float>(), K, R, NV);
  return out;
}

// RMSNorm of the columns c < R of ht [H, C] (the hidden state, transposed), scaled by w,
// into xt [H, C]; the other columns of xt are zero.
static void rms_norm_t(const float* ht, const float* w, float eps, float* xt, int64_t H,
                       int64_t C, int64_t R) {
  float ss[32] = {0}, inv[32] = {0};
  for (int64_t j = 0; j < H; ++j)
    for (int64_t c = 0; c < C; ++c) ss[c] += ht[j * C + c] * ht[j * C + c];
  for (int64_t c = 0; c < R; ++c) inv[c] = 1.0f / std::sqrt(ss[c] / H + eps);
  for (int64_t j = 0; j < H; ++j)
    for (int64_t c = 0; c < C; ++c) xt[j * C + c] = ht[j * C + c] * inv[c] * w[j];
}

static void check_weight(const torch::Tensor& t, int64_t rows, int64_t cols, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              "decode_step: ", what, " must be a contiguous float32 CPU tensor");
  TORCH_CHECK(t.dim() == (cols ? 2 : 1) && t.size(0) == rows && (!cols || t.size(1) == cols),
              "decode_step: ", what, " has shape ", t.sizes());
}

// One decode step of a Llama-family model for R <= 32 rows, float32 (ROUND: as CPU bf16
// autocast computes it over float32 weights, see decode_step below): the layers (RMSNorm,
// q/k/v with optional biases, RoPE from the given cos/sin, grouped-query attention over the
// cache plus this step, o with optional bias, SiLU-gated MLP), the final norm and the head.
// The hidden state stays transposed ([H, C], the GEMMs' input layout) between the layers.
// w: 13 tensors a layer (ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, wg, wu, wd; a bias of
// no elements is none); f: 3 a layer (eps1, eps2, attention scale). kbuf/vbuf [R, kv_heads,
// capacity, D] (last dimension contiguous) get this step's keys/values at lengths[i]; pads:
// each row's leading cache columns that attention skips. Returns the logits [R, vocab].
template <bool ROUND, typename KV>
static torch::Tensor decode_impl(torch::Tensor h, torch::Tensor cos, torch::Tensor sin,
                                 std::vector<int64_t> pads, std::vector<torch::Tensor> w,
                                 std::vector<double> f, std::vector<torch::Tensor> kbufs,
                                 std::vector<torch::Tensor> vbufs, std::vector<int64_t> lengths,
                                 int64_t heads, int64_t kv_heads, int64_t D, torch::Tensor norm,
                                 double norm_eps, torch::Tensor head) {
  const int64_t R = h.size(0), H = h.size(1), layers = (int64_t)kbufs.size();
  TORCH_CHECK(R >= 1 && R <= 32, "decode_step: 1..32 rows");
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.dim() == 2, "decode_step: h float32 [R, H]");
  TORCH_CHECK((int64_t)w.size() == 13 * layers && (int64_t)f.size() == 3 * layers &&
                  (int64_t)vbufs.size() == layers && (int64_t)lengths.size() == layers,
              "decode_step: per-layer argument counts");
  TORCH_CHECK((int64_t)pads.size() == R, "decode_step: one pad count a row");
  TORCH_CHECK(heads % kv_heads == 0 && D % 2 == 0 && D <= 1024, "decode_step: head layout");
  cos = cos.contiguous();
  sin = sin.contiguous();
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.numel() == R * D && sin.numel() == R * D,
              "decode_step: cos/sin float32 [R, D]");
  const int NV = columns_nv(R);
  const int64_t C = 8 * NV, QO = heads * D, KO = kv_heads * D, group = heads / kv_heads;
  const int64_t I = layers ? w[10].size(0) : 0, half = D / 2;
  auto opts = h.options();
  auto ht_ = torch::zeros({H, C}, opts);
  auto xt_ = torch::zeros({H, C}, opts);
  auto qkv_ = torch::empty({QO + 2 * KO, C}, opts);
  auto att_ = torch::zeros({QO, C}, opts);
  auto o_ = torch::empty({H, C}, opts);
  auto gu_ = torch::empty({2 * I, C}, opts);
  float *ht = ht_.data_ptr<float>(), *xt = xt_.data_ptr<float>(), *qkv = qkv_.data_ptr<float>();
  float *att = att_.data_ptr<float>(), *ob = o_.data_ptr<float>(), *gu = gu_.data_ptr<float>();
  const float *cs = cos.data_ptr<float>(), *sn = sin.data_ptr<float>();
  {
    auto hc = h.contiguous();
    const float* hp = hc.data_ptr<float>();
    for (int64_t c = 0; c < R; ++c)
      for (int64_t j = 0; j < H; ++j) ht[j * C + c] = hp[c * H + j];
  }
  // a GEMM's output rows [rows, C] plus the bias, if any; ROUND: the bias rounded to bf16
  // and the sum too (autocast's bf16 linear: one float32 accumulation, one rounding)
  auto add_bias = [&](float* out, const torch::Tensor& bias, int64_t rows) {
    if (bias.numel()) {
      const float* b = bias.data_ptr<float>();
      for (int64_t j = 0; j < rows; ++j) {
        const float bj = ROUND ? bf16r(b[j]) : b[j];
        for (int64_t c = 0; c < R; ++c) out[j * C + c] += bj;
      }
    }
    if (ROUND) round_bf16(out, rows * C);
  };
  // out[j, c] (+ bias[j]) added to the hidden state (float32, as autocast keeps it), c < R
  auto residual = [&](float* out, const torch::Tensor& bias) {
    add_bias(out, bias, H);
    for (int64_t j = 0; j < H; ++j)
      for (int64_t c = 0; c < R; ++c) ht[j * C + c] += out[j * C + c];
  };
  // the normed hidden state as a GEMM input: ROUND rounds it to bf16
  auto norm_in = [&](const float* weight, float eps) {
    rms_norm_t(ht, weight, eps, xt, H, C, R);
    if (ROUND) round_bf16(xt, H * C);
  };
  // RoPE on heads [nh] of x [nh * D, C]: x*cos + rotate_half(x)*sin, per row c
  auto rope = [&](float* x, int64_t nh) {
    for (int64_t hd = 0; hd < nh; ++hd)
      for (int64_t d = 0; d < half; ++d) {
        float *a = x + (hd * D + d) * C, *b = x + (hd * D + d + half) * C;
        for (int64_t c = 0; c < R; ++c) {
          const float x1 = a[c], x2 = b[c];
          a[c] = x1 * cs[c * D + d] + (-x2) * sn[c * D + d];
          b[c] = x2 * cs[c * D + d + half] + x1 * sn[c * D + d + half];
        }
      }
  };
  for (int64_t i = 0; i < layers; ++i) {
    const torch::Tensor* lw = &w[13 * i];
    const float eps1 = f[3 * i], eps2 = f[3 * i + 1], scale = f[3 * i + 2];
    check_weight(lw[0], H, 0, "input_layernorm");
    check_weight(lw[1], QO, H, "q_proj");
    check_weight(lw[3], KO, H, "k_proj");
    check_weight(lw[5], KO, H, "v_proj");
    check_weight(lw[7], H, QO, "o_proj");
    check_weight(lw[9], H, 0, "post_attention_layernorm");
    check_weight(lw[10], I, H, "gate_proj");
    check_weight(lw[11], I, H, "up_proj");
    check_weight(lw[12], H, I, "down_proj");
    for (int b : {2, 4, 6, 8})
      if (lw[b].numel()) check_weight(lw[b], b == 2 ? QO : (b == 8 ? H : KO), 0, "a bias");
    const torch::Tensor &kb_ = kbufs[i], &vb_ = vbufs[i];
    const int64_t L = lengths[i] + 1;  // after this step's append
    for (const torch::Tensor* t : {&kb_, &vb_})
      TORCH_CHECK(t->scalar_type() == (ROUND ? at::kBFloat16 : at::kFloat) && t->dim() == 4 && t->size(0) == R &&
                      t->size(1) == kv_heads && t->size(3) == D && t->stride(3) == 1 &&
                      lengths[i] >= 0 && L <= t->size(2),
                  "decode_step: cache buffer of layer ", i, " has shape ", t->sizes(),
                  " for length ", lengths[i]);
    for (int64_t c = 0; c < R; ++c)
      TORCH_CHECK(pads[c] >= 0 && pads[c] < L, "decode_step: pad count ", pads[c], " of row ", c);

    // attention
    norm_in(lw[0].data_ptr<float>(), eps1);
    float *q = qkv, *k = qkv + QO * C, *v = qkv + (QO + KO) * C;
    gemm<false, ROUND>({{lw[1].data_ptr<float>(), q, QO}, {lw[3].data_ptr<float>(), k, KO},
                        {lw[5].data_ptr<float>(), v, KO}}, xt, H, R, NV);
    add_bias(q, lw[2], QO);
    add_bias(k, lw[4], KO);
    add_bias(v, lw[6], KO);
    rope(q, heads);  // in float32 on the bf16 q/k, as autocast's float32 cos/sin promote them
    rope(k, kv_heads);
    if (ROUND) round_bf16(q, QO * C);  // the bf16 query attention takes (keys: as stored)
    KV *kb = (KV*)kb_.data_ptr(), *vb = (KV*)vb_.data_ptr();
    const int64_t k0 = kb_.stride(0), k1 = kb_.stride(1), k2 = kb_.stride(2);
    const int64_t v0 = vb_.stride(0), v1 = vb_.stride(1), v2 = vb_.stride(2);
    for (int64_t c = 0; c < R; ++c)
      for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t d = 0; d < D; ++d) {
          kb[c * k0 + g * k1 + lengths[i] * k2 + d] = to_kv(k[(g * D + d) * C + c], kb);
          vb[c * v0 + g * v1 + lengths[i] * v2 + d] = to_kv(v[(g * D + d) * C + c], vb);
        }
    at::parallel_for(0, R * kv_heads, 1, [&](int64_t b, int64_t e) {
      std::vector<float> score(L), qv(D), acc(D);
      for (int64_t idx = b; idx < e; ++idx) {
        const int64_t c = idx / kv_heads, g = idx % kv_heads, pad = pads[c];
        const KV* kr = kb + c * k0 + g * k1;
        const KV* vr = vb + c * v0 + g * v1;
        for (int64_t m = 0; m < group; ++m) {
          const int64_t hd = g * group + m;
          for (int64_t d = 0; d < D; ++d) qv[d] = q[(hd * D + d) * C + c];
          float top = -std::numeric_limits<float>::infinity();
          for (int64_t l = pad; l < L; ++l) {
            score[l] = dot(qv.data(), kr + l * k2, D) * scale;
            top = std::max(top, score[l]);
          }
          float sum = 0.f;
          int64_t l = pad;
          for (; l + 8 <= L; l += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(&score[l]), _mm256_set1_ps(top)));
            _mm256_storeu_ps(&score[l], e);
            sum += hsum8(e);
          }
          for (; l < L; ++l) sum += (score[l] = std::exp(score[l] - top));
          std::fill(acc.begin(), acc.end(), 0.f);
          for (l = pad; l < L; ++l) axpy(acc.data(), score[l] / sum, vr + l * v2, D);
          for (int64_t d = 0; d < D; ++d) att[(hd * D + d) * C + c] = ROUND ? bf16r(acc[d]) : acc[d];
        }
      }
    });
    gemm<false, ROUND>({{lw[7].data_ptr<float>(), ob, H}}, att, QO, R, NV);
    residual(ob, lw[8]);

    // MLP
    norm_in(lw[9].data_ptr<float>(), eps2);
    gemm<false, ROUND>({{lw[10].data_ptr<float>(), gu, I}, {lw[11].data_ptr<float>(), gu + I * C, I}},
                       xt, H, R, NV);
    if (ROUND) round_bf16(gu, 2 * I * C);
    for (int64_t j = 0; j < I * C; j += 8) {  // silu(gate) * up; C is a multiple of 8
      const __m256 g = _mm256_loadu_ps(gu + j);
      const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
      __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
      if (ROUND) silu = bf16r(silu);  // bf16 silu, then a bf16 product
      const __m256 prod = _mm256_mul_ps(silu, _mm256_loadu_ps(gu + I * C + j));
      _mm256_storeu_ps(gu + j, ROUND ? bf16r(prod) : prod);
    }
    gemm<false, ROUND>({{lw[12].data_ptr<float>(), ob, H}}, gu, I, R, NV);
    residual(ob, torch::Tensor());
  }
  check_weight(norm, H, 0, "the final norm");
  TORCH_CHECK(head.dim() == 2, "decode_step: head [vocab, H]");
  check_weight(head, head.size(0), H, "the head");
  norm_in(norm.data_ptr<float>(), (float)norm_eps);
  const int64_t V = head.size(0);
  auto logits = torch::empty({R, V}, opts);
  gemm<true, ROUND>({{head.data_ptr<float>(), logits.data_ptr<float>(), V}}, xt, H, R, NV);
  if (ROUND) round_bf16(logits.data_ptr<float>(), R * V);
  return logits;
}

// rounded: the step as CPU bf16 autocast computes it over these float32 weights (every GEMM
// on bf16-rounded operands with float32 accumulation and a bf16 result, bf16 keys/values in
// bf16 cache buffers, attention and SiLU results in bf16, the residual stream and the norms
// in float32), with each weight rounded as it is loaded: no bf16 copy of the weights.
torch::Tensor decode_step(torch::Tensor h, torch::Tensor cos, torch::Tensor sin,
                          std::vector<int64_t> pads, std::vector<torch::Tensor> w,
                          std::vector<double> f, std::vector<torch::Tensor> kbufs,
                          std::vector<torch::Tensor> vbufs, std::vector<int64_t> lengths,
                          int64_t heads, int64_t kv_heads, int64_t D, torch::Tensor norm,
                          double norm_eps, torch::Tensor head, bool rounded) {
  pybind11::gil_scoped_release no_gil;  // the event loop and other threads run meanwhile
  if (rounded)
    return decode_impl<true, uint16_t>(h, cos, sin, pads, w, f, kbufs, vbufs, lengths, heads,
                                       kv_heads, D, norm, norm_eps, head);
  return decode_impl<false, float>(h, cos, sin, pads, w, f, kbufs, vbufs, lengths, heads,
                                   kv_heads, D, norm, norm_eps, head);
}
"""

_lock = threading.Lock()
_module: Any = None
_broken: str | None = None


def _build() -> Any:
    from torch.utils import cpp_extension

    from agentrl.models import cache_root

    build_dir = cache_root() / "kernels" / f"skinny_gemm-torch{torch.__version__}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch's loader serialises builds with a `lock` file and waits while it exists: one
    # left by a process killed mid-build would make every later start wait forever
    lock = build_dir / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
            log.warning("removed a stale build lock %s", lock)
    except FileNotFoundError:
        pass
    return cpp_extension.load_inline(
        name="agentrl_skinny_gemm",
        cpp_sources=[_SOURCE],
        functions=["skinny_mm", "decode_step"],
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        verbose=False,
    )


def available() -> bool:
    """Whether the kernel runs here (built on the first call; False, logged once, if not)."""
    global _module, _broken
    if _module is not None:
        return True
    if _broken is not None:
        return False
    with _lock:
        if _module is None and _broken is None:
            why = ""
            if os.environ.get("AGENTRL_SKINNY_GEMM", "1") == "0":
                why = "AGENTRL_SKINNY_GEMM=0"
            elif not {"avx2", "fma"} <= cpu_flags():
                why = "the CPU has no AVX2/FMA"
            else:
                try:
                    _module = _build()
                except Exception as e:  # no compiler, a failed build: torch's GEMM stays
                    why = f"the build failed ({type(e).__name__}: {str(e)[:300]})"
            if why:
                _broken = why
                log.info("skinny decode GEMM not used: %s", why)
    return _module is not None


def skinny_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight^T`` ``[rows, out]`` (a transposed view) for 1..:data:`MAX_ROWS` rows of
    float32 `x` on CPU and a contiguous float32 `weight`; :func:`available` must be True."""
    rows = x.shape[0]
    return _module.skinny_mm(x, weight)[:, :rows].t()


def usable(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`skinny_linear` takes this call (shape, dtype, device, layout)."""
    return (
        1 <= x.shape[0] <= MAX_ROWS
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.is_contiguous()
        and available()
    )


def decode_step(
    h: Tensor,
    cos: Tensor,
    sin: Tensor,
    pads: list[int],
    tensors: list[Tensor],
    scalars: list[float],
    room: list[tuple[Tensor, Tensor, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    norm: Tensor,
    eps: float,
    head: Tensor,
    rounded: bool = False,
) -> Tensor:
    """The logits ``[rows, vocab]`` of one decode step of a Llama-family model in one
    compiled call (:class:`agentrl.samplers.fast_decode.FastDecoder` prepares the arguments):
    `h` the embedded tokens ``[rows, hidden]``, `cos`/`sin` their RoPE ``[rows, 1, head_dim]``,
    `pads` each row's left-padding columns, `tensors`/`scalars` 13 tensors and 3 floats a
    layer, `room` each layer's ``(key buffer, value buffer, length)`` (the step's keys and
    values are written at `length`), then the final norm's weight and epsilon and the head.
    `rounded`: the step as CPU bf16 autocast computes it over these float32 weights (GEMMs
    on bf16-rounded operands, each weight rounded as it is loaded, float32 accumulation,
    bf16 results; the cache buffers in bf16; the residual stream and norms in float32).
    :func:`available` must be True."""
    rows = h.shape[0]
    return _module.decode_step(
        h,
        cos.reshape(rows, head_dim),
        sin.reshape(rows, head_dim),
        [int(p) for p in pads],
        tensors,
        scalars,
        [k for k, _, _ in room],
        [v for _, v, _ in room],
        [n for _, _, n in room],
        heads,
        kv_heads,
        head_dim,
        norm,
        float(eps),
        head,
        bool(rounded),
    )
