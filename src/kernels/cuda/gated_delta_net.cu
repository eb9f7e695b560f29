// Gated DeltaNet's kernels on the GPU (kernels/gated_delta_net.h): element kernels with a thread per
// element; the convolution's weight gradient and the per-head parameters' gradients with a block per
// output, reduced in a fixed order (ops_reduce.cuh); the delta rule step by step (the CPU's kernel is
// chunked) with a block per (sequence, value head), a thread per state column (gdn_step), the state and the
// backward's recomputed chunk in global memory, and the backward's row sums with a thread per key dim.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/gated_delta_net.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t grid_start() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// One forward step of state column s (Dk floats, stride 1): s = e s; delta = beta (v - s.k); s += k delta;
// returns s.q (the output o_j); delta is left in delta_out.
__device__ __forceinline__ float gdn_step(float* s, int64_t Dk, const float* k, const float* q, float e, float beta,
                                          float v, float& delta_out) {
  float kv = 0.0f;
  for (int64_t i = 0; i < Dk; ++i) {
    s[i] *= e;
    kv += s[i] * k[i];
  }
  const float delta = beta * (v - kv);
  float o = 0.0f;
  for (int64_t i = 0; i < Dk; ++i) {
    s[i] += k[i] * delta;
    o += s[i] * q[i];
  }
  delta_out = delta;
  return o;
}
// The backward of one step, in three parts (a thread per column, then per row). ds is the column of dS_t
// (the state's gradient from the later steps, before this step's output adds q do), col the column of
// S_{t-1}, do_j the output's gradient, qk = q.k.
// Part 1: delta_j, the gradient of delta_j (ddelta), of v_j (dv) and beta's share (dbeta).
__device__ __forceinline__ void gdn_step_back_delta(const float* ds, const float* col, int64_t Dk, const float* k,
                                                    float e, float beta, float v, float do_j, float qk, float& delta,
                                                    float& ddelta, float& dv, float& dbeta) {
  float kv = 0.0f, dk_dot = 0.0f;
  for (int64_t i = 0; i < Dk; ++i) {
    kv += col[i] * k[i];
    dk_dot += ds[i] * k[i];
  }
  kv *= e;
  delta = beta * (v - kv);
  ddelta = dk_dot + qk * do_j;
  dv = beta * ddelta;
  dbeta = ddelta * (v - kv);
}
// Part 3: the column of dS_{t-1} in place, e (ds + q do_j + k dkv) with dkv = -beta ddelta; returns the
// column's share of the gradient of e, (ds + q do_j + k dkv) . col.
__device__ __forceinline__ float gdn_step_back_state(float* ds, const float* col, int64_t Dk, const float* q,
                                                     const float* k, float e, float do_j, float dkv) {
  float de = 0.0f;
  for (int64_t i = 0; i < Dk; ++i) {
    const float d = ds[i] + q[i] * do_j + k[i] * dkv;
    de += d * col[i];
    ds[i] = e * d;
  }
  return de;
}

__device__ __forceinline__ float conv_pre(const float* x, const float* w, int64_t n, int64_t c, const GdnShape& s) {
  return math::gdn_conv_pre(x, w, n, c, s);
}

// The state's decay at row n for value head h: exp(g), or 0 at a document's first token (the state forgotten).
__device__ __forceinline__ float step_decay(const float* g, int64_t n, int64_t h, const GdnShape& s) {
  return s.starts_document(n) ? 0.0f : math::exp(g[n * s.Hv + h]);
}

__global__ void conv_forward_kernel(float* u, const float* x, const float* w, GdnShape s) {
  const int64_t Cc = s.conv(), total = s.N() * Cc;
  for (int64_t i = grid_start(); i < total; i += grid_stride())
    u[i] = math::silu(conv_pre(x, w, i / Cc, i % Cc, s));
}

__device__ __forceinline__ float conv_dpre(const float* du, const float* x, const float* w, int64_t n, int64_t c,
                                           const GdnShape& s) {
  return du[n * s.conv() + c] * math::silu_grad(conv_pre(x, w, n, c, s));
}

__global__ void conv_backward_dx_kernel(float* dx, const float* du, const float* x, const float* w, GdnShape s) {
  const int64_t Cc = s.conv(), total = s.N() * Cc, K = s.K;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t n = i / Cc, c = i % Cc, t = n % s.T;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      if (t + K - 1 - j < s.T && s.same_document(n + K - 1 - j, n))
        acc += w[c * K + j] * conv_dpre(du, x, w, n + K - 1 - j, c, s);
    dx[n * s.width() + c] = acc;
  }
}

// One block per channel: dw[c, j] += sum_n dpre[n, c] x[n - K + 1 + j, c].
__global__ void conv_backward_dw_kernel(float* dw, const float* du, const float* x, const float* w, GdnShape s) {
  const int64_t c = blockIdx.x, K = s.K, W = s.width();
  for (int64_t j = 0; j < K; ++j) {
    float acc = 0.0f;
    for (int64_t n = threadIdx.x; n < s.N(); n += blockDim.x)
      if (j >= math::causal_conv_first_tap(n, s)) acc += conv_dpre(du, x, w, n, c, s) * x[(n - K + 1 + j) * W + c];
    acc = block_sum(acc);
    if (threadIdx.x == 0) dw[c * K + j] += acc;
  }
}

// Tasks per row: 2 Hk heads to normalize (queries, then keys), then Hv gates.
__global__ void gates_forward_kernel(float* q, float* k, float* g, float* beta, const float* u, const float* x,
                                     const float* A_log, const float* dt_bias, GdnShape s) {
  const int64_t per = 2 * s.Hk + s.Hv, total = s.N() * per, Dk = s.Dk;
  const float scale = 1.0f / sqrtf(float(Dk));
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t n = i / per, task = i % per;
    if (task < 2 * s.Hk) {
      const int64_t part = task / s.Hk, h = task % s.Hk;
      math::gdn_l2norm_forward((part == 0 ? q : k) + (n * s.Hk + h) * Dk, u + n * s.conv() + part * s.qk() + h * Dk,
                               Dk, part == 0 ? scale : 1.0f);
    } else {
      const int64_t h = task - 2 * s.Hk, W = s.width();
      g[n * s.Hv + h] = math::gdn_decay(x[n * W + s.a_at() + h], A_log[h], dt_bias[h]);
      beta[n * s.Hv + h] = math::sigmoid(x[n * W + s.b_at() + h]);
    }
  }
}

__global__ void gates_backward_kernel(float* du, float* dx, const float* dq, const float* dk, const float* dg,
                                      const float* dbeta, const float* u, const float* x, const float* A_log,
                                      const float* dt_bias, GdnShape s) {
  const int64_t per = 2 * s.Hk + s.Hv, total = s.N() * per, Dk = s.Dk, W = s.width();
  const float scale = 1.0f / sqrtf(float(Dk));
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t n = i / per, task = i % per;
    if (task < 2 * s.Hk) {
      const int64_t part = task / s.Hk, h = task % s.Hk, at = n * s.conv() + part * s.qk() + h * Dk;
      math::gdn_l2norm_backward(du + at, u + at, (part == 0 ? dq : dk) + (n * s.Hk + h) * Dk, Dk,
                                part == 0 ? scale : 1.0f);
    } else {
      const int64_t h = task - 2 * s.Hk;
      dx[n * W + s.a_at() + h] = math::gdn_decay_grad(x[n * W + s.a_at() + h], A_log[h], dt_bias[h], dg[n * s.Hv + h]);
      dx[n * W + s.b_at() + h] = math::gdn_beta_grad(x[n * W + s.b_at() + h], dbeta[n * s.Hv + h]);
    }
  }
}

// One block per value head: its A_log's and dt_bias's gradients over every row.
__global__ void gates_param_grads_kernel(float* dA_log, float* d_dt_bias, const float* dx, const float* dg,
                                         const float* x, const float* A_log, const float* dt_bias, GdnShape s) {
  const int64_t h = blockIdx.x, W = s.width();
  float da = 0.0f, ddt = 0.0f;
  for (int64_t n = threadIdx.x; n < s.N(); n += blockDim.x) {
    da += dg[n * s.Hv + h] * math::gdn_decay(x[n * W + s.a_at() + h], A_log[h], dt_bias[h]);
    ddt += dx[n * W + s.a_at() + h];
  }
  da = block_sum(da);
  ddt = block_sum(ddt);
  if (threadIdx.x == 0) {
    dA_log[h] += da;
    d_dt_bias[h] += ddt;
  }
}

// Block (b, h), thread j: column j of the state.
__global__ void delta_rule_forward_kernel(float* o, float* state, float* checkpoints, const float* q, const float* k,
                                          const float* u, const float* g, const float* beta, GdnShape s,
                                          bool from_state) {
  LATTICE_DYNAMIC_SHARED(float, sh);  // [Dk] k_t, [Dk] q_t
  const int64_t b = blockIdx.x / s.Hv, h = blockIdx.x % s.Hv, kh = h / s.group();
  const int64_t Dk = s.Dk, Dv = s.Dv, S = s.state(), j = threadIdx.x;
  float* st = state + blockIdx.x * S;
  float* kt = sh;
  float* qt = sh + Dk;
  if (j < Dv && !from_state)
    for (int64_t i = 0; i < Dk; ++i) st[j * Dk + i] = 0.0f;
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t n = b * s.T + t;
    __syncthreads();  // the previous step's readers are done with k_t and q_t
    for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
      kt[i] = k[(n * s.Hk + kh) * Dk + i];
      qt[i] = q[(n * s.Hk + kh) * Dk + i];
    }
    __syncthreads();
    if (j >= Dv) continue;
    if (checkpoints && t % s.chunk == 0) {
      float* cp = checkpoints + (int64_t(blockIdx.x) * s.chunks() + t / s.chunk) * S + j * Dk;
      for (int64_t i = 0; i < Dk; ++i) cp[i] = st[j * Dk + i];
    }
    const float e = step_decay(g, n, h, s), bt = beta[n * s.Hv + h];
    float delta;
    o[(n * s.Hv + h) * Dv + j] =
        gdn_step(st + j * Dk, Dk, kt, qt, e, bt, u[n * s.conv() + 2 * s.qk() + h * Dv + j], delta);
  }
}

// Block (b, h); threads: columns j < Dv in the column parts, rows i < Dk in the row part.
__global__ void delta_rule_backward_kernel(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                                           const float* d_o, const float* checkpoints, const float* q, const float* k,
                                           const float* u, const float* g, const float* beta, GdnShape s) {
  LATTICE_DYNAMIC_SHARED(float, sh);  // k_t [Dk], q_t [Dk], delta [Dv], dkv [Dv], do [Dv]
  const int64_t b = blockIdx.x / s.Hv, h = blockIdx.x % s.Hv, kh = h / s.group();
  const int64_t Dk = s.Dk, Dv = s.Dv, S = s.state(), tid = threadIdx.x, Cc = s.conv();
  float* kt = sh;
  float* qt = kt + Dk;
  float* delta = qt + Dk;
  float* dkv = delta + Dv;
  float* dot = dkv + Dv;
  float* ds = work + int64_t(blockIdx.x) * (s.chunk + 1) * S;
  float* states = ds + S;
  for (int64_t i = tid; i < S; i += blockDim.x) ds[i] = 0.0f;
  auto load_kq = [&](int64_t n) {
    __syncthreads();
    for (int64_t i = tid; i < Dk; i += blockDim.x) {
      kt[i] = k[(n * s.Hk + kh) * Dk + i];
      qt[i] = q[(n * s.Hk + kh) * Dk + i];
    }
    __syncthreads();
  };
  for (int64_t c = s.chunks(); c-- > 0;) {
    const int64_t t0 = c * s.chunk, t1 = t0 + s.chunk < s.T ? t0 + s.chunk : s.T;
    __syncthreads();
    const float* cp = checkpoints + (int64_t(blockIdx.x) * s.chunks() + c) * S;
    for (int64_t i = tid; i < S; i += blockDim.x) states[i] = cp[i];
    for (int64_t t = t0; t + 1 < t1; ++t) {
      const int64_t n = b * s.T + t;
      load_kq(n);
      if (tid < Dv) {
        float* next = states + (t - t0 + 1) * S + tid * Dk;
        const float* prev = next - S;
        for (int64_t i = 0; i < Dk; ++i) next[i] = prev[i];
        float unused;
        gdn_step(next, Dk, kt, qt, step_decay(g, n, h, s), beta[n * s.Hv + h],
                       u[n * Cc + 2 * s.qk() + h * Dv + tid], unused);
      }
    }
    for (int64_t t = t1; t-- > t0;) {
      const int64_t n = b * s.T + t;
      load_kq(n);
      const float* col0 = states + (t - t0) * S;
      const float e = step_decay(g, n, h, s), bt = beta[n * s.Hv + h];
      float qk = 0.0f;
      for (int64_t i = 0; i < Dk; ++i) qk += qt[i] * kt[i];
      float dbj = 0.0f, dodelta = 0.0f;
      if (tid < Dv) {
        const float doj = d_o[(n * s.Hv + h) * Dv + tid];
        float dd, dv, dl;
        gdn_step_back_delta(ds + tid * Dk, col0 + tid * Dk, Dk, kt, e, bt, u[n * Cc + 2 * s.qk() + h * Dv + tid],
                                  doj, qk, dl, dd, dv, dbj);
        du[n * Cc + 2 * s.qk() + h * Dv + tid] = dv;
        delta[tid] = dl;
        dkv[tid] = -bt * dd;
        dot[tid] = doj;
        dodelta = doj * dl;
      }
      const float db = block_sum(dbj);  // (its barriers publish delta, dkv and do)
      dodelta = block_sum(dodelta);
      if (tid < Dk) {
        float sq = 0.0f, sd = 0.0f, sk = 0.0f;
        for (int64_t j = 0; j < Dv; ++j) {
          sq += col0[j * Dk + tid] * dot[j];
          sd += ds[j * Dk + tid] * delta[j];
          sk += col0[j * Dk + tid] * dkv[j];
        }
        dq_v[(n * s.Hv + h) * Dk + tid] = e * sq + kt[tid] * dodelta;
        dk_v[(n * s.Hv + h) * Dk + tid] = sd + qt[tid] * dodelta + e * sk;
      }
      __syncthreads();  // the row sums read ds before the columns update it
      float de = 0.0f;
      if (tid < Dv) de = gdn_step_back_state(ds + tid * Dk, col0 + tid * Dk, Dk, qt, kt, e, dot[tid], dkv[tid]);
      de = block_sum(de);
      if (tid == 0) {
        dg[n * s.Hv + h] = de * e;
        dbeta[n * s.Hv + h] = db;
      }
    }
  }
}

__global__ void sum_key_heads_kernel(float* d, const float* d_v, GdnShape s) {
  const int64_t total = s.N() * s.qk(), G = s.group(), Dk = s.Dk;
  for (int64_t x = grid_start(); x < total; x += grid_stride()) {
    const int64_t i = x % Dk, nh = x / Dk, h = nh % s.Hk, n = nh / s.Hk;
    float acc = 0.0f;
    for (int64_t r = 0; r < G; ++r) acc += d_v[(n * s.Hv + h * G + r) * Dk + i];
    d[x] = acc;
  }
}

__global__ void output_gate_forward_kernel(float* y, const float* nrm, const float* x, GdnShape s) {
  const int64_t V = s.v(), total = s.N() * V;
  for (int64_t i = grid_start(); i < total; i += grid_stride())
    y[i] = nrm[i] * math::silu(x[(i / V) * s.width() + s.z_at() + i % V]);
}

__global__ void output_gate_backward_kernel(float* dn, float* dx, const float* dy, const float* nrm, const float* x,
                                            GdnShape s) {
  const int64_t V = s.v(), total = s.N() * V;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t zi = (i / V) * s.width() + s.z_at() + i % V;
    const float z = x[zi], d = dy[i];
    dx[zi] = d * nrm[i] * math::silu_grad(z);
    dn[i] = d * math::silu(z);
  }
}

void check_heads(const GdnShape& s, const char* what) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.Hk > 0 && s.Hv % s.Hk == 0 && s.Dk > 0 && s.Dv > 0 && s.Dk <= 1024 &&
                s.Dv <= 1024 && s.chunk > 0)
      << what << " (CUDA): key heads " << s.Hk << ", value heads " << s.Hv << ", head dims " << s.Dk << " and "
      << s.Dv << " (at most 1024)";
}

unsigned round_warp(int64_t n) { return unsigned((n + 31) / 32 * 32); }

}  // namespace

void gdn_conv_forward(float* u, const float* x, const float* w, const GdnShape& s) {
  check_heads(s, "gdn_conv_forward");
  launch(conv_forward_kernel, grid_for(s.N() * s.conv(), kThreads), kThreads, 0, u, x, w, s);
  LATTICE_CUDA_LAUNCHED("gdn_conv_forward");
}

void gdn_conv_backward(float* dx, float* dw, const float* du, const float* x, const float* w, const GdnShape& s) {
  check_heads(s, "gdn_conv_backward");
  launch(conv_backward_dx_kernel, grid_for(s.N() * s.conv(), kThreads), kThreads, 0, dx, du, x, w, s);
  LATTICE_CUDA_LAUNCHED("gdn_conv_backward (dx)");
  launch(conv_backward_dw_kernel, unsigned(s.conv()), kThreads, 0, dw, du, x, w, s);
  LATTICE_CUDA_LAUNCHED("gdn_conv_backward (dw)");
}

void gdn_gates_forward(float* q, float* k, float* g, float* beta, const float* u, const float* x, const float* A_log,
                       const float* dt_bias, const GdnShape& s) {
  check_heads(s, "gdn_gates_forward");
  launch(gates_forward_kernel, grid_for(s.N() * (2 * s.Hk + s.Hv), kThreads), kThreads, 0, q, k, g, beta, u, x, A_log,
         dt_bias, s);
  LATTICE_CUDA_LAUNCHED("gdn_gates_forward");
}

void gdn_gates_backward(float* du, float* dx, float* dA_log, float* d_dt_bias, const float* dq, const float* dk,
                        const float* dg, const float* dbeta, const float* u, const float* x, const float* A_log,
                        const float* dt_bias, const GdnShape& s) {
  check_heads(s, "gdn_gates_backward");
  launch(gates_backward_kernel, grid_for(s.N() * (2 * s.Hk + s.Hv), kThreads), kThreads, 0, du, dx, dq, dk, dg, dbeta,
         u, x, A_log, dt_bias, s);
  LATTICE_CUDA_LAUNCHED("gdn_gates_backward");
  launch(gates_param_grads_kernel, unsigned(s.Hv), kThreads, 0, dA_log, d_dt_bias, dx, dg, x, A_log, dt_bias, s);
  LATTICE_CUDA_LAUNCHED("gdn_gates_backward (A_log, dt_bias)");
}

void gdn_delta_rule_forward(float* o, float* state, float* checkpoints, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, const GdnShape& s, bool from_state) {
  check_heads(s, "gdn_delta_rule_forward");
  launch(delta_rule_forward_kernel, unsigned(s.B * s.Hv), round_warp(s.Dv), size_t(2 * s.Dk) * sizeof(float), o,
         state, checkpoints, q, k, u, g, beta, s, from_state);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_forward");
}

void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s) {
  check_heads(s, "gdn_delta_rule_backward");
  const unsigned threads = round_warp(s.Dk > s.Dv ? s.Dk : s.Dv);
  launch(delta_rule_backward_kernel, unsigned(s.B * s.Hv), threads, size_t(2 * s.Dk + 3 * s.Dv) * sizeof(float), dq_v,
         dk_v, du, dg, dbeta, work, d_o, checkpoints, q, k, u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_backward");
}

void gdn_sum_key_heads(float* d, const float* d_v, const GdnShape& s) {
  check_heads(s, "gdn_sum_key_heads");
  launch(sum_key_heads_kernel, grid_for(s.N() * s.qk(), kThreads), kThreads, 0, d, d_v, s);
  LATTICE_CUDA_LAUNCHED("gdn_sum_key_heads");
}

void gdn_output_gate_forward(float* y, const float* n, const float* x, const GdnShape& s) {
  check_heads(s, "gdn_output_gate_forward");
  launch(output_gate_forward_kernel, grid_for(s.N() * s.v(), kThreads), kThreads, 0, y, n, x, s);
  LATTICE_CUDA_LAUNCHED("gdn_output_gate_forward");
}

void gdn_output_gate_backward(float* dn, float* dx, const float* dy, const float* n, const float* x,
                              const GdnShape& s) {
  check_heads(s, "gdn_output_gate_backward");
  launch(output_gate_backward_kernel, grid_for(s.N() * s.v(), kThreads), kThreads, 0, dn, dx, dy, n, x, s);
  LATTICE_CUDA_LAUNCHED("gdn_output_gate_backward");
}

}  // namespace lattice::cuda
