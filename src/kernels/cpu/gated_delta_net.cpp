#include "kernels/gated_delta_net.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;

// w [Cc, K] as [K, Cc]: each tap's weights over the channels contiguous, as x's rows are.
std::vector<float> taps_by_channel(const float* w, int64_t Cc, int64_t K) {
  std::vector<float> wt(size_t(Cc * K));
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t j = 0; j < K; ++j) wt[size_t(j * Cc + c)] = w[c * K + j];
  return wt;
}

// pre [Cc]: the convolution's pre-activation at row n, every channel at once (math::gdn_conv_pre's sum,
// the taps in the same order).
void conv_pre_row(float* pre, const float* x, const float* wt, int64_t n, const GdnShape& s) {
  const int64_t Cc = s.conv(), W = s.width(), K = s.K;
  std::fill(pre, pre + Cc, 0.0f);
  for (int64_t j = math::gdn_conv_first_tap(n, s); j < K; ++j) {
    const float* xr = x + (n - K + 1 + j) * W;
    const float* wj = wt + j * Cc;
    for (int64_t c = 0; c < Cc; ++c) pre[c] += wj[c] * xr[c];
  }
}

constexpr int64_t kChannelBlock = 64;  // the weight gradient's channels per thread task

}  // namespace

void gdn_check_shape(const GdnShape& s, const char* what) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.Hk > 0 && s.Hv > 0 && s.Hv % s.Hk == 0 && s.Dk > 0 && s.Dv > 0 && s.K > 0 &&
                s.chunk > 0)
      << what << ": sequences " << s.B << " x " << s.T << ", key heads " << s.Hk << ", value heads " << s.Hv
      << ", head dims " << s.Dk << " and " << s.Dv << ", kernel " << s.K << ", chunk " << s.chunk;
}

void gdn_conv_forward(float* u, const float* x, const float* w, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_conv_forward(u, x, w, s));
  gdn_check_shape(s, "gdn_conv_forward");
  const int64_t Cc = s.conv();
  const std::vector<float> wt = taps_by_channel(w, Cc, s.K);
#pragma omp parallel for schedule(static) if (s.N() * Cc * s.K > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n) {
    float* un = u + n * Cc;
    conv_pre_row(un, x, wt.data(), n, s);
    for (int64_t c = 0; c < Cc; ++c) un[c] = math::silu(un[c]);
  }
}

void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_conv_backward(dx, dw, du, x, w, s));
  gdn_check_shape(s, "gdn_conv_backward");
  const int64_t Cc = s.conv(), W = s.width(), K = s.K, T = s.T, N = s.N();
  const std::vector<float> wt = taps_by_channel(w, Cc, K);
  // The pre-activation's gradient dp = du silu'(p), p recomputed, row by row.
  std::vector<float> dp(size_t(N * Cc));
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* dpn = dp.data() + n * Cc;
    conv_pre_row(dpn, x, wt.data(), n, s);
    for (int64_t c = 0; c < Cc; ++c) dpn[c] = du[n * Cc + c] * math::silu_grad(dpn[c]);
  }
  // dx[t] = sum_j w[j] dp[t + K - 1 - j] (within the sequence and the document), row by row, the taps in order.
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = n % T;
    float* dxn = dx + n * W;
    std::fill(dxn, dxn + Cc, 0.0f);
    for (int64_t j = std::max<int64_t>(0, t + K - T); j < K; ++j) {  // t + K - 1 - j within the sequence
      if (!s.same_document(n + K - 1 - j, n)) continue;
      const float* wj = wt.data() + j * Cc;
      const float* dpr = dp.data() + (n + K - 1 - j) * Cc;
      for (int64_t c = 0; c < Cc; ++c) dxn[c] += wj[c] * dpr[c];
    }
  }
  // dw[c, j] += sum_t dp[t] x[t - K + 1 + j]: a block of channels per task, the rows in order.
  const int64_t blocks = (Cc + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(Cc, c0 + kChannelBlock) - c0;
    std::vector<float> acc(size_t(K * nc), 0.0f);  // [K, nc]
    for (int64_t n = 0; n < N; ++n) {
      const float* dpn = dp.data() + n * Cc + c0;
      for (int64_t j = math::gdn_conv_first_tap(n, s); j < K; ++j) {
        const float* xr = x + (n - K + 1 + j) * W + c0;
        float* aj = acc.data() + j * nc;
        for (int64_t c = 0; c < nc; ++c) aj[c] += dpn[c] * xr[c];
      }
    }
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t j = 0; j < K; ++j) dw[(c0 + c) * K + j] += acc[size_t(j * nc + c)];
  }
}

void gdn_gates_forward(float* q, float* k, float* g, float* beta, const float* u, const float* x, const float* A_log,
                       const float* dt_bias, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_gates_forward(q, k, g, beta, u, x, A_log, dt_bias, s));
  gdn_check_shape(s, "gdn_gates_forward");
  const int64_t Cc = s.conv(), W = s.width(), Dk = s.Dk, QK = s.qk();
  const float scale = 1.0f / std::sqrt(float(Dk));
#pragma omp parallel for schedule(static) if (s.N() * Cc > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n) {
    for (int64_t h = 0; h < s.Hk; ++h) {
      math::gdn_l2norm_forward(q + (n * s.Hk + h) * Dk, u + n * Cc + h * Dk, Dk, scale);
      math::gdn_l2norm_forward(k + (n * s.Hk + h) * Dk, u + n * Cc + QK + h * Dk, Dk, 1.0f);
    }
    for (int64_t h = 0; h < s.Hv; ++h) {
      g[n * s.Hv + h] = math::gdn_decay(x[n * W + s.a_at() + h], A_log[h], dt_bias[h]);
      beta[n * s.Hv + h] = math::sigmoid(x[n * W + s.b_at() + h]);
    }
  }
}

void gdn_gates_backward(float* du, float* dx, float* dA_log, float* d_dt_bias, const float* dq, const float* dk,
                        const float* dg, const float* dbeta, const float* u, const float* x, const float* A_log,
                        const float* dt_bias, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_gates_backward(du, dx, dA_log, d_dt_bias, dq, dk, dg, dbeta, u, x, A_log, dt_bias, s));
  gdn_check_shape(s, "gdn_gates_backward");
  const int64_t Cc = s.conv(), W = s.width(), Dk = s.Dk, QK = s.qk();
  const float scale = 1.0f / std::sqrt(float(Dk));
#pragma omp parallel for schedule(static) if (s.N() * Cc > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n) {
    for (int part = 0; part < 2; ++part)
      for (int64_t h = 0; h < s.Hk; ++h)
        math::gdn_l2norm_backward(du + n * Cc + part * QK + h * Dk, u + n * Cc + part * QK + h * Dk,
                                  (part == 0 ? dq : dk) + (n * s.Hk + h) * Dk, Dk, part == 0 ? scale : 1.0f);
    for (int64_t h = 0; h < s.Hv; ++h) {
      dx[n * W + s.a_at() + h] = math::gdn_decay_grad(x[n * W + s.a_at() + h], A_log[h], dt_bias[h], dg[n * s.Hv + h]);
      dx[n * W + s.b_at() + h] = math::gdn_beta_grad(x[n * W + s.b_at() + h], dbeta[n * s.Hv + h]);
    }
  }
  // The per-head parameters' gradients, each summed over the rows in order.
  for (int64_t h = 0; h < s.Hv; ++h) {
    float da = 0.0f, ddt = 0.0f;
    for (int64_t n = 0; n < s.N(); ++n) {
      const float gn = dg[n * s.Hv + h];
      da += gn * math::gdn_decay(x[n * W + s.a_at() + h], A_log[h], dt_bias[h]);
      ddt += dx[n * W + s.a_at() + h];
    }
    dA_log[h] += da;
    d_dt_bias[h] += ddt;
  }
}

void gdn_sum_key_heads(float* d, const float* d_v, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_sum_key_heads(d, d_v, s));
  gdn_check_shape(s, "gdn_sum_key_heads");
  const int64_t Dk = s.Dk, G = s.group();
#pragma omp parallel for schedule(static) if (s.N() * s.Hv * Dk > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t h = 0; h < s.Hk; ++h)
      for (int64_t i = 0; i < Dk; ++i) {
        float acc = 0.0f;
        for (int64_t r = 0; r < G; ++r) acc += d_v[(n * s.Hv + h * G + r) * Dk + i];
        d[(n * s.Hk + h) * Dk + i] = acc;
      }
}

void gdn_output_gate_forward(float* y, const float* n_in, const float* x, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_output_gate_forward(y, n_in, x, s));
  gdn_check_shape(s, "gdn_output_gate_forward");
  const int64_t V = s.v(), W = s.width();
#pragma omp parallel for schedule(static) if (s.N() * V > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = 0; c < V; ++c) y[n * V + c] = n_in[n * V + c] * math::silu(x[n * W + s.z_at() + c]);
}

void gdn_output_gate_backward(float* dn, float* dx, const float* dy, const float* n_in, const float* x,
                              const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_output_gate_backward(dn, dx, dy, n_in, x, s));
  gdn_check_shape(s, "gdn_output_gate_backward");
  const int64_t V = s.v(), W = s.width();
#pragma omp parallel for schedule(static) if (s.N() * V > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = 0; c < V; ++c) {
      const float z = x[n * W + s.z_at() + c], d = dy[n * V + c];
      dx[n * W + s.z_at() + c] = d * n_in[n * V + c] * math::silu_grad(z);
      dn[n * V + c] = d * math::silu(z);
    }
}

}  // namespace lattice
