// The causal depthwise convolution with SiLU (kernels/causal_conv_math.h) on the CPU, for both linear mixers
// (kernels/cpu/gated_delta_net.cpp, kernels/cpu/mamba.cpp): channels [at, at + Cc) of the rows x [rows, W]
// (W = s.width()), weights w [Cc, K], an optional bias [Cc]. Row by row with the taps contiguous over the
// channels; the weight gradient a block of channels per thread task, the rows in order: the results do not
// depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/activation_math.h"
#include "kernels/causal_conv_math.h"
#include "kernels/gated_delta_net.h"  // math::silu, silu_grad

namespace lattice::causal_conv {

inline constexpr int64_t kParallelMin = 32768;
inline constexpr int64_t kChannelBlock = 64;  // the weight gradient's channels per thread task

// w [Cc, K] as [K, Cc]: each tap's weights over the channels contiguous, as x's rows are.
inline std::vector<float> taps_by_channel(const float* w, int64_t Cc, int64_t K) {
  std::vector<float> wt(size_t(Cc * K));
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t j = 0; j < K; ++j) wt[size_t(j * Cc + c)] = w[c * K + j];
  return wt;
}

// pre [Cc]: the pre-activation at row n, every channel: the taps in order, then the bias (if any).
template <class Shape>
void pre_row(float* pre, const float* x, const float* wt, const float* bias, int64_t n, int64_t at, int64_t Cc,
             const Shape& s) {
  const int64_t W = s.width(), K = s.K;
  std::fill(pre, pre + Cc, 0.0f);
  for (int64_t j = math::causal_conv_first_tap(n, s); j < K; ++j) {
    const float* xr = x + (n - K + 1 + j) * W + at;
    const float* wj = wt + j * Cc;
    for (int64_t c = 0; c < Cc; ++c) pre[c] += wj[c] * xr[c];
  }
  if (bias)
    for (int64_t c = 0; c < Cc; ++c) pre[c] += bias[c];
}

// u [rows, Cc] = silu(conv(x) + bias).
template <class Shape>
void forward_silu(float* u, const float* x, const float* w, const float* bias, int64_t rows, int64_t at, int64_t Cc,
                  const Shape& s) {
  const std::vector<float> wt = taps_by_channel(w, Cc, s.K);
#pragma omp parallel for schedule(static) if (rows * Cc * s.K > kParallelMin)
  for (int64_t n = 0; n < rows; ++n) {
    float* un = u + n * Cc;
    pre_row(un, x, wt.data(), bias, n, at, Cc, s);
    for (int64_t c = 0; c < Cc; ++c) un[c] = math::silu(un[c]);
  }
}

// From du [rows, Cc]: dx's channels [at, at + Cc) written (its other columns left as they are), dw [Cc, K] and
// (with a bias) dbias [Cc] accumulated.
template <class Shape>
void backward_silu(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                   const float* bias, int64_t rows, int64_t at, int64_t Cc, const Shape& s) {
  const int64_t W = s.width(), K = s.K, T = s.T, N = rows;
  const std::vector<float> wt = taps_by_channel(w, Cc, K);
  // The pre-activation's gradient dp = du silu'(p), p recomputed, row by row.
  std::vector<float> dp(size_t(N * Cc));
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* dpn = dp.data() + n * Cc;
    pre_row(dpn, x, wt.data(), bias, n, at, Cc, s);
    for (int64_t c = 0; c < Cc; ++c) dpn[c] = du[n * Cc + c] * math::silu_grad(dpn[c]);
  }
  // dx[t] = sum_j w[j] dp[t + K - 1 - j] (within the sequence and the document), row by row, the taps in order.
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = n % T;
    float* dxn = dx + n * W + at;
    std::fill(dxn, dxn + Cc, 0.0f);
    for (int64_t j = std::max<int64_t>(0, t + K - T); j < K; ++j) {  // t + K - 1 - j within the sequence
      if (!s.same_document(n + K - 1 - j, n)) continue;
      const float* wj = wt.data() + j * Cc;
      const float* dpr = dp.data() + (n + K - 1 - j) * Cc;
      for (int64_t c = 0; c < Cc; ++c) dxn[c] += wj[c] * dpr[c];
    }
  }
  // dw[c, j] += sum_t dp[t] x[t - K + 1 + j], dbias[c] += sum_t dp[t].
  const int64_t blocks = (Cc + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(Cc, c0 + kChannelBlock) - c0;
    std::vector<float> acc(size_t((K + 1) * nc), 0.0f);  // [K, nc] then the bias's [nc]
    float* ab = acc.data() + K * nc;
    for (int64_t n = 0; n < N; ++n) {
      const float* dpn = dp.data() + n * Cc + c0;
      for (int64_t j = math::causal_conv_first_tap(n, s); j < K; ++j) {
        const float* xr = x + (n - K + 1 + j) * W + at + c0;
        float* aj = acc.data() + j * nc;
        for (int64_t c = 0; c < nc; ++c) aj[c] += dpn[c] * xr[c];
      }
      if (dbias)
        for (int64_t c = 0; c < nc; ++c) ab[c] += dpn[c];
    }
    for (int64_t c = 0; c < nc; ++c) {
      for (int64_t j = 0; j < K; ++j) dw[(c0 + c) * K + j] += acc[size_t(j * nc + c)];
      if (dbias) dbias[c0 + c] += ab[c];
    }
  }
}

}  // namespace lattice::causal_conv
