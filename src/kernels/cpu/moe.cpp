#include "kernels/moe.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

namespace lattice {

void moe_gather_rows(float* xe, const float* x, const int32_t* rows, int64_t S, int64_t C, const float* w) {
  LATTICE_KERNEL_ENTRY(cuda::moe_gather_rows(xe, x, rows, S, C, w));
#pragma omp parallel for schedule(static) if (S * C > 32768)
  for (int64_t s = 0; s < S; ++s) {
    const float* __restrict src = x + int64_t(rows[s]) * C;
    float* __restrict dst = xe + s * C;
    if (w) {
      const float ws = w[s];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dst[c] = ws * src[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
    }
  }
}

void moe_combine(float* out, const float* ye, const int32_t* slot_of, const float* w, int64_t N, int64_t k, int64_t C,
                 bool accumulate) {
  LATTICE_KERNEL_ENTRY(cuda::moe_combine(out, ye, slot_of, w, N, k, C, accumulate));
#pragma omp parallel for schedule(static) if (N * k * C > 32768)
  for (int64_t t = 0; t < N; ++t) {
    float* __restrict o = out + t * C;
    if (!accumulate)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = slot_of[t * k + j];
      if (s < 0) continue;  // dropped (over its expert's capacity)
      const float* __restrict y = ye + s * C;
      const float ws = w ? w[s] : 1.0f;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += ws * y[c];
    }
  }
}

void moe_combine_backward(float* d_ye, float* d_w, const float* dout, const float* ye, const float* w,
                          const int32_t* rows, int64_t S, int64_t C) {
  LATTICE_KERNEL_ENTRY(cuda::moe_combine_backward(d_ye, d_w, dout, ye, w, rows, S, C));
#pragma omp parallel for schedule(static) if (S * C > 32768)
  for (int64_t s = 0; s < S; ++s) {
    const float* __restrict d = dout + int64_t(rows[s]) * C;
    const float* __restrict y = ye + s * C;
    float dot = 0.0f;
    if (d_ye) {
      float* __restrict dy = d_ye + s * C;
      const float ws = w[s];
      for (int64_t c = 0; c < C; ++c) {
        dy[c] = ws * d[c];
        dot += d[c] * y[c];
      }
    } else {
      for (int64_t c = 0; c < C; ++c) dot += d[c] * y[c];
    }
    d_w[s] = dot;
  }
}

}  // namespace lattice
