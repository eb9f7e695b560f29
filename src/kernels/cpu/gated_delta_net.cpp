#include "kernels/gated_delta_net.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
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
  causal_conv::forward_silu(u, x, w, nullptr, s.N(), 0, s.conv(), s);
}

void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_conv_backward(dx, dw, du, x, w, s));
  gdn_check_shape(s, "gdn_conv_backward");
  causal_conv::backward_silu(dx, dw, nullptr, du, x, w, nullptr, s.N(), 0, s.conv(), s);
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
