// Gated DeltaNet's kernels on the GPU (kernels/gated_delta_net.h): element kernels with a thread per
// element; the convolution's weight gradient and the per-head parameters' gradients with a block per
// output, reduced in a fixed order (ops_reduce.cuh); the delta rule by chunks, the CPU's closed form of each
// chunk with the chunks in parallel where they can be (below, "the delta rule, by chunks"). No float
// atomics: every run gives the same bits.
#include "kernels/cuda/block_gemm.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/gated_delta_net.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t grid_start() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float conv_pre(const float* x, const float* w, int64_t n, int64_t c, const GdnShape& s) {
  return math::gdn_conv_pre(x, w, n, c, s);
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

// ---- the delta rule, by chunks (kernels/cpu/gated_delta_rule.cpp's formulas and names)
//
// Forward: a block per (sequence, value head, chunk) makes the chunk's Tm = (I + A)^-1 (from K K^T, by
// substitution); a block per (sequence, value head, tile of 64 state columns) walks the chunks in order,
// each from its starting state S0: Delta = Tm diag(beta) (V - diag(gamma) K S0), then
// S = gamma_last S0 + K^T diag(w) Delta (the state's columns are independent, so the tiles are too); a block
// per chunk then writes O = diag(gamma) Q S0 + P Delta. Only the state passing is sequential (three
// products per chunk). The products go through block_gemm (block_gemm.cuh); each chunk's decays and [L, L]
// matrices in shared memory (L at most kMaxChunk).

constexpr int64_t kMaxChunk = 64;  // the chunk length (its [chunk, chunk] tiles in shared memory)
constexpr int64_t kColumns = 64;   // the state passing's state columns per block
constexpr int kChunkThreads = kBlockGemmThreads;

// Block (b, h, c) of the chunked kernels, blockIdx.x = (b Hv + h) chunks + c; or (b, h) with c given.
struct ChunkAt {
  int64_t bhc, bh, b, h, kh, c, L, n0;
};
__device__ ChunkAt chunk_at(int64_t bh, int64_t c, const GdnShape& s) {
  ChunkAt k;
  k.bh = bh;
  k.c = c;
  k.bhc = bh * s.chunks() + c;
  k.b = bh / s.Hv;
  k.h = bh % s.Hv;
  k.kh = k.h / s.group();
  const int64_t t0 = c * s.chunk;
  k.L = (t0 + s.chunk < s.T ? t0 + s.chunk : s.T) - t0;
  k.n0 = k.b * s.T + t0;
  return k;
}
__device__ ChunkAt chunk_at(const GdnShape& s) {
  return chunk_at(int64_t(blockIdx.x) / s.chunks(), int64_t(blockIdx.x) % s.chunks(), s);
}

// The chunk's rows: q and k [L, Dk] (the key head's), v [L, Dv] (u's value columns), g and beta.
struct ChunkRows {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  int64_t ldqk, ldv, ldh;
  __device__ float Q(int64_t t, int64_t i) const { return q[t * ldqk + i]; }
  __device__ float K(int64_t t, int64_t i) const { return k[t * ldqk + i]; }
  __device__ float V(int64_t t, int64_t j) const { return v[t * ldv + j]; }
  __device__ float Beta(int64_t t) const { return beta[t * ldh]; }
};
__device__ ChunkRows chunk_rows(const float* q, const float* k, const float* u, const float* g, const float* beta,
                                const ChunkAt& c, const GdnShape& s) {
  ChunkRows r;
  r.q = q + (c.n0 * s.Hk + c.kh) * s.Dk;
  r.k = k + (c.n0 * s.Hk + c.kh) * s.Dk;
  r.v = u + c.n0 * s.conv() + 2 * s.qk() + c.h * s.Dv;
  r.g = g + c.n0 * s.Hv + c.h;
  r.beta = beta + c.n0 * s.Hv + c.h;
  r.ldqk = s.qk();
  r.ldv = s.conv();
  r.ldh = s.Hv;
  return r;
}

// A chunk's decays (math::gdn_chunk_*), in shared memory.
struct ChunkDecays {
  float G[kMaxChunk];
  int32_t doc[kMaxChunk];
  float gamma[kMaxChunk];  // exp(G_t): the state before the chunk's decay to token t
  float w[kMaxChunk];      // exp(G_last - G_t): token t's decay to the chunk's end
  __device__ float Gm(int64_t t, int64_t u) const { return math::gdn_chunk_decay(G, doc, t, u); }
};

// Thread 0 makes them (a sequential sum of at most kMaxChunk terms, as the CPU's); every thread returns
// after the block's barrier.
__device__ void chunk_decays(ChunkDecays& d, const ChunkRows& r, const ChunkAt& c, const GdnShape& s) {
  if (threadIdx.x == 0) {
    math::gdn_chunk_cumsum(d.G, d.doc, r.g, r.ldh, c.n0, c.L, s);
    for (int64_t t = 0; t < c.L; ++t) {
      d.gamma[t] = math::gdn_chunk_entry_decay(d.G, d.doc, t);
      d.w[t] = math::gdn_chunk_decay(d.G, d.doc, c.L - 1, t);
    }
  }
  __syncthreads();
}

// Block (b, h, c): KK = K K^T, then Tm = (I + A)^-1 with A_tu = beta_t Gm_tu KK_tu (u < t), by substitution as
// the CPU's (Tm_t = e_t - sum_{u<t} A_tu Tm_u, each row's column j by thread j, a barrier per row), into tm
// ([L, L] per chunk, row stride L); KK into kk where given.
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_tm_kernel(float* tm, float* kk, const float* q, const float* k, const float* u, const float* g,
                         const float* beta, GdnShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  LATTICE_DYNAMIC_SHARED(float, sh);
  const ChunkAt c = chunk_at(s);
  const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
  const int64_t L = c.L;
  float* KK = sh;         // [L, L]
  float* Tm = sh + L * L;  // [L, L]
  chunk_decays(d, r, c, s);
  block_gemm<true, true>(
      stage, L, L, s.Dk, [&](int64_t t, int64_t i) { return r.K(t, i); },
      [&](int64_t i, int64_t v) { return r.K(v, i); },
      store_to(Rows<float>{KK, L}));
  for (int64_t t = 0; t < L; ++t) {
    const float bt = r.Beta(t);
    for (int64_t j = threadIdx.x; j < L; j += blockDim.x) {
      float x = j == t ? 1.0f : 0.0f;
      for (int64_t v = j; v < t; ++v) x -= bt * d.Gm(t, v) * KK[t * L + v] * Tm[v * L + j];
      Tm[t * L + j] = j <= t ? x : 0.0f;
    }
    __syncthreads();
  }
  float* out = tm + c.bhc * s.chunk * s.chunk;
  for (int64_t i = threadIdx.x; i < L * L; i += blockDim.x) {
    out[i] = Tm[i];
    if (kk) kk[c.bhc * s.chunk * s.chunk + i] = KK[i];
  }
}

// Block (b, h, tile of state columns j0..): the chunks in order, from the carried state (or zeros) in state;
// each chunk's starting state's columns into checkpoints, its Delta's into delta [N, Hv, Dv], the state
// updated in place.
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_pass_kernel(float* state, float* checkpoints, float* delta, const float* tm, const float* q,
                           const float* k, const float* u, const float* g, const float* beta, GdnShape s,
                           bool from_state) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  LATTICE_DYNAMIC_SHARED(float, R);  // [L, kColumns]: diag(beta) (V - diag(gamma) K S0)
  const int64_t tiles = (s.Dv + kColumns - 1) / kColumns, bh = blockIdx.x / tiles;
  const int64_t j0 = (blockIdx.x % tiles) * kColumns, nj = (j0 + kColumns < s.Dv ? j0 + kColumns : s.Dv) - j0;
  const int64_t Dk = s.Dk, S = s.state(), HvDv = s.v();
  float* St = state + bh * S + j0 * Dk;  // the tile's columns [nj, Dk]
  if (!from_state)
    for (int64_t i = threadIdx.x; i < nj * Dk; i += blockDim.x) St[i] = 0.0f;
  for (int64_t ci = 0; ci < s.chunks(); ++ci) {
    const ChunkAt c = chunk_at(bh, ci, s);
    const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
    const int64_t L = c.L;
    chunk_decays(d, r, c, s);  // (its barrier also orders the last chunk's state update before the copy)
    if (checkpoints)
      for (int64_t i = threadIdx.x; i < nj * Dk; i += blockDim.x) checkpoints[c.bhc * S + j0 * Dk + i] = St[i];
    float* D = delta + (c.n0 * s.Hv + c.h) * s.Dv + j0;  // row t at t Hv Dv
    const float* T = tm + c.bhc * s.chunk * s.chunk;
    block_gemm<true, true>(
        stage, L, nj, Dk, [&](int64_t t, int64_t i) { return r.K(t, i); },
        [&](int64_t i, int64_t j) { return St[j * Dk + i]; },
        [&](int64_t t, int64_t j, float ks) {
          R[t * kColumns + j] = r.Beta(t) * (r.V(t, j0 + j) - d.gamma[t] * ks);
          return 0.0f;
        });
    block_gemm<true, false>(
        stage, L, nj, L, [&](int64_t t, int64_t v) { return T[t * L + v]; },
        [&](int64_t v, int64_t j) { return R[v * kColumns + j]; },
        store_to(Rows<float>{D, HvDv}));
    const float gamma_last = d.gamma[L - 1];
    block_gemm<false, false>(
        stage, nj, Dk, L, [&](int64_t j, int64_t t) { return D[t * HvDv + j]; },
        [&](int64_t t, int64_t i) { return d.w[t] * r.K(t, i); },
        [&](int64_t j, int64_t i, float x) {
          St[j * Dk + i] = gamma_last * St[j * Dk + i] + x;
          return 0.0f;
        });
  }
}

// Block (b, h, c): P = Gm o Q K^T ([L, L] in shared memory, 0 above the diagonal), then
// O = diag(gamma) Q S0 + P Delta, S0 the chunk's starting state (from starts).
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_output_kernel(float* o, const float* starts, const float* delta, const float* q, const float* k,
                             const float* u, const float* g, const float* beta, GdnShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  LATTICE_DYNAMIC_SHARED(float, P);
  const ChunkAt c = chunk_at(s);
  const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
  const int64_t L = c.L, Dk = s.Dk, HvDv = s.v();
  chunk_decays(d, r, c, s);
  block_gemm<true, true>(
      stage, L, L, Dk, [&](int64_t t, int64_t i) { return r.Q(t, i); },
      [&](int64_t i, int64_t v) { return r.K(v, i); },
      [&](int64_t t, int64_t v, float x) {
        P[t * L + v] = x * d.Gm(t, v);
        return 0.0f;
      });
  const float* S0 = starts + c.bhc * s.state();
  float* O = o + (c.n0 * s.Hv + c.h) * s.Dv;  // row t at t Hv Dv
  const float* D = delta + (c.n0 * s.Hv + c.h) * s.Dv;
  block_gemm<true, true>(
      stage, L, s.Dv, Dk, [&](int64_t t, int64_t i) { return r.Q(t, i); },
      [&](int64_t i, int64_t j) { return S0[j * Dk + i]; },
      [&](int64_t t, int64_t j, float x) {
        O[t * HvDv + j] = x * d.gamma[t];
        return 0.0f;
      });
  block_gemm<true, false>(  // (the same thread adds to each output it wrote)
      stage, L, s.Dv, L, [&](int64_t t, int64_t v) { return P[t * L + v]; },
      [&](int64_t v, int64_t j) { return D[v * HvDv + j]; },
      add_to(Rows<float>{O, HvDv}));
}

// The backward's workspace (gdn_delta_rule_work floats), in order.
struct DeltaWork {
  float* tm;       // [B Hv chunks, chunk, chunk]: each chunk's Tm (row stride L)
  float* kk;       // ditto: K K^T
  float* p;        // ditto: P = Gm o Q K^T
  float* dstates;  // [B Hv chunks, Dv, Dk]: the gradient of the state after each chunk
  float* ks;       // [N, Hv, Dv]: K S0
  float* delta;    // [N, Hv, Dv]: Delta
  float* dd;       // [N, Hv, Dv]: Delta's gradient (R, diag(beta) (V - diag(gamma) K S0), before it)
  float* dr;       // [N, Hv, Dv]: R's gradient, then K S0's
};
DeltaWork delta_work(float* work, const GdnShape& s) {
  const int64_t chunks = s.B * s.Hv * s.chunks(), tiles = chunks * s.chunk * s.chunk, rows = s.N() * s.v();
  DeltaWork w;
  w.tm = work;
  w.kk = w.tm + tiles;
  w.p = w.kk + tiles;
  w.dstates = w.p + tiles;
  w.ks = w.dstates + chunks * s.state();
  w.delta = w.ks + rows;
  w.dd = w.delta + rows;
  w.dr = w.dd + rows;
  return w;
}

// A value head's rows of an [N, Hv, Dv] (or [N, Hv, Dk]) buffer from the chunk's first: row t at t Hv D.
template <typename T>
__device__ Rows<T> head_rows(T* x, int64_t D, const ChunkAt& c, const GdnShape& s) {
  return {x + (c.n0 * s.Hv + c.h) * D, s.Hv * D};
}

// Block (b, h, c), from the chunk's starting state S0 (the forward's checkpoint): P = Gm o Q K^T, K S0, R, and
// Delta = Tm R, into the workspace (R passing through dd).
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_values_kernel(DeltaWork wk, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, GdnShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  const ChunkAt c = chunk_at(s);
  const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
  const int64_t L = c.L, Dk = s.Dk;
  chunk_decays(d, r, c, s);
  float* P = wk.p + c.bhc * s.chunk * s.chunk;
  const float* T = wk.tm + c.bhc * s.chunk * s.chunk;
  const float* S0 = checkpoints + c.bhc * s.state();
  const auto KS = head_rows(wk.ks, s.Dv, c, s), R = head_rows(wk.dd, s.Dv, c, s), D = head_rows(wk.delta, s.Dv, c, s);
  block_gemm<true, true>(
      stage, L, L, Dk, [&](int64_t t, int64_t i) { return r.Q(t, i); },
      [&](int64_t i, int64_t v) { return r.K(v, i); },
      [&](int64_t t, int64_t v, float x) {
        P[t * L + v] = x * d.Gm(t, v);
        return 0.0f;
      });
  block_gemm<true, true>(
      stage, L, s.Dv, Dk, [&](int64_t t, int64_t i) { return r.K(t, i); },
      [&](int64_t i, int64_t j) { return S0[j * Dk + i]; },
      [&](int64_t t, int64_t j, float x) {
        KS(t, j) = x;
        R(t, j) = r.Beta(t) * (r.V(t, j) - d.gamma[t] * x);
        return 0.0f;
      });
  block_gemm<true, false>(
      stage, L, s.Dv, L, [&](int64_t t, int64_t v) { return T[t * L + v]; },
      [&](int64_t v, int64_t j) { return R(v, j); },
      store_to(D));
}

// Block (b, h, tile of state columns j0..): the chunks in reverse, from dS = 0 after the last (the backward
// takes no final state's gradient), each chunk's dS in dstates; the gradient before chunk c into slot c - 1:
//   dDelta = diag(w) K dS^T + P^T dO,  Y = -diag(gamma beta) Tm^T dDelta,
//   dS0 = gamma_last dS + (diag(gamma) Q)^T dO + K^T Y   (the tile's columns, [nj, Dk] as the state's).
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_dpass_kernel(DeltaWork wk, const float* d_o, const float* q, const float* k, const float* u,
                            const float* g, const float* beta, GdnShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  LATTICE_DYNAMIC_SHARED(float, sh);
  const int64_t tiles = (s.Dv + kColumns - 1) / kColumns, bh = blockIdx.x / tiles;
  const int64_t j0 = (blockIdx.x % tiles) * kColumns, nj = (j0 + kColumns < s.Dv ? j0 + kColumns : s.Dv) - j0;
  const int64_t Dk = s.Dk, S = s.state(), C = s.chunk < s.T ? s.chunk : s.T;
  float* dD = sh;              // [L, kColumns]
  float* Y = sh + C * kColumns;  // [L, kColumns]
  float* last = wk.dstates + (bh * s.chunks() + s.chunks() - 1) * S + j0 * Dk;
  for (int64_t i = threadIdx.x; i < nj * Dk; i += blockDim.x) last[i] = 0.0f;
  for (int64_t ci = s.chunks(); ci-- > 1;) {
    const ChunkAt c = chunk_at(bh, ci, s);
    const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
    const int64_t L = c.L;
    chunk_decays(d, r, c, s);  // (its barrier also orders the tile's zeros and the last chunk's writes)
    const float* dS = wk.dstates + c.bhc * S + j0 * Dk;
    float* before = wk.dstates + (c.bhc - 1) * S + j0 * Dk;
    const float* P = wk.p + c.bhc * s.chunk * s.chunk;
    const float* T = wk.tm + c.bhc * s.chunk * s.chunk;
    const auto dO = head_rows(d_o, s.Dv, c, s);
    block_gemm<true, true>(
        stage, L, nj, Dk, [&](int64_t t, int64_t i) { return d.w[t] * r.K(t, i); },
        [&](int64_t i, int64_t j) { return dS[j * Dk + i]; },
        store_to(Rows<float>{dD, kColumns}));
    block_gemm<false, false>(
        stage, L, nj, L, [&](int64_t t, int64_t v) { return P[v * L + t]; },
        [&](int64_t v, int64_t j) { return dO(v, j0 + j); },
        add_to(Rows<float>{dD, kColumns}));
    block_gemm<false, false>(
        stage, L, nj, L, [&](int64_t t, int64_t v) { return T[v * L + t]; },
        [&](int64_t v, int64_t j) { return dD[v * kColumns + j]; },
        [&](int64_t t, int64_t j, float x) {
          Y[t * kColumns + j] = -d.gamma[t] * (r.Beta(t) * x);
          return 0.0f;
        });
    const float gamma_last = d.gamma[L - 1];
    block_gemm<false, false>(
        stage, nj, Dk, L, [&](int64_t j, int64_t t) { return dO(t, j0 + j); },
        [&](int64_t t, int64_t i) { return d.gamma[t] * r.Q(t, i); },
        [&](int64_t j, int64_t i, float x) {
          before[j * Dk + i] = gamma_last * dS[j * Dk + i] + x;
          return 0.0f;
        });
    block_gemm<false, false>(
        stage, nj, Dk, L, [&](int64_t j, int64_t t) { return Y[t * kColumns + j]; },
        [&](int64_t t, int64_t i) { return r.K(t, i); },
        add_to(Rows<float>{before, Dk}));
  }
}

// Block (b, h, c): the chunk's gradients from its starting state S0 and the gradient of its final state dS
// (the adjoints of kernels/cpu/gated_delta_rule.cpp's chunk_backward, derived there, but dS0's, which
// delta_rule_dpass_kernel made): dq_v, dk_v, du's value columns, dg and dbeta. G's shares are gathered per
// token (rows and columns of the [L, L] products summed by a thread each) and added by thread 0 with the
// reverse cumulative sum.
__global__ void __launch_bounds__(kChunkThreads, 2)
    delta_rule_chunk_backward_kernel(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, DeltaWork wk,
                                     const float* d_o, const float* checkpoints, const float* q, const float* k,
                                     const float* u, const float* g, const float* beta, GdnShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  // Per token: k . (Delta dS)_t, q . (dO S0)_t, the rows' and columns' sums of dP's and dA's shares, dbeta's
  // row sums, dR . R0 and Y . K S0.
  __shared__ float kx[kMaxChunk], qx[kMaxChunk], prow[kMaxChunk], pcol[kMaxChunk], arow[kMaxChunk],
      acol[kMaxChunk], brow[kMaxChunk], rdot[kMaxChunk], ydot[kMaxChunk];
  LATTICE_DYNAMIC_SHARED(float, sh);
  const ChunkAt c = chunk_at(s);
  const ChunkRows r = chunk_rows(q, k, u, g, beta, c, s);
  const int64_t L = c.L, Dk = s.Dk, Dv = s.Dv, last = L - 1;
  float* M1 = sh;          // [L, L]: dP o Gm, then dA's beta Gm
  float* M2 = sh + L * L;  // [L, L]: dP's shares dP o P, then dA's dA o A
  chunk_decays(d, r, c, s);
  const float* S0 = checkpoints + c.bhc * s.state();
  const float* dS = wk.dstates + c.bhc * s.state();
  const float* P = wk.p + c.bhc * s.chunk * s.chunk;
  const float* T = wk.tm + c.bhc * s.chunk * s.chunk;
  const float* KK = wk.kk + c.bhc * s.chunk * s.chunk;
  const auto dO = head_rows(d_o, Dv, c, s);
  const auto D = head_rows(wk.delta, Dv, c, s), KS = head_rows(wk.ks, Dv, c, s), dD = head_rows(wk.dd, Dv, c, s),
             dR = head_rows(wk.dr, Dv, c, s), dQ = head_rows(dq_v, Dk, c, s), dK = head_rows(dk_v, Dk, c, s);
  // S_last = gamma_last S0 + K^T diag(w) Delta: dDelta = diag(w) K dS^T; X = Delta dS, dK = diag(w) X, w_t's
  // share w_t k_t . X_t; gamma_last's gamma_last <S0, dS>.
  block_gemm<true, true>(
      stage, L, Dv, Dk, [&](int64_t t, int64_t i) { return d.w[t] * r.K(t, i); },
      [&](int64_t i, int64_t j) { return dS[j * Dk + i]; },
      store_to(dD));
  block_gemm<true, false>(
      stage, L, Dk, Dv, [&](int64_t t, int64_t j) { return D(t, j); },
      [&](int64_t j, int64_t i) { return dS[j * Dk + i]; },
      [&](int64_t t, int64_t i, float x) {
        dK(t, i) = d.w[t] * x;
        return r.K(t, i) * x;
      },
      [&](int64_t t, float sum) { kx[t] = sum; });
  float sd = 0.0f;
  for (int64_t i = threadIdx.x; i < s.state(); i += blockDim.x) sd += S0[i] * dS[i];
  sd = block_sum(sd);
  // O = diag(gamma) Q S0 + P Delta: X = dO S0^T (S0 as [Dk, Dv]), dq = diag(gamma) X, gamma_t's share
  // gamma_t q_t . X_t; dP = dO Delta^T, dDelta += P^T dO; P = Gm o Q K^T: dQK = Gm o dP (lower), Gm's shares
  // dP o P to G_t (+) and G_u (-); dq += dQK K, dk += dQK^T Q.
  block_gemm<true, false>(
      stage, L, Dk, Dv, [&](int64_t t, int64_t j) { return dO(t, j); },
      [&](int64_t j, int64_t i) { return S0[j * Dk + i]; },
      [&](int64_t t, int64_t i, float x) {
        dQ(t, i) = d.gamma[t] * x;
        return r.Q(t, i) * x;
      },
      [&](int64_t t, float sum) { qx[t] = sum; });
  block_gemm<true, true>(
      stage, L, L, Dv, [&](int64_t t, int64_t j) { return dO(t, j); },
      [&](int64_t j, int64_t v) { return D(v, j); },
      [&](int64_t t, int64_t v, float x) {
        const float share = v < t ? x * P[t * L + v] : 0.0f;
        M2[t * L + v] = share;
        M1[t * L + v] = v <= t ? x * d.Gm(t, v) : 0.0f;
        return share;
      },
      [&](int64_t t, float sum) { prow[t] = sum; });
  if (threadIdx.x < L) {
    float acc = 0.0f;
    for (int64_t t = threadIdx.x + 1; t < L; ++t) acc += M2[t * L + threadIdx.x];
    pcol[threadIdx.x] = acc;
  }
  block_gemm<false, false>(
      stage, L, Dv, L, [&](int64_t t, int64_t v) { return P[v * L + t]; },
      [&](int64_t v, int64_t j) { return dO(v, j); },
      add_to(dD));
  block_gemm<true, false>(
      stage, L, Dk, L, [&](int64_t t, int64_t v) { return M1[t * L + v]; },
      [&](int64_t v, int64_t i) { return r.K(v, i); },
      add_to(dQ));
  block_gemm<false, false>(
      stage, L, Dk, L, [&](int64_t t, int64_t v) { return M1[v * L + t]; },
      [&](int64_t v, int64_t i) { return r.Q(v, i); },
      add_to(dK));
  // Delta = (I + A)^-1 R: dR = Tm^T dDelta, dA = -dR Delta^T (strictly lower); A_tu = beta_t Gm_tu KK_tu:
  // dbeta_t's share dA Gm KK, Gm's dA o A to G_t (+) and G_u (-), dKK = dA beta Gm; dk += (dKK + dKK^T) K.
  block_gemm<false, false>(
      stage, L, Dv, L, [&](int64_t t, int64_t v) { return T[v * L + t]; },
      [&](int64_t v, int64_t j) { return dD(v, j); },
      store_to(dR));
  block_gemm<true, true>(
      stage, L, L, Dv, [&](int64_t t, int64_t j) { return dR(t, j); },
      [&](int64_t j, int64_t v) { return D(v, j); },
      [&](int64_t t, int64_t v, float x) {
        if (v >= t) {
          M1[t * L + v] = 0.0f;
          M2[t * L + v] = 0.0f;
          return 0.0f;
        }
        const float da = -x, gm = d.Gm(t, v), kk = KK[t * L + v], bt = r.Beta(t);
        M2[t * L + v] = da * (bt * gm * kk);
        M1[t * L + v] = da * bt * gm;
        return da * gm * kk;
      },
      [&](int64_t t, float sum) { brow[t] = sum; });
  if (threadIdx.x < L) {
    const int64_t t = threadIdx.x;
    float row = 0.0f, col = 0.0f;
    for (int64_t v = 0; v < t; ++v) row += M2[t * L + v];
    for (int64_t v = t + 1; v < L; ++v) col += M2[v * L + t];
    arow[t] = row;
    acol[t] = col;
  }
  block_gemm<true, false>(
      stage, L, Dk, L,
      [&](int64_t t, int64_t v) { return v < t ? M1[t * L + v] : v > t ? M1[v * L + t] : 0.0f; },
      [&](int64_t v, int64_t i) { return r.K(v, i); },
      add_to(dK));
  // R = diag(beta) R0: dbeta_t's share dR_t . R0_t, dR0 = diag(beta) dR; R0 = V - diag(gamma) K S0: dv = dR0;
  // Y = -diag(gamma) dR0 is K S0's gradient (over dR), gamma_t's share Y_t . (K S0)_t; dk += Y S0. A warp per
  // token for the dots (lanes over j, a fixed shuffle tree).
  const int lane = int(threadIdx.x & 31), warps = int(blockDim.x >> 5);
  float* dv = du + c.n0 * s.conv() + 2 * s.qk() + c.h * Dv;  // row t at t Cc
  for (int64_t t = threadIdx.x >> 5; t < L; t += warps) {
    const float bt = r.Beta(t), gm = d.gamma[t];
    float rd = 0.0f, yd = 0.0f;
    for (int64_t j = lane; j < Dv; j += 32) {
      const float dr = dR(t, j), ks = KS(t, j), dr0 = bt * dr, y = -gm * dr0;
      rd += dr * (r.V(t, j) - gm * ks);
      dv[t * s.conv() + j] = dr0;
      dR(t, j) = y;
      yd += y * ks;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      rd += __shfl_down_sync(0xffffffffu, rd, offset);
      yd += __shfl_down_sync(0xffffffffu, yd, offset);
    }
    if (lane == 0) {
      rdot[t] = rd;
      ydot[t] = yd;
    }
  }
  block_gemm<true, false>(
      stage, L, Dk, Dv, [&](int64_t t, int64_t j) { return dR(t, j); },
      [&](int64_t j, int64_t i) { return S0[j * Dk + i]; },
      add_to(dK));
  // G_t = g_0 + ... + g_t: dg_t = dG_t + ... + dG_last; none at a document's first token in the chunk.
  if (threadIdx.x == 0) {
    float dG_last = d.gamma[last] * sd;
    for (int64_t t = 0; t < last; ++t) dG_last += d.w[t] * kx[t];
    float acc = 0.0f;
    for (int64_t t = L; t-- > 0;) {
      float dG = d.gamma[t] * qx[t] + (prow[t] - pcol[t]) + (arow[t] - acol[t]) + ydot[t];
      dG += t == last ? dG_last : -d.w[t] * kx[t];
      acc += dG;
      const bool first = d.doc[t] != (t == 0 ? 0 : d.doc[t - 1]);
      dg[(c.n0 + t) * s.Hv + c.h] = first ? 0.0f : acc;
      dbeta[(c.n0 + t) * s.Hv + c.h] = brow[t] + rdot[t];
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

// The chunked delta rule's checks: check_heads' and its chunk length.
void check_chunked(const GdnShape& s, const char* what) {
  check_heads(s, what);
  LATTICE_CHECK(s.chunk <= kMaxChunk) << what << " (CUDA): chunk " << s.chunk << " (at most " << kMaxChunk << ")";
}

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
  check_chunked(s, "gdn_delta_rule_forward");
  const int64_t chunks = s.B * s.Hv * s.chunks(), tiles = (s.Dv + kColumns - 1) / kColumns;
  const int64_t C = s.chunk < s.T ? s.chunk : s.T;  // the longest chunk
  // Tm per chunk, Delta [N, Hv, Dv], and the chunks' starting states where no checkpoints are kept.
  const size_t tm_floats = size_t(chunks * s.chunk * s.chunk), delta_floats = size_t(s.N() * s.v());
  const size_t floats = tm_floats + delta_floats + (checkpoints ? 0 : size_t(chunks * s.state()));
  float* scratch = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&scratch), floats * sizeof(float), stream()));
  float* tm = scratch;
  float* delta = tm + tm_floats;
  float* starts = checkpoints ? checkpoints : delta + delta_floats;
  launch(delta_rule_tm_kernel, unsigned(chunks), kChunkThreads, size_t(2 * C * C) * sizeof(float), tm, nullptr, q, k,
         u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_forward (Tm)");
  launch(delta_rule_pass_kernel, unsigned(s.B * s.Hv * tiles), kChunkThreads, size_t(C * kColumns) * sizeof(float),
         state, starts, delta, tm, q, k, u, g, beta, s, from_state);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_forward (passed states)");
  launch(delta_rule_output_kernel, unsigned(chunks), kChunkThreads, size_t(C * C) * sizeof(float), o, starts, delta, q,
         k, u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_forward (outputs)");
  LATTICE_CUDA_CALL(cudaFreeAsync(scratch, stream()));
}

void gdn_delta_rule_backward(float* dq_v, float* dk_v, float* du, float* dg, float* dbeta, float* work,
                             const float* d_o, const float* checkpoints, const float* q, const float* k, const float* u,
                             const float* g, const float* beta, const GdnShape& s) {
  check_chunked(s, "gdn_delta_rule_backward");
  LATTICE_CHECK(work != nullptr) << "gdn_delta_rule_backward (CUDA): no workspace (gdn_delta_rule_work floats)";
  const DeltaWork wk = delta_work(work, s);
  const int64_t chunks = s.B * s.Hv * s.chunks(), tiles = (s.Dv + kColumns - 1) / kColumns;
  const int64_t C = s.chunk < s.T ? s.chunk : s.T;  // the longest chunk
  launch(delta_rule_tm_kernel, unsigned(chunks), kChunkThreads, size_t(2 * C * C) * sizeof(float), wk.tm, wk.kk, q, k,
         u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_backward (Tm)");
  launch(delta_rule_values_kernel, unsigned(chunks), kChunkThreads, 0, wk, checkpoints, q, k, u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_backward (chunk values)");
  launch(delta_rule_dpass_kernel, unsigned(s.B * s.Hv * tiles), kChunkThreads,
         size_t(2 * C * kColumns) * sizeof(float), wk, d_o, q, k, u, g, beta, s);
  LATTICE_CUDA_LAUNCHED("gdn_delta_rule_backward (passed state gradients)");
  launch(delta_rule_chunk_backward_kernel, unsigned(chunks), kChunkThreads, size_t(2 * C * C) * sizeof(float), dq_v,
         dk_v, du, dg, dbeta, wk, d_o, checkpoints, q, k, u, g, beta, s);
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
