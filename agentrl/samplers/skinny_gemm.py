"""A compiled ``x @ W^T`` for a few rows of ``x`` (a decode step's), float32 on AVX2 CPUs.

A decode step of a small model at a GRPO batch (8-32 rows) is its weight matrices streamed
from memory once each, ~0.5 GB a step for SmolLM2-135M in float32. torch's CPU GEMMs (MKL,
oneDNN, packed or not) stream a cold ``[1536, 576]`` weight against 16 rows at ~6 GB/s on
the 2-core AVX2 machine, a third of what the cores read in a plain sum
(``benchmarks/sampler_profile.py --gemm``). This kernel is the loop such a shape wants:
each weight element is loaded once, broadcast, and multiplied into 8-32 accumulating
columns held in registers (the rows of ``x``, transposed and zero-padded to 8, 16 or 32,
stay in L1); the output rows are split over torch's intra-op threads.

It is built on first use with torch's C++ extension loader (g++, ``-O3 -mavx2 -mfma``;
a few seconds, cached on disk under :func:`agentrl.models.cache_root`; ``make setup``
builds it). :func:`available` is
False, with the reason logged once, on a machine without AVX2/FMA or a compiler, or when
the build fails; the caller keeps torch's GEMM. Results equal ``x @ W^T`` up to float32
summation order (``tests/samplers/test_skinny_gemm.py``).
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

// out[o, c] = sum_k w[o, k] * xt[k, c] for NV * 8 columns c, output rows [o0, o1).
template <int NV>
static void block(const float* w, const float* xt, float* out, int64_t K, int64_t o0, int64_t o1) {
  constexpr int NC = 8 * NV;   // columns (padded rows of x)
  constexpr int OB = 8 / NV;   // output rows a pass: OB * NV = 8 accumulators
  int64_t o = o0;
  for (; o + OB <= o1; o += OB) {
    __m256 acc[OB][NV];
    for (int i = 0; i < OB; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_ps();
    const float* wr = w + o * K;
    for (int64_t k = 0; k < K; ++k) {
      __m256 xv[NV];
      for (int j = 0; j < NV; ++j) xv[j] = _mm256_loadu_ps(xt + k * NC + 8 * j);
      for (int i = 0; i < OB; ++i) {
        const __m256 wb = _mm256_broadcast_ss(wr + i * K + k);
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_fmadd_ps(wb, xv[j], acc[i][j]);
      }
    }
    for (int i = 0; i < OB; ++i)
      for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + (o + i) * NC + 8 * j, acc[i][j]);
  }
  for (; o < o1; ++o) {  // the last output rows, one at a time
    __m256 acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
    const float* wr = w + o * K;
    for (int64_t k = 0; k < K; ++k) {
      const __m256 wb = _mm256_broadcast_ss(wr + k);
      for (int j = 0; j < NV; ++j)
        acc[j] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(xt + k * NC + 8 * j), acc[j]);
    }
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + o * NC + 8 * j, acc[j]);
  }
}

// x [R, K] float32 (R <= 32), w [O, K] float32 contiguous -> [O, C] with C = R rounded up
// to 8, 16 or 32; columns >= R are zero.
torch::Tensor skinny_mm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "skinny_mm: shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "skinny_mm: float32");
  TORCH_CHECK(w.is_contiguous(), "skinny_mm: contiguous weight");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "skinny_mm: CPU tensors");
  const int64_t R = x.size(0), K = x.size(1), O = w.size(0);
  TORCH_CHECK(R >= 1 && R <= 32, "skinny_mm: 1..32 rows");
  const int NV = R <= 8 ? 1 : (R <= 16 ? 2 : 4);
  const int64_t C = 8 * NV;
  auto xt = torch::zeros({K, C}, x.options());
  xt.narrow(1, 0, R).copy_(x.t());
  auto out = torch::empty({O, C}, x.options());
  const float* wp = w.data_ptr<float>();
  const float* xp = xt.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, O, 64, [&](int64_t o0, int64_t o1) {
    if (NV == 1) block<1>(wp, xp, op, K, o0, o1);
    else if (NV == 2) block<2>(wp, xp, op, K, o0, o1);
    else block<4>(wp, xp, op, K, o0, o1);
  });
  return out;
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
        functions=["skinny_mm"],
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
