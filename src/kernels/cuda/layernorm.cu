// LayerNorm on the GPU. Forward: one block per row, held in registers (and, fused with the
// bias-dropout-add that makes the row, never read back). Backward: one block per 16 rows, dx
// row by row with the dw, db (and the next layer's bias) sums kept per thread, then added
// block by block through the deterministic column sums (fixed order: no float atomics).
#include <cmath>
#include <type_traits>
#include <utility>

#include "core/philox.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// Rows of up to kMaxV * kThreads columns are held in registers, thread t the columns
// t + kThreads v (v < V): read once, and the same code whichever kernel made the row.
constexpr int kMaxV = 8;

// f(std::integral_constant<int, V>{}) with V = the columns per thread of rows of C; false
// (f not called) for rows wider than kMaxV * kThreads.
template <int V = 1, class F>
bool with_columns_per_thread(int64_t C, F&& f) {
  if constexpr (V > kMaxV) {
    return false;
  } else {
    if ((C + kThreads - 1) / kThreads == V) {
      f(std::integral_constant<int, V>{});
      return true;
    }
    return with_columns_per_thread<V + 1>(C, f);
  }
}

// Two-pass statistics as on the CPU (mean, then the mean squared deviation; with rms the mean
// is 0: RMSNorm) of the row this block holds (v[k]: column threadIdx.x + kThreads k), and the
// normalized row into o_n, fp32 or bf16. Every thread of the block calls it.
template <int V, class O>
__device__ __forceinline__ void normalize_row(O* o_n, float* mean_n, float* rstd_n, const float (&v)[V],
                                              const float* w, const float* b, int64_t C, float eps, bool rms) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (threadIdx.x + int64_t(kThreads) * k < C) s += v[k];
  const float m = rms ? 0.0f : block_sum(s) / float(C);  // RMSNorm: no mean (uniform over the block)
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (threadIdx.x + int64_t(kThreads) * k < C) {
      const float d = v[k] - m;
      q += d * d;
    }
  const float var = block_sum(q) / float(C);
  const float r = 1.0f / sqrtf(var + eps);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = threadIdx.x + int64_t(kThreads) * k;
    if (c < C) math::store_as(o_n, c, (v[k] - m) * r * w[c] + b[c]);
  }
  if (threadIdx.x == 0) {
    *mean_n = m;
    *rstd_n = r;
  }
}

template <int V, class T>
__global__ void __launch_bounds__(kThreads) layernorm_forward_kernel(T* out, float* mean, float* rstd, const float* x,
                                                                     const float* w, const float* b, int64_t N,
                                                                     int64_t C, float eps, bool rms) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = threadIdx.x + int64_t(kThreads) * k;
      v[k] = c < C ? x[n * C + c] : 0.0f;
    }
    normalize_row(out + n * C, mean + n, rstd + n, v, w, b, C, eps, rms);
  }
}

// The same for wider rows, read from memory three times.
template <class T>
__global__ void layernorm_forward_wide_kernel(T* out, float* mean, float* rstd, const float* x, const float* w,
                                              const float* b, int64_t N, int64_t C, float eps, bool rms) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x_n = x + n * C;
    T* o_n = out + n * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += x_n[c];
    const float m = rms ? 0.0f : block_sum(s) / float(C);
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = x_n[c] - m;
      q += d * d;
    }
    const float var = block_sum(q) / float(C);
    const float r = 1.0f / sqrtf(var + eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) math::store_as(o_n, c, (x_n[c] - m) * r * w[c] + b[c]);
    if (threadIdx.x == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
}

// bias_dropout_add_kernel's sums (dropout.cu: the same explicitly rounded operations and
// Philox draws, the block of element i drawn for it alone) kept in registers, written, and
// normalized by normalize_row as layernorm_forward_kernel normalizes the row it reads back:
// the same bits.
template <int V, class Y, class O>
__global__ void __launch_bounds__(kThreads)
    bias_dropout_add_layernorm_kernel(float* out, O* ln_out, float* mean, float* rstd, const float* residual,
                                      const Y* y, const float* bias, const float* w, const float* b, int64_t N,
                                      int64_t C, float eps, bool rms, bool dropout, uint32_t threshold, float scale,
                                      PhiloxStream stream, uint64_t first_index, Rounding round_y) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = threadIdx.x + int64_t(kThreads) * k;
      v[k] = 0.0f;
      if (c >= C) continue;
      const int64_t i = n * C + c;
      const float yi = math::round_as(math::load_as(y, i), round_y);
      float t = bias ? __fadd_rn(yi, bias[c]) : yi;
      if (dropout) {
        const uint64_t idx = first_index + uint64_t(i);
        const PhiloxCounter r = stream.block(idx >> 2);
        t = (r[int(idx & 3u)] >> 8) >= threshold ? __fmul_rn(t, scale) : 0.0f;
      }
      v[k] = __fadd_rn(residual[i], t);
      out[i] = v[k];
    }
    normalize_row(ln_out + n * C, mean + n, rstd + n, v, w, b, C, eps, rms);
  }
}

// dout[i] as the backward reads it: fp32 rounded as read, or a bf16 pattern.
__device__ __forceinline__ float dout_at(const float* d, int64_t i, Rounding r) { return math::round_as(d[i], r); }
__device__ __forceinline__ float dout_at(const uint16_t* d, int64_t i, Rounding) { return math::bf16_to_fp32(d[i]); }

// The fused backward: each block takes kBwdRows consecutive rows, one after the other, each
// thread the columns threadIdx.x + kThreads v (v < V). Per row, as a block per row would:
//   dx[n, k] += r * (dout w - mean(dout w) - xhat * mean(dout w xhat))
// (with the bf16 cast of the result when next_bf16), while the thread adds the row's
// dout * xhat, dout (and, with next_bf16, the new dx) to its columns' sums. A block writes
// its sums to partial[block][K][C]; column_sums_accumulate then adds the blocks in order.
// One read of dout and x instead of two, and none of dx for the next bias gradient.
constexpr int kBwdRows = 16;

template <int V, class T>
__global__ void __launch_bounds__(kThreads)
    layernorm_backward_fused_kernel(float* dx, uint16_t* next_bf16, float* partial, const T* dout, Rounding round_dout,
                                    const float* x, const float* w, const float* mean, const float* rstd, int64_t N,
                                    int64_t C, int K, bool rms) {
  const int64_t r0 = int64_t(blockIdx.x) * kBwdRows, r1 = r0 + kBwdRows < N ? r0 + kBwdRows : N;
  float wv[V], acc_w[V], acc_b[V], acc_dx[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = threadIdx.x + int64_t(kThreads) * v;
    wv[v] = c < C ? w[c] : 0.0f;
    acc_w[v] = acc_b[v] = acc_dx[v] = 0.0f;
  }
  for (int64_t n = r0; n < r1; ++n) {
    const float m = mean[n], r = rstd[n];
    float d[V], xv[V];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = threadIdx.x + int64_t(kThreads) * v;
      d[v] = xv[v] = 0.0f;
      if (c < C) {
        d[v] = dout_at(dout, n * C + c, round_dout);
        xv[v] = x[n * C + c];
        const float g = d[v] * wv[v];
        sg += g;
        sgx += g * (xv[v] - m) * r;
      }
    }
    const float mean_g = rms ? 0.0f : block_sum(sg) / float(C);  // RMSNorm: no mean term
    const float mean_gx = block_sum(sgx) / float(C);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = threadIdx.x + int64_t(kThreads) * v;
      if (c >= C) continue;
      const float xhat = (xv[v] - m) * r;
      const float g = dx[n * C + c] + r * (d[v] * wv[v] - mean_g - xhat * mean_gx);
      dx[n * C + c] = g;
      acc_w[v] += d[v] * (xv[v] - m) * r;
      acc_b[v] += d[v];
      if (next_bf16) {
        next_bf16[n * C + c] = math::fp32_to_bf16(g);
        acc_dx[v] += g;
      }
    }
  }
  float* out = partial + int64_t(blockIdx.x) * K * C;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = threadIdx.x + int64_t(kThreads) * v;
    if (c >= C) continue;
    out[c] = acc_w[v];
    out[C + c] = acc_b[v];
    if (K == 3) out[2 * C + c] = acc_dx[v];
  }
}

// The blocks' sums as the rows of a [blocks, K*C] array, for column_sums_accumulate.
template <int K>
struct PartialSums {
  const float* partial;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float v[K]) const {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = partial[(n * K + k) * C + c];
  }
};

// Rows wider than kMaxV * kThreads: dx by one block per row, then dw, db through the
// column sums (reading dout and x again), then the next layer's gradients from dx.
template <class T>
__global__ void layernorm_backward_dx_kernel(float* dx, const T* dout, const float* x, const float* w,
                                             const float* mean, const float* rstd, int64_t N, int64_t C,
                                             Rounding round_dout, bool rms) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* x_n = x + n * C;
    const T* d_n = dout + n * C;
    float* dx_n = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = dout_at(d_n, c, round_dout) * w[c];
      sg += g;
      sgx += g * (x_n[c] - m) * r;
    }
    const float mean_g = rms ? 0.0f : block_sum(sg) / float(C);
    const float mean_gx = block_sum(sgx) / float(C);
    for (int64_t k = threadIdx.x; k < C; k += blockDim.x) {
      const float xhat = (x_n[k] - m) * r;
      dx_n[k] += r * (dout_at(d_n, k, round_dout) * w[k] - mean_g - xhat * mean_gx);
    }
  }
}

// (dout * xhat, dout) at (n, c) for the dw, db column sums.
template <class T>
struct LayernormParamGrads {
  const T* dout;
  const float* x;
  const float* mean;
  const float* rstd;
  int64_t C;
  Rounding round_dout;
  __device__ void operator()(int64_t n, int64_t c, float v[2]) const {
    const float d = dout_at(dout, n * C + c, round_dout);
    v[0] = d * (x[n * C + c] - mean[n]) * rstd[n];
    v[1] = d;
  }
};

template <class T>
void backward_unfused(float* dx, float* dw, float* db, const T* dout, Rounding round_dout, const float* x,
                      const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                      ResidualGradOut next, bool rms) {
  launch(layernorm_backward_dx_kernel<T>, grid_rows(N), kThreads, 0, dx, dout, x, w, mean, rstd, N, C, round_dout,
         rms);
  LATTICE_CUDA_LAUNCHED("layernorm_backward dx");
  column_sums_accumulate<2>(ColumnOutputs{{dw, db}}, LayernormParamGrads<T>{dout, x, mean, rstd, C, round_dout}, N,
                            C, "layernorm_backward dw/db");
  if (next.bf16) bias_backward_cast_bf16(next.bias_grad, next.bf16, dx, N, C);
}

template <int V, class T>
void backward_fused(float* dx, float* dw, float* db, const T* dout, Rounding round_dout, const float* x,
                    const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                    ResidualGradOut next, bool rms) {
  const int K = next.bf16 ? 3 : 2;
  const int64_t blocks = (N + kBwdRows - 1) / kBwdRows;
  LATTICE_CHECK(blocks <= 2147483647) << "layernorm_backward: N " << N << " too large";
  float* partial = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&partial), size_t(blocks * K * C) * sizeof(float),
                                    stream()));
  launch(layernorm_backward_fused_kernel<V, T>, unsigned(blocks), kThreads, 0, dx, next.bf16, partial, dout,
         round_dout, x, w, mean, rstd, N, C, K, rms);
  LATTICE_CUDA_LAUNCHED("layernorm_backward");
  if (K == 3)
    column_sums_accumulate<3>(ColumnOutputs{{dw, db, next.bias_grad}}, PartialSums<3>{partial, C}, blocks, C,
                              "layernorm_backward column sums");
  else
    column_sums_accumulate<2>(ColumnOutputs{{dw, db}}, PartialSums<2>{partial, C}, blocks, C,
                              "layernorm_backward column sums");
  LATTICE_CUDA_CALL(cudaFreeAsync(partial, stream()));
}

template <class T>
void backward_typed(float* dx, float* dw, float* db, const T* dout, Rounding round_dout, const float* x,
                    const float* w, const float* mean, const float* rstd, int64_t N, int64_t C,
                    ResidualGradOut next, bool rms) {
  const bool held = with_columns_per_thread(C, [&](auto v) {
    backward_fused<decltype(v)::value>(dx, dw, db, dout, round_dout, x, w, mean, rstd, N, C, next, rms);
  });
  if (!held) backward_unfused(dx, dw, db, dout, round_dout, x, w, mean, rstd, N, C, next, rms);
}

}  // namespace

namespace {
template <class T>
void launch_layernorm_forward(T* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                              int64_t N, int64_t C, float eps, bool rms, const char* what) {
  if (N <= 0) return;
  LATTICE_CHECK(C > 0) << what << ": C " << C;
  const bool held = with_columns_per_thread(C, [&](auto v) {
    launch(layernorm_forward_kernel<decltype(v)::value, T>, grid_rows(N), kThreads, 0, out, mean, rstd, x, w, b, N, C,
           eps, rms);
  });
  if (!held)
    launch(layernorm_forward_wide_kernel<T>, grid_rows(N), kThreads, 0, out, mean, rstd, x, w, b, N, C, eps, rms);
  LATTICE_CUDA_LAUNCHED(what);
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps, Normalization kind) {
  launch_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, kind == Normalization::rmsnorm, "layernorm_forward");
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps, Normalization kind) {
  launch_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps, kind == Normalization::rmsnorm,
                           "layernorm_forward_bf16");
}

namespace {
template <int V, class Y, class O>
void launch_bdal(float* out, O* ln_out, const float* residual, const Y* y, const float* bias, int64_t N, int64_t C,
                 float p, const PhiloxStream& stream, uint64_t first_index, Rounding round_y, const LayerNormOut& ln) {
  const float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  const uint32_t threshold = dropout_threshold(p);
  launch(bias_dropout_add_layernorm_kernel<V, Y, O>, grid_rows(N), kThreads, 0, out, ln_out, ln.mean, ln.rstd,
         residual, y, bias, ln.w, ln.b, N, C, ln.eps, ln.kind == Normalization::rmsnorm, p > 0.0f, threshold, scale,
         stream, first_index, round_y);
  LATTICE_CUDA_LAUNCHED("bias_dropout_add_layernorm_forward");
}

template <class Y, class O>
void bdal_typed(float* out, O* ln_out, const float* residual, const Y* y, const float* bias, int64_t N, int64_t C,
                float p, const PhiloxStream& stream, uint64_t first_index, Rounding round_y, const LayerNormOut& ln) {
  const bool held = with_columns_per_thread(C, [&](auto v) {
    launch_bdal<decltype(v)::value>(out, ln_out, residual, y, bias, N, C, p, stream, first_index, round_y, ln);
  });
  if (held) return;
  // Wider rows: the two kernels.
  if constexpr (std::is_same_v<Y, float>)
    bias_dropout_add_forward(out, residual, y, bias, N, C, p, stream, first_index, round_y);
  else
    bias_dropout_add_forward(out, residual, y, bias, N, C, p, stream, first_index);
  launch_layernorm_forward(ln_out, ln.mean, ln.rstd, out, ln.w, ln.b, N, C, ln.eps, ln.kind == Normalization::rmsnorm,
                           "layernorm_forward");
}

template <class Y>
void bdal(float* out, const float* residual, const Y* y, const float* bias, int64_t N, int64_t C, float p,
          const PhiloxStream& stream, uint64_t first_index, Rounding round_y, const LayerNormOut& ln) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "bias_dropout_add: dropout probability " << p << " not in [0, 1)";
  LATTICE_CHECK((ln.f32 == nullptr) != (ln.bf16 == nullptr)) << "bias_dropout_add_layernorm_forward: one output";
  if (N <= 0 || C <= 0) return;
  if (ln.bf16)
    bdal_typed(out, ln.bf16, residual, y, bias, N, C, p, stream, first_index, round_y, ln);
  else
    bdal_typed(out, ln.f32, residual, y, bias, N, C, p, stream, first_index, round_y, ln);
}
}  // namespace

void bias_dropout_add_layernorm_forward(float* out, const float* residual, const float* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, Rounding round_y, const LayerNormOut& ln) {
  bdal(out, residual, y, bias, N, C, p, stream, first_index, round_y, ln);
}

void bias_dropout_add_layernorm_forward(float* out, const float* residual, const uint16_t* y, const float* bias,
                                        int64_t N, int64_t C, float p, const PhiloxStream& stream,
                                        uint64_t first_index, const LayerNormOut& ln) {
  bdal(out, residual, y, bias, N, C, p, stream, first_index, Rounding::none, ln);
}

void layernorm_backward(float* dx, float* dw, float* db, LayerNormDout dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, ResidualGradOut next,
                        Normalization kind) {
  if (N <= 0 || C <= 0) return;
  const bool rms = kind == Normalization::rmsnorm;
  if (dout.bf16)
    backward_typed(dx, dw, db, dout.bf16, Rounding::none, x, w, mean, rstd, N, C, next, rms);
  else
    backward_typed(dx, dw, db, dout.f32, dout.round, x, w, mean, rstd, N, C, next, rms);
}

}  // namespace lattice::cuda
