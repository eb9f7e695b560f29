// Mamba-2's kernels on the GPU (kernels/mamba.h): element kernels with a thread per element for the
// convolution and dt; the convolution's weight and bias gradients and dt_bias's with a block per output,
// reduced in a fixed order (ops_reduce.cuh); the gated norm with a block per row and its weight gradient
// by column sums. The scan runs token by token with a block per (sequence, head) and a thread per state row
// p (the rows evolve independently); the state is kept transposed, [N, P] (one m's rows contiguous, so a
// warp's accesses are), in shared memory when it fits and in global memory otherwise. The backward
// recomputes each chunk's states from its checkpoint into `work`, then walks the chunk in reverse: a
// thread per row p for the state's gradient, a thread per column m for B's and C's gradients (per head,
// summed over the group's heads in head order by a second kernel), and the per-head parameters'
// gradients summed per (sequence, head) and then over the sequences in order. No float atomics.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/mamba.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxKernel = 32;              // the convolution's width (its gradient's shared accumulators)
constexpr int64_t kSharedStateMax = 48 * 1024;  // bytes: the scan forward's state in shared memory up to this

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

// ---- the scan

// The state's decay at row n for head h (A = -exp(A_log[h])): exp(dt A), or 0 at a document's first token.
__device__ __forceinline__ float step_decay(float d, float A, int64_t n, const MambaShape& s) {
  return s.starts_document(n) ? 0.0f : math::exp(d * A);
}

// Block (b, h), thread p (looping when P exceeds the block): row p of the state, st[m * P + p], in dynamic
// shared memory or, where spill is given, in spill [B H, N, P]; from and back to state [B H, P, N] where given.
__global__ void scan_forward_kernel(float* y, float* checkpoints, float* state, float* spill, const float* u,
                                    const float* dt, const float* A_log, const float* D, MambaShape s) {
  LATTICE_DYNAMIC_SHARED(float, sh);
  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.heads_per_group();
  const int64_t P = s.P, Ns = s.N, H = s.H, Cc = s.conv(), S = s.state();
  float* st = spill ? spill + bh * S : sh;
  const float A = -math::exp(A_log[h]), Dh = D[h];
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    float* carried = state ? state + bh * S + p * Ns : nullptr;
    for (int64_t m = 0; m < Ns; ++m) st[m * P + p] = carried ? carried[m] : 0.0f;
    for (int64_t t = 0; t < s.T; ++t) {
      const int64_t n = b * s.T + t;
      if (checkpoints && t % s.chunk == 0) {
        float* cp = checkpoints + (bh * s.chunks() + t / s.chunk) * S + p * Ns;
        for (int64_t m = 0; m < Ns; ++m) cp[m] = st[m * P + p];
      }
      const float* Bg = u + n * Cc + s.b_at() + g * Ns;
      const float* Cg = u + n * Cc + s.c_at() + g * Ns;
      const float xs = u[n * Cc + h * P + p], d = dt[n * H + h], a = step_decay(d, A, n, s), dx = d * xs;
      float acc = 0.0f;
      for (int64_t m = 0; m < Ns; ++m) {
        const float v = a * st[m * P + p] + dx * Bg[m];
        st[m * P + p] = v;
        acc += v * Cg[m];
      }
      y[(n * H + h) * P + p] = acc + Dh * xs;
    }
    if (carried)
      for (int64_t m = 0; m < Ns; ++m) carried[m] = st[m * P + p];
  }
}

// The backward's workspace (mamba_scan_work floats), in order: each (sequence, head)'s state gradient
// and chunk states [B H, chunk + 2, N, P] (the gradient, then the states before each of the chunk's
// tokens and after its last); each head's B and C gradients [rows, H, 2, N]; each (sequence, head)'s
// A_log and D gradients [2, B H].
struct ScanWork {
  float* block;  // [B H, chunk + 2, N, P]
  float* dbc;    // [rows, H, 2, N]
  float* dA;     // [B H]
  float* dD;     // [B H]
};
ScanWork scan_work(float* work, const MambaShape& s) {
  ScanWork w;
  w.block = work;
  w.dbc = w.block + s.B * s.H * (s.chunk + 2) * s.state();
  w.dA = w.dbc + s.rows() * s.H * 2 * s.N;
  w.dD = w.dA + s.B * s.H;
  return w;
}

// Block (b, h). Per chunk, in reverse: states[i] [N, P] the state before the chunk's token i, from the
// checkpoint (a thread per row p); then per token, in reverse, with dS [N, P] the gradient of the state
// after it:
//   rows p:    dS += dy C^T; dxs = D dy + dt dS B; the token's d(dt) and the dA and dD terms;
//   columns m: dB = dt dS^T xs, dC = S^T dy (into work's per-head dbc);
//   rows p:    dS = a dS (the gradient of the state before the token).
__global__ void scan_backward_kernel(float* du, float* d_dt, ScanWork wk, const float* dy, const float* checkpoints,
                                     const float* u, const float* dt, const float* A_log, const float* D,
                                     MambaShape s) {
  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.heads_per_group();
  const int64_t P = s.P, Ns = s.N, H = s.H, Cc = s.conv(), S = s.state(), T = s.T, tid = threadIdx.x;
  const int64_t stride = blockDim.x;
  float* dS = wk.block + bh * (s.chunk + 2) * S;
  float* states = dS + S;
  const float A = -math::exp(A_log[h]), Dh = D[h];
  float dA = 0.0f, dDh = 0.0f;  // this thread's rows' shares, over the tokens
  for (int64_t p = tid; p < P; p += stride)
    for (int64_t m = 0; m < Ns; ++m) dS[m * P + p] = 0.0f;
  for (int64_t c = s.chunks(); c-- > 0;) {
    const int64_t t0 = c * s.chunk, L = (t0 + s.chunk < T ? t0 + s.chunk : T) - t0;
    // The chunk's states, each thread its own rows (the previous chunk's readers passed the last barrier).
    const float* cp = checkpoints + (bh * s.chunks() + c) * S;
    for (int64_t p = tid; p < P; p += stride) {
      for (int64_t m = 0; m < Ns; ++m) states[m * P + p] = cp[p * Ns + m];
      for (int64_t i = 0; i < L; ++i) {
        const int64_t n = b * T + t0 + i;
        const float* Bg = u + n * Cc + s.b_at() + g * Ns;
        const float d = dt[n * H + h], a = step_decay(d, A, n, s), dx = d * u[n * Cc + h * P + p];
        const float* prev = states + i * S;
        float* next = states + (i + 1) * S;
        for (int64_t m = 0; m < Ns; ++m) next[m * P + p] = a * prev[m * P + p] + dx * Bg[m];
      }
    }
    for (int64_t i = L; i-- > 0;) {
      const int64_t n = b * T + t0 + i;
      const float* xs = u + n * Cc + h * P;
      const float* Bg = u + n * Cc + s.b_at() + g * Ns;
      const float* Cg = u + n * Cc + s.c_at() + g * Ns;
      const float* dyn = dy + (n * H + h) * P;
      const float* before = states + i * S;
      const float* after = before + S;
      const bool reset = s.starts_document(n);
      const float d = dt[n * H + h], a = reset ? 0.0f : math::exp(d * A), decay_grad = reset ? 0.0f : A * a;
      float ddt = 0.0f;  // this thread's rows' share of d(dt): <dS, xs B^T> + A a <dS, S'>
      for (int64_t p = tid; p < P; p += stride) {
        const float dp = dyn[p];
        float sb = 0.0f, sd = 0.0f;
        for (int64_t m = 0; m < Ns; ++m) {
          const float v = dS[m * P + p] + dp * Cg[m];
          dS[m * P + p] = v;
          sb += v * Bg[m];
          sd += v * before[m * P + p];
        }
        du[n * Cc + h * P + p] = Dh * dp + d * sb;
        ddt += sb * xs[p] + decay_grad * sd;
        if (!reset) dA += d * a * sd;
        dDh += dp * xs[p];
      }
      __syncthreads();  // dS complete for the columns
      float* dbc = wk.dbc + (n * H + h) * 2 * Ns;
      for (int64_t m = tid; m < Ns; m += stride) {
        float sx = 0.0f, sy = 0.0f;
        for (int64_t p = 0; p < P; ++p) {
          sx += dS[m * P + p] * xs[p];
          sy += after[m * P + p] * dyn[p];
        }
        dbc[m] = d * sx;
        dbc[Ns + m] = sy;
      }
      ddt = block_sum(ddt);  // (its barriers also order the columns' reads of dS before the update below)
      if (tid == 0) d_dt[n * H + h] = ddt;
      for (int64_t p = tid; p < P; p += stride)
        for (int64_t m = 0; m < Ns; ++m) dS[m * P + p] *= a;
    }
  }
  dA = block_sum(dA);
  dDh = block_sum(dDh);
  if (tid == 0) {
    wk.dA[bh] = dA * A;  // dA_log = dA dA/dA_log = dA A
    wk.dD[bh] = dDh;
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

// dA_log[h] += the sequences' gradients in order, dD[h] likewise: a thread per head.
__global__ void scan_param_grads_kernel(float* dA_log, float* dD, const float* dA_b, const float* dD_b, MambaShape s) {
  for (int64_t h = grid_start(); h < s.H; h += grid_stride()) {
    float da = 0.0f, dd = 0.0f;
    for (int64_t b = 0; b < s.B; ++b) {
      da += dA_b[b * s.H + h];
      dd += dD_b[b * s.H + h];
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
}

// Threads for a block covering n rows or columns: a multiple of the warp, at most 1024 (loops beyond).
unsigned block_for(int64_t n) { return unsigned(n >= 1024 ? 1024 : (n + 31) / 32 * 32); }

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
  const size_t state_bytes = size_t(s.state()) * sizeof(float);
  const bool shared = int64_t(state_bytes) <= kSharedStateMax;
  float* spill = nullptr;  // [B H, N, P] where the state does not fit in shared memory
  if (!shared)
    LATTICE_CUDA_CALL(
        cudaMallocAsync(reinterpret_cast<void**>(&spill), size_t(s.B * s.H) * state_bytes, stream()));
  launch(scan_forward_kernel, unsigned(s.B * s.H), block_for(s.P), shared ? state_bytes : 0, y, checkpoints, state, spill,
         u, dt, A_log, D, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_forward");
  if (spill) LATTICE_CUDA_CALL(cudaFreeAsync(spill, stream()));
}

void mamba_scan_backward(float* du, float* d_dt, float* dA_log, float* dD, float* work, const float* dy,
                         const float* checkpoints, const float* u, const float* dt, const float* A_log, const float* D,
                         const MambaShape& s) {
  check(s, "mamba_scan_backward");
  LATTICE_CHECK(work != nullptr) << "mamba_scan_backward (CUDA): no workspace (mamba_scan_work floats)";
  const ScanWork wk = scan_work(work, s);
  launch(scan_backward_kernel, unsigned(s.B * s.H), block_for(s.P > s.N ? s.P : s.N), 0, du, d_dt, wk, dy,
         checkpoints, u, dt, A_log, D, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward");
  launch(scan_sum_group_heads_kernel, grid_for(s.rows() * 2 * s.gn(), kThreads), kThreads, 0, du, wk.dbc, s);
  LATTICE_CUDA_LAUNCHED("mamba_scan_backward (B, C)");
  launch(scan_param_grads_kernel, grid_for(s.H, kThreads), kThreads, 0, dA_log, dD, wk.dA, wk.dD, s);
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
