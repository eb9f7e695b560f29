#include "kernels/layernorm.h"

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/row_sums.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace lattice {

namespace {

constexpr int kLanes = 16;

// Sum of x[0..C) with sixteen partial sums (vectorised; fixed order, so the result
// depends only on the data).
inline float lane_sum(const float* __restrict x, int64_t C) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[c + l];
  float s = 0.0f;
  for (; c < C; ++c) s += x[c];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

inline float lane_sum_sq_dev(const float* __restrict x, float mean, int64_t C) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float d = x[c + l] - mean;
      acc[l] += d * d;
    }
  float s = 0.0f;
  for (; c < C; ++c) s += (x[c] - mean) * (x[c] - mean);
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

}  // namespace

namespace {
// Two-pass statistics (mean, then the mean squared deviation): no cancellation for
// inputs with a large mean. out in fp32 or bf16.
template <class T>
void layernorm_rows(T* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N,
                    int64_t C, float eps, bool rms) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float* __restrict x_n = x + n * C;
    T* __restrict o_n = out + n * C;
    const float m = rms ? 0.0f : lane_sum(x_n, C) / float(C);  // RMSNorm: no mean
    const float var = lane_sum_sq_dev(x_n, m, C) / float(C);
    const float r = 1.0f / std::sqrt(var + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) math::store_as(o_n, c, (x_n[c] - m) * r * w[c] + b[c]);
    mean[n] = m;
    rstd[n] = r;
  }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps, Normalization kind) {
  LATTICE_KERNEL_ENTRY(cuda::layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, kind));
  layernorm_rows(out, mean, rstd, x, w, b, N, C, eps, kind == Normalization::rmsnorm);
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps, Normalization kind) {
  LATTICE_KERNEL_ENTRY(cuda::layernorm_forward_bf16(out, mean, rstd, x, w, b, N, C, eps, kind));
  layernorm_rows(out, mean, rstd, x, w, b, N, C, eps, kind == Normalization::rmsnorm);
}

// dx per row (parallel over rows); dw, db per column chunk summing rows in index
// order (parallel over columns), so all three are independent of the thread count.
namespace {
// dout[i] as the backward reads it: an fp32 value rounded by R, or a bf16 pattern.
template <Rounding R>
inline float dout_at(const float* d, int64_t i) {
  return math::round_as<R>(d[i]);
}
template <Rounding R>
inline float dout_at(const uint16_t* d, int64_t i) {
  return math::bf16_to_fp32(d[i]);
}

template <Rounding R, class T>
void layernorm_backward_rows(float* dx, float* dw, float* db, const T* dout, const float* x, const float* w,
                             const float* mean, const float* rstd, int64_t N, int64_t C, bool rms) {
  constexpr bool kConverted = R != Rounding::none || !std::is_same_v<T, float>;
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float* __restrict x_n = x + n * C;
    const float* __restrict d_n = nullptr;
    if constexpr (kConverted) {
      // The row's gradient rounded (or widened from bf16) into a buffer first: the loops
      // below are then the same code as for a gradient rounded by a pass of its own (the
      // same bits).
      thread_local std::vector<float> rounded;
      rounded.resize(size_t(C));
      float* __restrict rs = rounded.data();
      const T* __restrict src = dout + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) rs[c] = dout_at<R>(src, c);
      d_n = rs;
    } else {
      d_n = dout + n * C;
    }
    float* __restrict dx_n = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float acc_g[kLanes] = {}, acc_gx[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float g = d_n[c + l] * w[c + l];
        acc_g[l] += g;
        acc_gx[l] += g * (x_n[c + l] - m) * r;
      }
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (; c < C; ++c) {
      const float g = d_n[c] * w[c];
      sum_g += g;
      sum_gx += g * (x_n[c] - m) * r;
    }
    for (int l = 0; l < kLanes; ++l) {
      sum_g += acc_g[l];
      sum_gx += acc_gx[l];
    }
    const float mean_g = rms ? 0.0f : sum_g / float(C), mean_gx = sum_gx / float(C);  // RMSNorm: no mean term
#pragma omp simd
    for (int64_t k = 0; k < C; ++k) {
      const float xhat = (x_n[k] - m) * r;
      dx_n[k] += r * (d_n[k] * w[k] - mean_g - xhat * mean_gx);
    }
  }

  constexpr int64_t kChunk = 64;
  const int64_t chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kChunk, c1 = std::min(C, c0 + kChunk);
    float acc_w[kChunk] = {}, acc_b[kChunk] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* __restrict x_n = x + n * C;
      const T* __restrict d_n = dout + n * C;
      const float m = mean[n], r = rstd[n];
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        const float d = dout_at<R>(d_n, c);
        acc_w[c - c0] += d * (x_n[c] - m) * r;
        acc_b[c - c0] += d;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += acc_w[c - c0];
      db[c] += acc_b[c - c0];
    }
  }
}
}  // namespace

void layernorm_backward(float* dx, float* dw, float* db, LayerNormDout dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, ResidualGradOut next,
                        Normalization kind) {
  const bool rms = kind == Normalization::rmsnorm;
  LATTICE_CHECK((dout.f32 == nullptr) != (dout.bf16 == nullptr)) << "layernorm_backward: one output gradient";
  LATTICE_CHECK((next.bf16 == nullptr) == (next.bias_grad == nullptr))
      << "layernorm_backward: the residual gradient's bf16 cast and bias gradient go together";
  LATTICE_KERNEL_ENTRY(cuda::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C, next, kind));
  if (dout.bf16)
    layernorm_backward_rows<Rounding::none>(dx, dw, db, dout.bf16, x, w, mean, rstd, N, C, rms);
  else
    math::dispatch_rounding(dout.round, [&](auto r) {
      layernorm_backward_rows<decltype(r)::value>(dx, dw, db, dout.f32, x, w, mean, rstd, N, C, rms);
    });
  // The next layer's bias gradient and bf16 output gradient: bias_backward_cast_bf16 on dx.
  if (next.bf16)
    cpu::column_sums(next.bias_grad, next.bf16, N, C, [&](int64_t n, int64_t c0, int64_t, float*) { return dx + n * C + c0; });
}

}  // namespace lattice
