// Mamba-2's kernels on the CPU (kernels/mamba.h). The scan runs token by token, each (sequence, head) one
// thread's work in the forward and each (sequence, group) in the backward (its heads in order, so that the
// group's B and C gradients are summed without a race), the per-head parameters' gradients summed per
// sequence and then over the sequences in order: the results do not depend on the thread count.
#include "kernels/mamba.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
constexpr int64_t kChannelBlock = 64;  // the convolution weight gradient's channels per thread task

// w [Cc, K] as [K, Cc]: each tap's weights over the channels contiguous, as x's rows are.
std::vector<float> taps_by_channel(const float* w, int64_t Cc, int64_t K) {
  std::vector<float> wt(size_t(Cc * K));
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t j = 0; j < K; ++j) wt[size_t(j * Cc + c)] = w[c * K + j];
  return wt;
}

// pre [Cc]: the convolution's pre-activation at row n, every channel (math::mamba_conv_pre's sum, the taps
// in the same order, then the bias).
void conv_pre_row(float* pre, const float* x, const float* wt, const float* bias, int64_t n, const MambaShape& s) {
  const int64_t Cc = s.conv(), W = s.width(), K = s.K;
  std::fill(pre, pre + Cc, 0.0f);
  for (int64_t j = math::mamba_conv_first_tap(n, s); j < K; ++j) {
    const float* xr = x + (n - K + 1 + j) * W + s.x_at();
    const float* wj = wt + j * Cc;
    for (int64_t c = 0; c < Cc; ++c) pre[c] += wj[c] * xr[c];
  }
  for (int64_t c = 0; c < Cc; ++c) pre[c] += bias[c];
}

// The state after row n's step from S (the state before it) in place: S = a S + dt xs B^T.
void scan_step(float* S, const float* xs, const float* Bg, float a, float dt, const MambaShape& s) {
  const int64_t P = s.P, Ns = s.N;
  for (int64_t p = 0; p < P; ++p) {
    float* row = S + p * Ns;
    const float dx = dt * xs[p];
    for (int64_t m = 0; m < Ns; ++m) row[m] = a * row[m] + dx * Bg[m];
  }
}

}  // namespace

void mamba_check_shape(const MambaShape& s, const char* what) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.P > 0 && s.G > 0 && s.H % s.G == 0 && s.N > 0 && s.K > 0 &&
                s.chunk > 0)
      << what << ": sequences " << s.B << " x " << s.T << ", heads " << s.H << " of " << s.P << ", groups " << s.G
      << ", state " << s.N << ", kernel " << s.K << ", chunk " << s.chunk;
}

void mamba_conv_forward(float* u, const float* x, const float* w, const float* bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_conv_forward(u, x, w, bias, s));
  mamba_check_shape(s, "mamba_conv_forward");
  const int64_t Cc = s.conv();
  const std::vector<float> wt = taps_by_channel(w, Cc, s.K);
#pragma omp parallel for schedule(static) if (s.rows() * Cc * s.K > kParallelMin)
  for (int64_t n = 0; n < s.rows(); ++n) {
    float* un = u + n * Cc;
    conv_pre_row(un, x, wt.data(), bias, n, s);
    for (int64_t c = 0; c < Cc; ++c) un[c] = math::silu(un[c]);
  }
}

void mamba_conv_backward(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                         const float* bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_conv_backward(dx, dw, dbias, du, x, w, bias, s));
  mamba_check_shape(s, "mamba_conv_backward");
  const int64_t Cc = s.conv(), W = s.width(), K = s.K, T = s.T, N = s.rows(), at = s.x_at();
  const std::vector<float> wt = taps_by_channel(w, Cc, K);
  // The pre-activation's gradient dp = du silu'(p), p recomputed, row by row.
  std::vector<float> dp(size_t(N * Cc));
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    float* dpn = dp.data() + n * Cc;
    conv_pre_row(dpn, x, wt.data(), bias, n, s);
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
  // dw[c, j] += sum_t dp[t] x[t - K + 1 + j], dbias[c] += sum_t dp[t]: a block of channels per task, the
  // rows in order.
  const int64_t blocks = (Cc + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (N * Cc * K > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(Cc, c0 + kChannelBlock) - c0;
    std::vector<float> acc(size_t((K + 1) * nc), 0.0f);  // [K, nc] then the bias's [nc]
    float* ab = acc.data() + K * nc;
    for (int64_t n = 0; n < N; ++n) {
      const float* dpn = dp.data() + n * Cc + c0;
      for (int64_t j = math::mamba_conv_first_tap(n, s); j < K; ++j) {
        const float* xr = x + (n - K + 1 + j) * W + at + c0;
        float* aj = acc.data() + j * nc;
        for (int64_t c = 0; c < nc; ++c) aj[c] += dpn[c] * xr[c];
      }
      for (int64_t c = 0; c < nc; ++c) ab[c] += dpn[c];
    }
    for (int64_t c = 0; c < nc; ++c) {
      for (int64_t j = 0; j < K; ++j) dw[(c0 + c) * K + j] += acc[size_t(j * nc + c)];
      dbias[c0 + c] += ab[c];
    }
  }
}

void mamba_dt_forward(float* dt, const float* x, const float* dt_bias, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_dt_forward(dt, x, dt_bias, s));
  mamba_check_shape(s, "mamba_dt_forward");
  const int64_t W = s.width(), H = s.H;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < H; ++h) dt[n * H + h] = math::softplus(x[n * W + s.dt_at() + h] + dt_bias[h]);
}

void mamba_dt_backward(float* dx, float* d_dt_bias, const float* d_dt, const float* x, const float* dt_bias,
                       const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_dt_backward(dx, d_dt_bias, d_dt, x, dt_bias, s));
  mamba_check_shape(s, "mamba_dt_backward");
  const int64_t W = s.width(), H = s.H;
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t h = 0; h < H; ++h)
      dx[n * W + s.dt_at() + h] = d_dt[n * H + h] * math::sigmoid(x[n * W + s.dt_at() + h] + dt_bias[h]);
  for (int64_t h = 0; h < H; ++h) {  // summed over the rows in order
    float acc = 0.0f;
    for (int64_t n = 0; n < s.rows(); ++n) acc += dx[n * W + s.dt_at() + h];
    d_dt_bias[h] += acc;
  }
}

void mamba_scan_forward(float* y, float* checkpoints, const float* u, const float* dt, const float* A_log,
                        const float* D, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_scan_forward(y, checkpoints, u, dt, A_log, D, s));
  mamba_check_shape(s, "mamba_scan_forward");
  const int64_t H = s.H, P = s.P, Ns = s.N, Cc = s.conv(), S = s.state(), hpg = s.heads_per_group();
#pragma omp parallel for schedule(static) if (s.rows() * H * S > kParallelMin)
  for (int64_t bh = 0; bh < s.B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, g = h / hpg;
    const float A = -math::exp(A_log[h]);
    std::vector<float> state(size_t(S), 0.0f);
    for (int64_t t = 0; t < s.T; ++t) {
      const int64_t n = b * s.T + t;
      if (checkpoints && t % s.chunk == 0)
        std::memcpy(checkpoints + ((b * H + h) * s.chunks() + t / s.chunk) * S, state.data(), size_t(S) * sizeof(float));
      const float* xs = u + n * Cc + h * P;
      const float* Bg = u + n * Cc + s.b_at() + g * Ns;
      const float* Cg = u + n * Cc + s.c_at() + g * Ns;
      const float d = dt[n * H + h];
      const float a = s.starts_document(n) ? 0.0f : math::exp(d * A);
      scan_step(state.data(), xs, Bg, a, d, s);
      float* yn = y + (n * H + h) * P;
      for (int64_t p = 0; p < P; ++p) {
        const float* row = state.data() + p * Ns;
        float acc = 0.0f;
        for (int64_t m = 0; m < Ns; ++m) acc += row[m] * Cg[m];
        yn[p] = acc + D[h] * xs[p];
      }
    }
  }
}

void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_scan_backward(du, d_dt, dA_log, dD, work, dy, checkpoints, u, dt, A_log, D, s));
  (void)work;
  mamba_check_shape(s, "mamba_scan_backward");
  const int64_t H = s.H, P = s.P, Ns = s.N, Cc = s.conv(), S = s.state(), hpg = s.heads_per_group();
  const int64_t G = s.G, T = s.T;
  // The per-head parameters' gradients of each sequence [B, H] each, summed over the sequences after.
  std::vector<float> dA_b(size_t(s.B * H), 0.0f), dD_b(size_t(s.B * H), 0.0f);
#pragma omp parallel for schedule(static) if (s.rows() * H * S > kParallelMin)
  for (int64_t bg = 0; bg < s.B * G; ++bg) {
    const int64_t b = bg / G, g = bg % G;
    // The group's B and C gradient columns of this sequence, zeroed, then each head's added in order.
    for (int64_t t = 0; t < T; ++t) {
      float* dun = du + (b * T + t) * Cc;
      std::fill(dun + s.b_at() + g * Ns, dun + s.b_at() + (g + 1) * Ns, 0.0f);
      std::fill(dun + s.c_at() + g * Ns, dun + s.c_at() + (g + 1) * Ns, 0.0f);
    }
    std::vector<float> states(size_t((s.chunk + 1) * S)), dS(static_cast<size_t>(S));
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
      const float A = -math::exp(A_log[h]);
      float dA = 0.0f, dDh = 0.0f;
      std::fill(dS.begin(), dS.end(), 0.0f);
      for (int64_t c = s.chunks(); c-- > 0;) {
        const int64_t t0 = c * s.chunk, L = std::min(T, t0 + s.chunk) - t0;
        // states[i]: the state before the chunk's token i (states[0] the checkpoint), states[L] after the last.
        std::memcpy(states.data(), checkpoints + ((b * H + h) * s.chunks() + c) * S, size_t(S) * sizeof(float));
        for (int64_t i = 0; i < L; ++i) {
          const int64_t n = b * T + t0 + i;
          const float d = dt[n * H + h];
          const float a = s.starts_document(n) ? 0.0f : math::exp(d * A);
          std::memcpy(states.data() + (i + 1) * S, states.data() + i * S, size_t(S) * sizeof(float));
          scan_step(states.data() + (i + 1) * S, u + n * Cc + h * P, u + n * Cc + s.b_at() + g * Ns, a, d, s);
        }
        for (int64_t i = L; i-- > 0;) {
          const int64_t n = b * T + t0 + i;
          const float* xs = u + n * Cc + h * P;
          const float* Bg = u + n * Cc + s.b_at() + g * Ns;
          const float* Cg = u + n * Cc + s.c_at() + g * Ns;
          const float* dyn = dy + (n * H + h) * P;
          const float d = dt[n * H + h];
          const bool reset = s.starts_document(n);
          const float a = reset ? 0.0f : math::exp(d * A);
          const float* after = states.data() + (i + 1) * S;
          const float* before = states.data() + i * S;
          float* dxs = du + n * Cc + h * P;
          float* dB = du + n * Cc + s.b_at() + g * Ns;
          float* dC = du + n * Cc + s.c_at() + g * Ns;
          // y = S C + D xs: dS += dy C^T, dC += S^T dy, dD += dy . xs.
          for (int64_t p = 0; p < P; ++p) {
            float* dr = dS.data() + p * Ns;
            const float* sr = after + p * Ns;
            const float dp = dyn[p];
            for (int64_t m = 0; m < Ns; ++m) {
              dr[m] += dp * Cg[m];
              dC[m] += sr[m] * dp;
            }
            dDh += dp * xs[p];
          }
          // S = a S' + dt xs B^T: dxs = D dy + dt dS B, dB += dt dS^T xs, d(dt) = <dS, xs B^T> + A a <dS, S'>,
          // dA += dt a <dS, S'>; then dS' = a dS.
          float d_dt_n = 0.0f, decay = 0.0f;
          for (int64_t p = 0; p < P; ++p) {
            const float* dr = dS.data() + p * Ns;
            const float* br = before + p * Ns;
            float sb = 0.0f, sd = 0.0f;
            for (int64_t m = 0; m < Ns; ++m) {
              sb += dr[m] * Bg[m];
              sd += dr[m] * br[m];
              dB[m] += d * dr[m] * xs[p];
            }
            dxs[p] = D[h] * dyn[p] + d * sb;
            d_dt_n += sb * xs[p];
            decay += sd;
          }
          if (!reset) {
            d_dt_n += A * a * decay;
            dA += d * a * decay;
          }
          d_dt[n * H + h] = d_dt_n;
          for (float& v : dS) v *= a;
        }
      }
      dA_b[size_t(b * H + h)] = dA * A;  // dA_log = dA dA/dA_log = dA A
      dD_b[size_t(b * H + h)] = dDh;
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    float da = 0.0f, dd = 0.0f;
    for (int64_t b = 0; b < s.B; ++b) {
      da += dA_b[size_t(b * H + h)];
      dd += dD_b[size_t(b * H + h)];
    }
    dA_log[h] += da;
    dD[h] += dd;
  }
}

void mamba_gated_norm_forward(float* out, float* rstd, const float* y, const float* x, const float* w,
                              const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_gated_norm_forward(out, rstd, y, x, w, s));
  mamba_check_shape(s, "mamba_gated_norm_forward");
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      const float r = math::mamba_gated_rstd(yg, zg, Dg, s.norm_eps);
      rstd[n * s.G + g] = r;
      float* og = out + n * I + g * Dg;
      for (int64_t d = 0; d < Dg; ++d) og[d] = w[g * Dg + d] * (yg[d] * math::silu(zg[d]) * r);
    }
}

void mamba_gated_norm_backward(float* dy, float* dx, float* dw, const float* dout, const float* y, const float* x,
                               const float* w, const float* rstd, const MambaShape& s) {
  LATTICE_KERNEL_ENTRY(cuda::mamba_gated_norm_backward(dy, dx, dw, dout, y, x, w, rstd, s));
  mamba_check_shape(s, "mamba_gated_norm_backward");
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
  // out = w v r, r = (mean v^2 + eps)^-1/2: dv = r (w dout - v r^2 mean(w dout v)); then v = y silu(z).
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t n = 0; n < s.rows(); ++n)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      const float* dog = dout + n * I + g * Dg;
      const float* wg = w + g * Dg;
      const float r = rstd[n * s.G + g];
      float dot = 0.0f;
      for (int64_t d = 0; d < Dg; ++d) dot += wg[d] * dog[d] * yg[d] * math::silu(zg[d]);
      const float k = r * r * dot / float(Dg);
      float* dyg = dy + n * I + g * Dg;
      float* dzg = dx + n * W + g * Dg;
      for (int64_t d = 0; d < Dg; ++d) {
        const float sz = math::silu(zg[d]), v = yg[d] * sz;
        const float dv = r * (wg[d] * dog[d] - v * k);
        dyg[d] = dv * sz;
        dzg[d] = dv * yg[d] * math::silu_grad(zg[d]);
      }
    }
  // dw[c] += sum_n dout v r, over the rows in order.
#pragma omp parallel for schedule(static) if (s.rows() * I > kParallelMin)
  for (int64_t c = 0; c < I; ++c) {
    const int64_t g = c / Dg;
    float acc = 0.0f;
    for (int64_t n = 0; n < s.rows(); ++n)
      acc += dout[n * I + c] * y[n * I + c] * math::silu(x[n * W + c]) * rstd[n * s.G + g];
    dw[c] += acc;
  }
}

}  // namespace lattice
