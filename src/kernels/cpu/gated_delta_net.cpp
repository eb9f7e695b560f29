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

void check_shape(const GdnShape& s, const char* what) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.Hk > 0 && s.Hv > 0 && s.Hv % s.Hk == 0 && s.Dk > 0 && s.Dv > 0 && s.K > 0 &&
                s.chunk > 0)
      << what << ": sequences " << s.B << " x " << s.T << ", key heads " << s.Hk << ", value heads " << s.Hv
      << ", head dims " << s.Dk << " and " << s.Dv << ", kernel " << s.K << ", chunk " << s.chunk;
}

}  // namespace

void gdn_conv_forward(float* u, const float* x, const float* w, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_conv_forward(u, x, w, s));
  check_shape(s, "gdn_conv_forward");
  const int64_t Cc = s.conv(), W = s.width(), K = s.K, T = s.T;
#pragma omp parallel for schedule(static) if (s.N() * Cc * K > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = 0; c < Cc; ++c) u[n * Cc + c] = math::silu(math::gdn_conv_pre(x, w, n, c, T, W, K));
}

void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_conv_backward(dx, dw, du, x, w, s));
  check_shape(s, "gdn_conv_backward");
  const int64_t Cc = s.conv(), W = s.width(), K = s.K, T = s.T;
  // The pre-activation's gradient dp = du silu'(p), p recomputed, per channel over every sequence.
  std::vector<float> dp(size_t(s.N() * Cc));
#pragma omp parallel for schedule(static) if (s.N() * Cc * K > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = 0; c < Cc; ++c)
      dp[size_t(n * Cc + c)] = du[n * Cc + c] * math::silu_grad(math::gdn_conv_pre(x, w, n, c, T, W, K));
  // dx[t] = sum_j w[j] dp[t + K - 1 - j] (within the sequence); dw[c, j] = sum_t dp[t] x[t - K + 1 + j].
#pragma omp parallel for schedule(static) if (s.N() * Cc * K > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n) {
    const int64_t t = n % T;
    for (int64_t c = 0; c < Cc; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t tt = t + K - 1 - j;
        if (tt < T) acc += w[c * K + j] * dp[size_t((n + K - 1 - j) * Cc + c)];
      }
      dx[n * W + c] = acc;
    }
  }
#pragma omp parallel for schedule(static) if (s.N() * Cc * K > kParallelMin)
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t j = 0; j < K; ++j) {
      float acc = 0.0f;
      for (int64_t n = 0; n < s.N(); ++n) {
        const int64_t t = n % T;
        if (t - K + 1 + j >= 0) acc += dp[size_t(n * Cc + c)] * x[(n - K + 1 + j) * W + c];
      }
      dw[c * K + j] += acc;
    }
}

void gdn_gates_forward(float* q, float* k, float* g, float* beta, const float* u, const float* x, const float* A_log,
                       const float* dt_bias, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_gates_forward(q, k, g, beta, u, x, A_log, dt_bias, s));
  check_shape(s, "gdn_gates_forward");
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
  check_shape(s, "gdn_gates_backward");
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

void gdn_delta_rule_forward(float* o, float* state, float* checkpoints, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, const GdnShape& s, bool from_state) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_delta_rule_forward(o, state, checkpoints, q, k, u, g, beta, s, from_state));
  check_shape(s, "gdn_delta_rule_forward");
  const int64_t T = s.T, Hv = s.Hv, Dk = s.Dk, Dv = s.Dv, Cc = s.conv(), S = s.state();
#pragma omp parallel for schedule(static) collapse(2) if (s.N() * Hv * S > kParallelMin)
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < Hv; ++h) {
      float* st = state + (b * Hv + h) * S;
      if (!from_state) std::fill(st, st + S, 0.0f);
      const int64_t kh = h / s.group();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t;
        if (checkpoints && t % s.chunk == 0)
          std::memcpy(checkpoints + ((b * Hv + h) * s.chunks() + t / s.chunk) * S, st, size_t(S) * sizeof(float));
        const float* kt = k + (n * s.Hk + kh) * Dk;
        const float* qt = q + (n * s.Hk + kh) * Dk;
        const float e = math::exp(g[n * Hv + h]), bt = beta[n * Hv + h];
        const float* v = u + n * Cc + 2 * s.qk() + h * Dv;
        float* out = o + (n * Hv + h) * Dv;
        for (int64_t j = 0; j < Dv; ++j) {
          float delta;
          out[j] = math::gdn_step(st + j * Dk, Dk, kt, qt, e, bt, v[j], delta);
        }
      }
    }
}

void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(
      cuda::gdn_delta_rule_backward(dq_v, dk_v, du, dg, dbeta, work, d_o, checkpoints, q, k, u, g, beta, s));
  check_shape(s, "gdn_delta_rule_backward");
  const int64_t T = s.T, Hv = s.Hv, Dk = s.Dk, Dv = s.Dv, Cc = s.conv(), S = s.state();
#pragma omp parallel for schedule(static) collapse(2) if (s.N() * Hv * S > kParallelMin)
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < Hv; ++h) {
      float* ds = work + (b * Hv + h) * (s.chunk + 1) * S;  // dS, then the chunk's states S_{t-1}
      float* states = ds + S;
      std::fill(ds, ds + S, 0.0f);
      const int64_t kh = h / s.group();
      std::vector<float> delta(static_cast<size_t>(Dv)), dkv(static_cast<size_t>(Dv));
      for (int64_t c = s.chunks(); c-- > 0;) {
        const int64_t t0 = c * s.chunk, t1 = std::min(T, t0 + s.chunk);
        std::memcpy(states, checkpoints + ((b * Hv + h) * s.chunks() + c) * S, size_t(S) * sizeof(float));
        for (int64_t t = t0; t + 1 < t1; ++t) {  // states[t - t0] = S_{t-1}
          const int64_t n = b * T + t;
          float* next = states + (t - t0 + 1) * S;
          std::memcpy(next, next - S, size_t(S) * sizeof(float));
          const float e = math::exp(g[n * Hv + h]), bt = beta[n * Hv + h];
          const float* v = u + n * Cc + 2 * s.qk() + h * Dv;
          for (int64_t j = 0; j < Dv; ++j) {
            float unused;
            math::gdn_step(next + j * Dk, Dk, k + (n * s.Hk + kh) * Dk, q + (n * s.Hk + kh) * Dk, e, bt, v[j], unused);
          }
        }
        for (int64_t t = t1; t-- > t0;) {
          const int64_t n = b * T + t;
          const float* col0 = states + (t - t0) * S;
          const float* kt = k + (n * s.Hk + kh) * Dk;
          const float* qt = q + (n * s.Hk + kh) * Dk;
          const float e = math::exp(g[n * Hv + h]), bt = beta[n * Hv + h];
          const float* v = u + n * Cc + 2 * s.qk() + h * Dv;
          const float* dot = d_o + (n * Hv + h) * Dv;
          float qk = 0.0f;
          for (int64_t i = 0; i < Dk; ++i) qk += qt[i] * kt[i];
          float db = 0.0f, dodelta = 0.0f;
          for (int64_t j = 0; j < Dv; ++j) {
            float dd, dv, dbj;
            math::gdn_step_back_delta(ds + j * Dk, col0 + j * Dk, Dk, kt, e, bt, v[j], dot[j], qk, delta[size_t(j)], dd,
                                      dv, dbj);
            du[n * Cc + 2 * s.qk() + h * Dv + j] = dv;
            dkv[size_t(j)] = -bt * dd;
            db += dbj;
            dodelta += dot[j] * delta[size_t(j)];
          }
          float* dqo = dq_v + (n * Hv + h) * Dk;
          float* dko = dk_v + (n * Hv + h) * Dk;
          for (int64_t i = 0; i < Dk; ++i) {
            float sq = 0.0f, sd = 0.0f, sk = 0.0f;
            for (int64_t j = 0; j < Dv; ++j) {
              sq += col0[j * Dk + i] * dot[j];
              sd += ds[j * Dk + i] * delta[size_t(j)];
              sk += col0[j * Dk + i] * dkv[size_t(j)];
            }
            dqo[i] = e * sq + kt[i] * dodelta;
            dko[i] = sd + qt[i] * dodelta + e * sk;
          }
          float de = 0.0f;
          for (int64_t j = 0; j < Dv; ++j)
            de += math::gdn_step_back_state(ds + j * Dk, col0 + j * Dk, Dk, qt, kt, e, dot[j], dkv[size_t(j)]);
          dg[n * Hv + h] = de * e;
          dbeta[n * Hv + h] = db;
        }
      }
    }
}

void gdn_sum_key_heads(float* d, const float* d_v, const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_sum_key_heads(d, d_v, s));
  check_shape(s, "gdn_sum_key_heads");
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
  check_shape(s, "gdn_output_gate_forward");
  const int64_t V = s.v(), W = s.width();
#pragma omp parallel for schedule(static) if (s.N() * V > kParallelMin)
  for (int64_t n = 0; n < s.N(); ++n)
    for (int64_t c = 0; c < V; ++c) y[n * V + c] = n_in[n * V + c] * math::silu(x[n * W + s.z_at() + c]);
}

void gdn_output_gate_backward(float* dn, float* dx, const float* dy, const float* n_in, const float* x,
                              const GdnShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::gdn_output_gate_backward(dn, dx, dy, n_in, x, s));
  check_shape(s, "gdn_output_gate_backward");
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
