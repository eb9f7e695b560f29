// Mamba-2's kernels on the GPU (kernels/mamba.h): element kernels with a thread per element for the
// convolution and dt; the convolution's weight and bias gradients and dt_bias's with a block per output,
// reduced in a fixed order (ops_reduce.cuh); the gated norm with a block per row and its weight gradient
// by column sums. The scan runs by chunks, the CPU's closed form of each chunk (the Mamba-2 paper's chunked
// algorithm) with the chunks in parallel: only the states passed from chunk to chunk are walked in order, a
// thread per state element (below, "the scan, by chunks"). B's and C's gradients are made per head and summed
// over the group's heads in head order by a second kernel; the per-head parameters' gradients per chunk, then
// over the chunks and the sequences in order. No float atomics: every run gives the same bits.
#include "kernels/cuda/block_gemm.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/mamba.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxKernel = 32;  // the convolution's width (its gradient's shared accumulators)
constexpr int64_t kMaxChunk = 64;   // the scan's chunk length (its [chunk, chunk] tiles in shared memory)
constexpr int kScanThreads = kBlockGemmThreads;  // the scan's blocks

__device__ __forceinline__ int64_t grid_start() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// ---- the convolution

__global__ void conv_forward_kernel(float* u, const float* x, const float* w, const float* bias, MambaShape s) {
  const int64_t Cc = s.conv(), total = s.rows() * Cc;
  for (int64_t i = grid_start(); i < total; i += grid_stride())
    u[i] = math::silu(math::mamba_conv_pre(x, w, bias, i / Cc, i % Cc, s));
}

// The pre-activation's gradient at row n, channel c: du silu'(pre), pre recomputed.
__device__ __forceinline__ float conv_dpre(const float* du, const float* x, const float* w, const float* bias,
                                           int64_t n, int64_t c, const MambaShape& s) {
  return du[n * s.conv() + c] * math::silu_grad(math::mamba_conv_pre(x, w, bias, n, c, s));
}

// dx[n, x_at + c] = sum_j w[c, j] dpre[n + K - 1 - j, c] over the rows of n's sequence and document that
// read row n, the taps in order.
__global__ void conv_backward_dx_kernel(float* dx, const float* du, const float* x, const float* w,
                                        const float* bias, MambaShape s) {
  const int64_t Cc = s.conv(), total = s.rows() * Cc, K = s.K;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t n = i / Cc, c = i % Cc, t = n % s.T;
    float acc = 0.0f;
    for (int64_t j = t + K - s.T > 0 ? t + K - s.T : 0; j < K; ++j)
      if (s.same_document(n + K - 1 - j, n)) acc += w[c * K + j] * conv_dpre(du, x, w, bias, n + K - 1 - j, c, s);
    dx[n * s.width() + s.x_at() + c] = acc;
  }
}

// One block per channel c: dw[c, j] += sum_n dpre[n, c] x[n - K + 1 + j, c], dbias[c] += sum_n dpre[n, c].
// Each thread's K + 1 sums over its rows in dynamic shared memory ([K + 1, blockDim], its own column),
// then each reduced over the block.
__global__ void conv_backward_params_kernel(float* dw, float* dbias, const float* du, const float* x, const float* w,
                                            const float* bias, MambaShape s) {
  LATTICE_DYNAMIC_SHARED(float, sh);
  const int64_t c = blockIdx.x, K = s.K, W = s.width(), at = s.x_at(), stride = blockDim.x;
  float* acc = sh + threadIdx.x;  // acc[j * stride]: tap j's sum, acc[K * stride] the bias's
  for (int64_t j = 0; j <= K; ++j) acc[j * stride] = 0.0f;
  for (int64_t n = threadIdx.x; n < s.rows(); n += stride) {
    const float dp = conv_dpre(du, x, w, bias, n, c, s);
    for (int64_t j = math::causal_conv_first_tap(n, s); j < K; ++j)
      acc[j * stride] += dp * x[(n - K + 1 + j) * W + at + c];
    acc[K * stride] += dp;
  }
  for (int64_t j = 0; j <= K; ++j) {
    const float v = block_sum(acc[j * stride]);
    if (threadIdx.x == 0) (j < K ? dw[c * K + j] : dbias[c]) += v;
  }
}

// ---- dt

__global__ void dt_forward_kernel(float* dt, const float* x, const float* dt_bias, MambaShape s) {
  const int64_t H = s.H, total = s.rows() * H;
  for (int64_t i = grid_start(); i < total; i += grid_stride())
    dt[i] = math::softplus(x[(i / H) * s.width() + s.dt_at() + i % H] + dt_bias[i % H]);
}

__global__ void dt_backward_kernel(float* dx, const float* d_dt, const float* x, const float* dt_bias, MambaShape s) {
  const int64_t H = s.H, total = s.rows() * H;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t xi = (i / H) * s.width() + s.dt_at() + i % H;
    dx[xi] = d_dt[i] * math::sigmoid(x[xi] + dt_bias[i % H]);
  }
}

// One block per head h: d_dt_bias[h] += the sum of dx's dt column h over the rows.
__global__ void dt_bias_grad_kernel(float* d_dt_bias, const float* dx, MambaShape s) {
  const int64_t h = blockIdx.x, W = s.width();
  float acc = 0.0f;
  for (int64_t n = threadIdx.x; n < s.rows(); n += blockDim.x) acc += dx[n * W + s.dt_at() + h];
  acc = block_sum(acc);
  if (threadIdx.x == 0) d_dt_bias[h] += acc;
}

// ---- the scan, by chunks (kernels/cpu/mamba.cpp's formulas and names)
//
// Forward: a block per (sequence, head, chunk) makes the state its tokens add, X^T diag(w) B; a thread per
// (sequence, head, state element) then walks the chunks in order, keeping each chunk's starting state S0
// (the checkpoints) and S = e_last S + that; a block per (sequence, head, chunk) then writes the outputs
// Y = M X + diag(e) C S0^T + D X. Backward: a block per chunk makes dY^T diag(e) C (the gradient its outputs
// send to S0), a thread per state element walks the chunks in reverse for the gradient of each chunk's final
// state dS, and a block per chunk runs the adjoints from S0 and dS. Each block keeps the chunk's decays and
// its [L, L] products in shared memory (L at most kMaxChunk), every sum in a fixed order, no float atomics.
// The products go through block_gemm (block_gemm.cuh). The chunk kernels' launch bounds hold them to 128
// registers (2 blocks an SM) or 80 (3): ptxas (CUDA 13.0, sm_80 and sm_90) then spills at most a few words.

// Block (b, h, c) of the chunked kernels, blockIdx.x = (b H + h) chunks + c.
struct ChunkAt {
  int64_t bhc, bh, b, h, g, c, L, n0;
};
__device__ ChunkAt chunk_at(const MambaShape& s) {
  ChunkAt k;
  k.bhc = blockIdx.x;
  k.c = k.bhc % s.chunks();
  k.bh = k.bhc / s.chunks();
  k.b = k.bh / s.H;
  k.h = k.bh % s.H;
  k.g = k.h / s.heads_per_group();
  const int64_t t0 = k.c * s.chunk;
  k.L = (t0 + s.chunk < s.T ? t0 + s.chunk : s.T) - t0;
  k.n0 = k.b * s.T + t0;
  return k;
}

// A chunk's decays for its head (math::mamba_chunk_*), in shared memory.
struct ChunkDecays {
  double acum[kMaxChunk];
  int32_t doc[kMaxChunk];
  float e[kMaxChunk];     // exp(Acum_t): the state before the chunk's decay to token t
  float wdec[kMaxChunk];  // exp(Acum_last - Acum_t): token t's decay to the chunk's end
  float w[kMaxChunk];     // wdec_t dt_t
};

// Thread 0 makes them (a sequential sum of at most kMaxChunk terms, as the CPU's); every thread returns
// after the block's barrier. dth: the head's dt at the chunk's first row (stride H).
__device__ void chunk_decays(ChunkDecays& d, const float* dth, float A, const ChunkAt& k, const MambaShape& s) {
  if (threadIdx.x == 0) {
    math::mamba_chunk_cumsum(d.acum, d.doc, dth, s.H, A, k.n0, k.L, s);
    for (int64_t t = 0; t < k.L; ++t) {
      d.e[t] = math::mamba_chunk_entry_decay(d.acum, d.doc, t);
      d.wdec[t] = math::mamba_chunk_decay(d.acum, d.doc, k.L - 1, t);
      d.w[t] = d.wdec[t] * dth[t * s.H];
    }
  }
  __syncthreads();
}

// Block (b, h, c): the state the chunk's tokens add, X^T diag(w) B [P, N] (N contiguous), into local; the
// chunk's e_last into e_last. The last chunk's state only where the final state is kept.
__global__ void __launch_bounds__(kScanThreads, 3)
    scan_chunk_state_kernel(float* local, float* e_last, const float* u, const float* dt, const float* A_log,
                            MambaShape s, bool final_state) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  const ChunkAt k = chunk_at(s);
  chunk_decays(d, dt + k.n0 * s.H + k.h, -math::exp(A_log[k.h]), k, s);
  if (threadIdx.x == 0) e_last[k.bhc] = d.e[k.L - 1];
  if (k.c + 1 == s.chunks() && !final_state) return;
  const int64_t Cc = s.conv(), Ns = s.N;
  const float* X = u + k.n0 * Cc + k.h * s.P;
  const float* Bm = u + k.n0 * Cc + s.b_at() + k.g * Ns;
  float* out = local + k.bhc * s.state();
  block_gemm<false, false>(
      stage, s.P, Ns, k.L, [&](int64_t p, int64_t t) { return X[t * Cc + p]; },
      [&](int64_t t, int64_t m) { return d.w[t] * Bm[t * Cc + m]; },
      store_to(Rows<float>{out, Ns}));
}

// A thread per (sequence, head, state element): the chunks in order, from the carried state (or zeros);
// each chunk's starting state into checkpoints (local's element read first: they may be one buffer), then
// S = e_last S + local (the chunk's e_last is 0 where a document starts in it). state [B H, P, N]: from and
// back to, where given.
__global__ void scan_pass_states_kernel(float* checkpoints, float* state, const float* local, const float* e_last,
                                        MambaShape s) {
  const int64_t S = s.state(), nc = s.chunks();
  for (int64_t i = grid_start(); i < s.B * s.H * S; i += grid_stride()) {
    const int64_t bh = i / S, j = i % S;
    float st = state ? state[i] : 0.0f;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t at = (bh * nc + c) * S + j;
      const bool adds = c + 1 < nc || state;  // the last chunk's only for the final state
      const float add = adds ? local[at] : 0.0f;
      checkpoints[at] = st;
      if (adds) st = e_last[bh * nc + c] * st + add;
    }
    if (state) state[i] = st;
  }
}

// Block (b, h, c): M = CB o Dec o dt ([L, L] in shared memory, 0 above the diagonal), then
// Y = M X + diag(e) C S0^T + D X, S0 the chunk's starting state (from starts; its share 0 where the chunk
// starts from no state).
__global__ void __launch_bounds__(kScanThreads, 2)
    scan_chunk_output_kernel(float* y, const float* starts, const float* u, const float* dt, const float* A_log,
                             const float* D, MambaShape s, bool carried) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  LATTICE_DYNAMIC_SHARED(float, M);
  const ChunkAt k = chunk_at(s);
  const int64_t Cc = s.conv(), Ns = s.N, P = s.P, H = s.H, L = k.L;
  const float* dth = dt + k.n0 * H + k.h;
  chunk_decays(d, dth, -math::exp(A_log[k.h]), k, s);
  const float* X = u + k.n0 * Cc + k.h * P;
  const float* Bm = u + k.n0 * Cc + s.b_at() + k.g * Ns;
  const float* Cm = u + k.n0 * Cc + s.c_at() + k.g * Ns;
  block_gemm<true, true>(
      stage, L, L, Ns, [&](int64_t t, int64_t m) { return Cm[t * Cc + m]; },
      [&](int64_t m, int64_t v) { return Bm[v * Cc + m]; },
      [&](int64_t t, int64_t v, float cb) {
        M[t * L + v] = v <= t ? cb * math::mamba_chunk_decay(d.acum, d.doc, t, v) * dth[v * H] : 0.0f;
        return 0.0f;
      });
  const bool has_state = (k.c > 0 || carried) && !s.starts_document(k.n0);
  const float* S0 = starts + k.bhc * s.state();
  const float Dh = D[k.h];
  float* Y = y + (k.n0 * H + k.h) * P;  // row t at t H P
  block_gemm<true, false>(
      stage, L, P, L, [&](int64_t t, int64_t v) { return M[t * L + v]; },
      [&](int64_t v, int64_t p) { return X[v * Cc + p]; },
      [&](int64_t t, int64_t p, float v) {
        Y[t * H * P + p] = has_state ? v : v + Dh * X[t * Cc + p];
        return 0.0f;
      });
  if (has_state)  // (the same thread adds to each output it wrote)
    block_gemm<true, true>(
        stage, L, P, Ns, [&](int64_t t, int64_t m) { return d.e[t] * Cm[t * Cc + m]; },
        [&](int64_t m, int64_t p) { return S0[p * Ns + m]; },
        [&](int64_t t, int64_t p, float v) {
          float& out = Y[t * H * P + p];
          out = (out + v) + Dh * X[t * Cc + p];
          return 0.0f;
        });
}

// The backward's workspace (mamba_scan_work floats), in order.
struct ScanWork {
  float* dstates;  // [B H chunks, P N]: the gradient of the state after each chunk
  float* e_last;   // [B H chunks]
  float* dA;       // [B H chunks]: each chunk's sum of da_t dt_t (dA_log's before the factor A)
  float* dD;       // [B H chunks]
  float* dbc;      // [rows, H, 2, N]: each head's B and C gradients
};
ScanWork scan_work(float* work, const MambaShape& s) {
  const int64_t chunks = s.B * s.H * s.chunks();
  ScanWork w;
  w.dstates = work;
  w.e_last = w.dstates + chunks * s.state();
  w.dA = w.e_last + chunks;
  w.dD = w.dA + chunks;
  w.dbc = w.dD + chunks;
  return w;
}

// Block (b, h, c): the gradient the chunk's outputs send to its starting state, dY^T diag(e) C [P, N] (0 where
// the chunk starts from no state: the first, or at a document's first token), into dstates; e_last.
__global__ void __launch_bounds__(kScanThreads, 3)
    scan_chunk_dstate_kernel(ScanWork wk, const float* dy, const float* u, const float* dt, const float* A_log,
                             MambaShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  const ChunkAt k = chunk_at(s);
  chunk_decays(d, dt + k.n0 * s.H + k.h, -math::exp(A_log[k.h]), k, s);
  if (threadIdx.x == 0) wk.e_last[k.bhc] = d.e[k.L - 1];
  const int64_t Cc = s.conv(), Ns = s.N, HP = s.inner();
  float* out = wk.dstates + k.bhc * s.state();
  if (k.c == 0 || s.starts_document(k.n0)) {  // no state before the chunk
    for (int64_t i = threadIdx.x; i < s.state(); i += blockDim.x) out[i] = 0.0f;
    return;
  }
  const float* dY = dy + (k.n0 * s.H + k.h) * s.P;
  const float* Cm = u + k.n0 * Cc + s.c_at() + k.g * Ns;
  block_gemm<false, false>(
      stage, s.P, Ns, k.L, [&](int64_t p, int64_t t) { return dY[t * HP + p]; },
      [&](int64_t t, int64_t m) { return d.e[t] * Cm[t * Cc + m]; },
      store_to(Rows<float>{out, Ns}));
}

// A thread per (sequence, head, state element): the chunks in reverse from dS = 0 (the backward takes no
// final state's gradient); each chunk's dS into dstates (its own share read first), then
// dS = e_last dS + share, or 0 before a chunk that starts from no state.
__global__ void scan_pass_dstates_kernel(ScanWork wk, MambaShape s) {
  const int64_t S = s.state(), nc = s.chunks();
  for (int64_t i = grid_start(); i < s.B * s.H * S; i += grid_stride()) {
    const int64_t bh = i / S, j = i % S, b = bh / s.H;
    float g = 0.0f;
    for (int64_t c = nc; c-- > 0;) {
      const int64_t at = (bh * nc + c) * S + j;
      const float share = wk.dstates[at];
      wk.dstates[at] = g;
      const bool has_state = c > 0 && !s.starts_document(b * s.T + c * s.chunk);
      g = has_state ? wk.e_last[bh * nc + c] * g + share : 0.0f;
    }
  }
}

// Block (b, h, c), from the chunk's starting state S0 (the forward's checkpoint) and the gradient of its final
// state dS (scan_pass_dstates_kernel's): the adjoints of kernels/cpu/mamba.cpp's formulas (derived there), the
// products by block_gemm:
//   1. CB = C B^T and M = CB o Dec o dt in shared memory;
//   2. dX = M^T dY + D dY + diag(w) B dS^T (dD's terms dY o X summed per row on the way);
//   3. dM = dY X^T: dCB = dM o Dec o dt over M, the direct shares dM o Dec o CB over CB;
//   4. the head's dB = diag(w) X dS + dCB^T C, V_t . B_t on the way (V = X dS), and dC = diag(e) dY S0 +
//      dCB B, R_t . C_t on the way (R = dY S0);
//   5. a thread per token: d(dt)'s direct shares and dAcum; 6. thread 0: dAcum's reverse sums, d_dt, the
//      chunk's dA and dD.
__global__ void __launch_bounds__(kScanThreads, 2)
    scan_chunk_backward_kernel(float* du, float* d_dt, ScanWork wk, const float* dy, const float* checkpoints,
                               const float* u, const float* dt, const float* A_log, const float* D, MambaShape s) {
  __shared__ ChunkDecays d;
  __shared__ BlockGemmStage stage;
  __shared__ float vb[kMaxChunk], rc[kMaxChunk], dyx[kMaxChunk], ddt[kMaxChunk], dacum[kMaxChunk];
  LATTICE_DYNAMIC_SHARED(float, sh);
  const ChunkAt k = chunk_at(s);
  const int64_t Cc = s.conv(), Ns = s.N, P = s.P, H = s.H, HP = s.inner(), L = k.L, S = s.state();
  float* CB = sh;         // [L, L]
  float* M = sh + L * L;  // [L, L]
  const float* dth = dt + k.n0 * H + k.h;
  const float A = -math::exp(A_log[k.h]);
  chunk_decays(d, dth, A, k, s);
  const float* X = u + k.n0 * Cc + k.h * P;
  const float* Bm = u + k.n0 * Cc + s.b_at() + k.g * Ns;
  const float* Cm = u + k.n0 * Cc + s.c_at() + k.g * Ns;
  const float* dY = dy + (k.n0 * H + k.h) * P;
  float* dX = du + k.n0 * Cc + k.h * P;
  float* dbc = wk.dbc + (k.n0 * H + k.h) * 2 * Ns;  // token t's dB at t H 2 N, its dC N after
  const float* S0 = checkpoints + k.bhc * S;
  const float* dS = wk.dstates + k.bhc * S;
  const bool has_state = k.c > 0 && !s.starts_document(k.n0), carried = k.c + 1 < s.chunks();
  const float Dh = D[k.h];
  // 1.
  block_gemm<true, true>(
      stage, L, L, Ns, [&](int64_t t, int64_t m) { return Cm[t * Cc + m]; },
      [&](int64_t m, int64_t v) { return Bm[v * Cc + m]; },
      [&](int64_t t, int64_t v, float cb) {
        CB[t * L + v] = v <= t ? cb : 0.0f;
        M[t * L + v] = v <= t ? cb * math::mamba_chunk_decay(d.acum, d.doc, t, v) * dth[v * H] : 0.0f;
        return 0.0f;
      });
  // 2.
  block_gemm<false, false>(
      stage, L, P, L, [&](int64_t t, int64_t v) { return M[v * L + t]; },
      [&](int64_t v, int64_t p) { return dY[v * HP + p]; },
      [&](int64_t t, int64_t p, float v) {
        dX[t * Cc + p] = v + Dh * dY[t * HP + p];
        return dY[t * HP + p] * X[t * Cc + p];
      },
      [&](int64_t t, float sum) { dyx[t] = sum; });
  if (carried)  // (the same thread adds to each output it wrote)
    block_gemm<true, true>(
        stage, L, P, Ns, [&](int64_t t, int64_t m) { return Bm[t * Cc + m]; },
        [&](int64_t m, int64_t p) { return dS[p * Ns + m]; },
        [&](int64_t t, int64_t p, float v) {
          dX[t * Cc + p] += d.w[t] * v;
          return 0.0f;
        });
  // 3.
  block_gemm<true, true>(
      stage, L, L, P, [&](int64_t t, int64_t p) { return dY[t * HP + p]; },
      [&](int64_t p, int64_t v) { return X[v * Cc + p]; },
      [&](int64_t t, int64_t v, float dm) {
        if (v <= t) {
          const float e1 = dm * math::mamba_chunk_decay(d.acum, d.doc, t, v);
          M[t * L + v] = e1 * dth[v * H];
          CB[t * L + v] = e1 * CB[t * L + v];
        }
        return 0.0f;
      });
  // 4.
  if (carried)
    block_gemm<true, false>(
        stage, L, Ns, P, [&](int64_t t, int64_t p) { return X[t * Cc + p]; },
        [&](int64_t p, int64_t m) { return dS[p * Ns + m]; },
        [&](int64_t t, int64_t m, float v) {
          dbc[t * H * 2 * Ns + m] = d.w[t] * v;
          return v * Bm[t * Cc + m];
        },
        [&](int64_t t, float sum) { vb[t] = sum; });
  if (has_state)
    block_gemm<true, false>(
        stage, L, Ns, P, [&](int64_t t, int64_t p) { return dY[t * HP + p]; },
        [&](int64_t p, int64_t m) { return S0[p * Ns + m]; },
        [&](int64_t t, int64_t m, float v) {
          dbc[t * H * 2 * Ns + Ns + m] = d.e[t] * v;
          return v * Cm[t * Cc + m];
        },
        [&](int64_t t, float sum) { rc[t] = sum; });
  block_gemm<false, false>(
      stage, L, Ns, L, [&](int64_t t, int64_t r) { return M[r * L + t]; },
      [&](int64_t r, int64_t m) { return Cm[r * Cc + m]; },
      [&](int64_t t, int64_t m, float v) {
        float& db = dbc[t * H * 2 * Ns + m];
        db = (carried ? db : 0.0f) + v;
        return 0.0f;
      });
  block_gemm<true, false>(
      stage, L, Ns, L, [&](int64_t t, int64_t v) { return M[t * L + v]; },
      [&](int64_t v, int64_t m) { return Bm[v * Cc + m]; },
      [&](int64_t t, int64_t m, float v) {
        float& dc = dbc[t * H * 2 * Ns + Ns + m];
        dc = (has_state ? dc : 0.0f) + v;
        return 0.0f;
      });
  float sd = 0.0f;  // <S0, dS>: e_last's share
  if (carried && has_state)
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) sd += S0[i] * dS[i];
  sd = block_sum(sd);
  // 5. ddt_t: the direct shares of column t (and w_t's); dAcum_t: Dec's shares q_tv = direct_tv dt_v, + over
  // row t's v < t and - over column t's rows below, w_t's and e_t's.
  if (threadIdx.x < L) {
    const int64_t t = threadIdx.x;
    float direct = 0.0f, below = 0.0f, row = 0.0f;
    for (int64_t r = t; r < L; ++r) {
      direct += CB[r * L + t];
      if (r > t) below += CB[r * L + t] * dth[t * H];
    }
    for (int64_t v = 0; v < t; ++v) row += CB[t * L + v] * dth[v * H];
    float g = direct, a = row - below;
    if (carried) {
      g += vb[t] * d.wdec[t];
      if (t != L - 1) a -= vb[t] * d.w[t];
    }
    if (has_state) a += d.e[t] * rc[t];
    ddt[t] = g;
    dacum[t] = a;
  }
  __syncthreads();
  // 6. Acum_last's shares from w (every t but the last) and e_last; da_t = dAcum_t + ... + dAcum_last.
  if (threadIdx.x == 0) {
    float last = 0.0f;
    if (carried)
      for (int64_t t = 0; t + 1 < L; ++t) last += vb[t] * d.w[t];
    if (carried && has_state) last += d.e[L - 1] * sd;
    dacum[L - 1] += last;
    float acc = 0.0f, dA = 0.0f, dD = 0.0f;
    for (int64_t t = L; t-- > 0;) {
      acc += dacum[t];
      const bool first = s.starts_document(k.n0 + t);  // its decay is the constant 0
      d_dt[(k.n0 + t) * H + k.h] = ddt[t] + (first ? 0.0f : A * acc);
      if (!first) dA += acc * dth[t * H];
    }
    for (int64_t t = 0; t < L; ++t) dD += dyx[t];
    wk.dA[k.bhc] = dA;
    wk.dD[k.bhc] = dD;
  }
}

// du's B and C columns: each group's, the sum of its heads' gradients in head order.
__global__ void scan_sum_group_heads_kernel(float* du, const float* dbc, MambaShape s) {
  const int64_t gn = s.gn(), Ns = s.N, H = s.H, hpg = s.heads_per_group(), total = s.rows() * 2 * gn;
  for (int64_t i = grid_start(); i < total; i += grid_stride()) {
    const int64_t n = i / (2 * gn), j = i % (2 * gn), part = j / gn, g = (j % gn) / Ns, m = j % Ns;
    float acc = 0.0f;
    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) acc += dbc[((n * H + h) * 2 + part) * Ns + m];
    du[n * s.conv() + s.b_at() + j] = acc;
  }
}

// A thread per head: dA_log[h] += over the sequences in order, each its chunks' sum (in reverse, as the CPU
// adds them) times A; dD[h] likewise.
__global__ void scan_param_grads_kernel(float* dA_log, float* dD, ScanWork wk, const float* A_log, MambaShape s) {
  const int64_t nc = s.chunks();
  for (int64_t h = grid_start(); h < s.H; h += grid_stride()) {
    const float A = -math::exp(A_log[h]);
    float da = 0.0f, dd = 0.0f;
    for (int64_t b = 0; b < s.B; ++b) {
      float sa = 0.0f, sdd = 0.0f;
      for (int64_t c = nc; c-- > 0;) {
        sa += wk.dA[(b * s.H + h) * nc + c];
        sdd += wk.dD[(b * s.H + h) * nc + c];
      }
      da += sa * A;
      dd += sdd;
    }
    dA_log[h] += da;
    dD[h] += dd;
  }
}

// ---- the gated norm

// A block per row (a block-uniform loop over the rows), the groups in turn: rstd by a block sum, then
// out = w v rstd, v = y silu(z).
__global__ void gated_norm_forward_kernel(float* out, float* rstd, const float* y, const float* x, const float* w,
                                          MambaShape s) {
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
  for (int64_t n = blockIdx.x; n < s.rows(); n += gridDim.x)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      float ss = 0.0f;
      for (int64_t d = threadIdx.x; d < Dg; d += blockDim.x) {
        const float v = yg[d] * math::silu(zg[d]);
        ss += v * v;
      }
      const float r = 1.0f / sqrtf(block_sum(ss) / float(Dg) + s.norm_eps);
      if (threadIdx.x == 0) rstd[n * s.G + g] = r;
      for (int64_t d = threadIdx.x; d < Dg; d += blockDim.x)
        out[n * I + g * Dg + d] = w[g * Dg + d] * (yg[d] * math::silu(zg[d]) * r);
    }
}

// A block per row: dv = r (w dout - v r^2 mean(w dout v)); dy = dv silu(z), dz = dv y silu'(z).
__global__ void gated_norm_backward_kernel(float* dy, float* dx, const float* dout, const float* y, const float* x,
                                           const float* w, const float* rstd, MambaShape s) {
  const int64_t I = s.inner(), W = s.width(), Dg = s.group_width();
  for (int64_t n = blockIdx.x; n < s.rows(); n += gridDim.x)
    for (int64_t g = 0; g < s.G; ++g) {
      const float* yg = y + n * I + g * Dg;
      const float* zg = x + n * W + g * Dg;
      const float* dog = dout + n * I + g * Dg;
      const float* wg = w + g * Dg;
      const float r = rstd[n * s.G + g];
      float dot = 0.0f;
      for (int64_t d = threadIdx.x; d < Dg; d += blockDim.x) dot += wg[d] * dog[d] * yg[d] * math::silu(zg[d]);
      const float k = r * r * block_sum(dot) / float(Dg);
      for (int64_t d = threadIdx.x; d < Dg; d += blockDim.x) {
        const float sz = math::silu(zg[d]), v = yg[d] * sz;
        const float dv = r * (wg[d] * dog[d] - v * k);
        dy[n * I + g * Dg + d] = dv * sz;
        dx[n * W + g * Dg + d] = dv * yg[d] * math::silu_grad(zg[d]);
      }
    }
}

// The norm weight's gradient at row n, column c (of H P): dout v rstd.
struct NormWeightColumn {
  const float* dout;
  const float* y;
  const float* x;
  const float* rstd;
  MambaShape s;
  __device__ void operator()(int64_t n, int64_t c, float v[1]) const {
    const int64_t I = s.inner();
    v[0] = dout[n * I + c] * y[n * I + c] * math::silu(x[n * s.width() + c]) * rstd[n * s.G + c / s.group_width()];
  }
};

// The shape's checks and the CUDA kernels' own limit.
void check(const MambaShape& s, const char* what) {
  mamba_check_shape(s, what);
  LATTICE_CHECK(s.K <= kMaxKernel) << what << " (CUDA): convolution width " << s.K << " (at most " << kMaxKernel
                                   << ")";
  LATTICE_CHECK(s.chunk <= kMaxChunk) << what << " (CUDA): scan chunk " << s.chunk << " (at most " << kMaxChunk
                                      << ")";
}

// The scan's [L, L] tiles: n of them, L = the chunk's length (or the sequence's where shorter).
size_t chunk_tiles_bytes(const MambaShape& s, int n) {
  const int64_t L = s.chunk < s.T ? s.chunk : s.T;
  return size_t(n * L * L) * sizeof(float);
}

}  // namespace

void mamba_conv_forward(float* u, const float* x, const float* w, const float* bias, const MambaShape& s) {
  check(s, "mamba_conv_forward");
  launch(conv_forward_kernel, grid_for(s.rows() * s.conv(), kThreads), kThreads, 0, u, x, w, bias, s);
  LATTICE_CUDA_LAUNCHED("mamba_conv_forward");
}

void mamba_conv_backward(float* dx, float* dw, float* dbias, const float* du, const float* x, const float* w,
                         const float* bias, const MambaShape& s) {
  check(s, "mamba_conv_backward");
  launch(conv_backward_dx_kernel, grid_for(s.rows() * s.conv(), kThreads), kThreads, 0, dx, du, x, w, bias, s);
  LATTICE_CUDA_LAUNCHED("mamba_conv_backward (dx)");
  launch(conv_backward_params_kernel, unsigned(s.conv()), kThreads, size_t((s.K + 1) * kThreads) * sizeof(float), dw,
         dbias, du, x, w, bias, s);
  LATTICE_CUDA_LAUNCHED("mamba_conv_backward (dw, dbias)");
}

void mamba_dt_forward(float* dt, const float* x, const float* dt_bias, const MambaShape& s) {
  check(s, "mamba_dt_forward");
  launch(dt_forward_kernel, grid_for(s.rows() * s.H, kThreads), kThreads, 0, dt, x, dt_bias, s);
  LATTICE_CUDA_LAUNCHED("mamba_dt_forward");
}

void mamba_dt_backward(float* dx, float* d_dt_bias, const float* d_dt, const float* x, const float* dt_bias,
                       const MambaShape& s) {
  check(s, "mamba_dt_backward");
  launch(dt_backward_kernel, grid_for(s.rows() * s.H, kThreads), kThreads, 0, dx, d_dt, x, dt_bias, s);
  LATTICE_CUDA_LAUNCHED("mamba_dt_backward");
  launch(dt_bias_grad_kernel, unsigned(s.H), kThreads, 0, d_dt_bias, dx, s);
  LATTICE_CUDA_LAUNCHED("mamba_dt_backward (dt_bias)");
}

void mamba_scan_forward(float* y, float* checkpoints, const float* u, const float* dt, const float* A_log,
                        const float* D, const MambaShape& s, float* state) {
  check(s, "mamba_scan_forward");
  const int64_t chunks = s.B * s.H * s.chunks();
  // The chunks' added states become the checkpoints in place; without checkpoints they are made in a
  // buffer of their size. e_last [B H chunks] after them.
  float* scratch = nullptr;
  const size_t scratch_floats = size_t(chunks) * (checkpoints ? 1 : size_t(s.state()) + 1);
  LATTICE_CUDA_CALL(
      cudaMallocAsync(reinterpret_cast<void**>(&scratch), scratch_floats * sizeof(float), stream()));
  float* starts = checkpoints ? checkpoints : scratch;
  float* e_last = checkpoints ? scratch : scratch + chunks * s.state();
  launch(scan_chunk_state_kernel, unsigned(chunks), kScanThreads, 0, starts, e_last, u, dt, A_log, s,
         state != nullptr);
  LATTICE_CUDA_LAUNCHED("mamba_scan_forward (chunk states)");
  launch(scan_pass_states_kernel, grid_for(s.B * s.H * s.state(), kThreads), kThreads, 0, starts, state, starts,
         e_last, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_forward (passed states)");
  launch(scan_chunk_output_kernel, unsigned(chunks), kScanThreads, chunk_tiles_bytes(s, 1), y, starts, u, dt, A_log,
         D, s, state != nullptr);
  LATTICE_CUDA_LAUNCHED("mamba_scan_forward (outputs)");
  LATTICE_CUDA_CALL(cudaFreeAsync(scratch, stream()));
}

void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s) {
  check(s, "mamba_scan_backward");
  LATTICE_CHECK(work != nullptr) << "mamba_scan_backward (CUDA): no workspace (mamba_scan_work floats)";
  const ScanWork wk = scan_work(work, s);
  const unsigned chunks = unsigned(s.B * s.H * s.chunks());
  launch(scan_chunk_dstate_kernel, chunks, kScanThreads, 0, wk, dy, u, dt, A_log, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward (chunk state gradients)");
  launch(scan_pass_dstates_kernel, grid_for(s.B * s.H * s.state(), kThreads), kThreads, 0, wk, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward (passed state gradients)");
  launch(scan_chunk_backward_kernel, chunks, kScanThreads, chunk_tiles_bytes(s, 2), du, d_dt, wk, dy, checkpoints, u,
         dt, A_log, D, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward");
  launch(scan_sum_group_heads_kernel, grid_for(s.rows() * 2 * s.gn(), kThreads), kThreads, 0, du, wk.dbc, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward (B, C)");
  launch(scan_param_grads_kernel, grid_for(s.H, kThreads), kThreads, 0, dA_log, dD, wk, A_log, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward (A_log, D)");
}

void mamba_gated_norm_forward(float* out, float* rstd, const float* y, const float* x, const float* w,
                              const MambaShape& s) {
  check(s, "mamba_gated_norm_forward");
  launch(gated_norm_forward_kernel, grid_rows(s.rows()), kThreads, 0, out, rstd, y, x, w, s);
  LATTICE_CUDA_LAUNCHED("mamba_gated_norm_forward");
}

void mamba_gated_norm_backward(float* dy, float* dx, float* dw, const float* dout, const float* y, const float* x,
                               const float* w, const float* rstd, const MambaShape& s) {
  check(s, "mamba_gated_norm_backward");
  launch(gated_norm_backward_kernel, grid_rows(s.rows()), kThreads, 0, dy, dx, dout, y, x, w, rstd, s);
  LATTICE_CUDA_LAUNCHED("mamba_gated_norm_backward");
  column_sums_accumulate<1>(ColumnOutputs{{dw, nullptr, nullptr}}, NormWeightColumn{dout, y, x, rstd, s}, s.rows(),
                            s.inner(), "mamba_gated_norm_backward (dw)");
}

}  // namespace lattice::cuda
