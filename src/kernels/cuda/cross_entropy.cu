// Softmax cross entropy on the GPU: one block per row. The exponentials use the CPU's
// exp (kernels/fast_math.h); their sum is accumulated in double per thread and reduced
// in double in a fixed tree, so it is at least as accurate as the CPU's float lanes
// summed in double, and the same from run to run.
#include <cmath>

#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"
#include "kernels/fast_math.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 512;

// A logit as the kernels read it: an fp32 value rounded by r (the GEMM result's rounding,
// none when rounded already), or a bf16 pattern widened.
__device__ inline float load(const float* x, int64_t i, Rounding r) { return math::round_as(x[i], r); }
__device__ inline float load(const uint16_t* x, int64_t i, Rounding) { return math::bf16_to_fp32(x[i]); }

template <class T>
__device__ float row_max(const T* x, int64_t V, Rounding r = Rounding::none) {
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = load(x, v, r);
    m = xv > m ? xv : m;
  }
  return block_reduce(m, MaxOp{}, -INFINITY);
}

// sum_v exp(x[v] - max) over v < V; kStore overwrites x with the exponentials (each
// thread writes only the columns it reads, and reads them again in the same order later).
template <bool kStore, class T>
__device__ double row_sum_exp(T* x, float max, int64_t V, Rounding r = Rounding::none) {
  double s = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float e = math::exp(load(x, v, r) - max);
    if constexpr (kStore) x[v] = e;
    s += double(e);
  }
  return block_sum(s);
}

// x[v] = e[v] * k (- scale at the target) for v < valid, 0 for v in [valid, Vl).
// __fmul_rn keeps the product rounded before the subtraction, as on the CPU.
__device__ void scale_row(float* x, float k, float scale, int64_t t, int64_t valid, int64_t Vl) {
  for (int64_t v = threadIdx.x; v < Vl; v += blockDim.x) {
    float g = 0.0f;
    if (v < valid) {
      g = __fmul_rn(x[v], k);
      if (v == t) g -= scale;
    }
    x[v] = g;
  }
}

// losses[n] = logsumexp(x[n, :V]) - x[n, target]; kBackward: x becomes dlogits.
template <bool kBackward>
__global__ void cross_entropy_kernel(float* logits, float* losses, const int32_t* targets,
                                     const float* loss_mask, float grad_scale, int64_t N, int64_t V,
                                     int64_t Vp) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float* x = logits + n * Vp;
    const int64_t t = targets[n];
    const bool valid_target = t >= 0 && t < V;
    const float x_t = valid_target ? x[t] : 0.0f;  // read before any thread overwrites it
    const float m = row_max(x, V);                 // (row_max synchronises the block)
    const double sum = row_sum_exp<kBackward>(x, m, V);
    if (threadIdx.x == 0)
      losses[n] = valid_target ? float(log(sum) + double(m) - double(x_t)) : NAN;
    if constexpr (kBackward) {
      const float scale = grad_scale * (loss_mask ? loss_mask[n] : 1.0f);
      const float k = float(double(scale) / sum);
      scale_row(x, k, scale, valid_target ? t : -1, V, Vp);
    }
    __syncthreads();  // the next row's reductions reuse the shared scratch
  }
}

__global__ void vp_max_kernel(float* row_max_out, const float* logits, int64_t N, int64_t valid, int64_t Vl,
                              Rounding r) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = row_max(logits + n * Vl, valid, r);
    if (threadIdx.x == 0) row_max_out[n] = m;
  }
}

template <bool kStore>
__global__ void vp_partials_kernel(double* stats, float* logits, const float* rmax, const int32_t* targets,
                                   int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl, Rounding r) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float* x = logits + n * Vl;
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    if (threadIdx.x == 0) stats[2 * n + 1] = t >= 0 && t < valid ? double(math::round_as(x[t], r)) : 0.0;
    __syncthreads();  // the target's logit is read before the exponentials overwrite it
    const double sum = row_sum_exp<kStore>(x, rmax[n], valid, r);
    if (threadIdx.x == 0) stats[2 * n] = sum;
  }
}

__global__ void vp_loss_kernel(float* losses, const double* stats, const float* rmax, int64_t N) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x)
    losses[n] = float(log(stats[2 * n]) + double(rmax[n]) - stats[2 * n + 1]);
}

__global__ void vp_backward_kernel(float* x_all, const double* stats, const int32_t* targets,
                                   const float* loss_mask, float grad_scale, int64_t vocab_begin, int64_t N,
                                   int64_t valid, int64_t Vl) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float scale = grad_scale * (loss_mask ? loss_mask[n] : 1.0f);
    const float k = float(double(scale) / stats[2 * n]);
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    scale_row(x_all + n * Vl, k, scale, t >= 0 && t < valid ? t : -1, valid, Vl);
  }
}

__global__ void vp_max_bf16_kernel(float* row_max_out, const uint16_t* logits, int64_t N, int64_t valid, int64_t Vl) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = row_max(logits + n * Vl, valid);
    if (threadIdx.x == 0) row_max_out[n] = m;
  }
}

__global__ void vp_partials_bf16_kernel(double* stats, const uint16_t* logits, const float* rmax,
                                        const int32_t* targets, int64_t vocab_begin, int64_t N, int64_t valid,
                                        int64_t Vl) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const uint16_t* x = logits + n * Vl;
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    if (threadIdx.x == 0) stats[2 * n + 1] = t >= 0 && t < valid ? double(math::bf16_to_fp32(x[t])) : 0.0;
    const double sum = row_sum_exp<false>(x, rmax[n], valid);
    if (threadIdx.x == 0) stats[2 * n] = sum;
  }
}

// One row's backward, by the block: row x (max m, sum of exponentials sum, target column t;
// outside [0, valid): none) becomes the fp32 backward's value for each column (the
// exponential as row_sum_exp makes it, times k with __fmul_rn, the target's -scale),
// rounded to bf16 in place.
__device__ void backward_row_bf16(uint16_t* x, float m, double sum, int64_t t, float scale, int64_t valid,
                                  int64_t Vl) {
  const float k = float(double(scale) / sum);
  for (int64_t v = threadIdx.x; v < Vl; v += blockDim.x) {
    float g = 0.0f;
    if (v < valid) {
      g = __fmul_rn(math::exp(math::bf16_to_fp32(x[v]) - m), k);
      if (v == t) g -= scale;
    }
    x[v] = math::fp32_to_bf16(g);
  }
}

__global__ void vp_backward_bf16_kernel(uint16_t* x_all, const float* rmax, const double* stats,
                                        const int32_t* targets, const float* loss_mask, float grad_scale,
                                        int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x)
    backward_row_bf16(x_all + n * Vl, rmax[n], stats[2 * n], int64_t(targets[n]) - vocab_begin,
                      grad_scale * (loss_mask ? loss_mask[n] : 1.0f), valid, Vl);
}

void check_shape(const char* what, int64_t V, int64_t Vp) {
  LATTICE_CHECK(V > 0 && V <= Vp) << what << ": V " << V << " not in [1, Vp = " << Vp << "]";
}

// vp_max_bf16_kernel, vp_partials_bf16_kernel, vp_loss_kernel and (backward)
// vp_backward_bf16_kernel for one row after the other, in one block: the same code on the same
// values, so the same bits; the row is read from memory once (the later passes over it hit
// the cache).
__global__ void vp_fused_bf16_kernel(float* losses, uint16_t* x_all, float* rmax_out, double* stats,
                                     const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                                     int64_t N, int64_t valid, int64_t Vl) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    uint16_t* x = x_all + n * Vl;
    const float m = row_max(x, valid);
    const int64_t t = int64_t(targets[n]);
    const double target_logit = t >= 0 && t < valid ? double(math::bf16_to_fp32(x[t])) : 0.0;
    // (row_sum_exp's block sum is a barrier: every read of x[t] comes before the writes below)
    const double sum = row_sum_exp<false>(x, m, valid);
    if (threadIdx.x == 0) {
      rmax_out[n] = m;
      stats[2 * n] = sum;
      stats[2 * n + 1] = target_logit;
      losses[n] = float(log(sum) + double(m) - target_logit);
    }
    if (!backward) continue;
    backward_row_bf16(x, m, sum, t, grad_scale * (loss_mask ? loss_mask[n] : 1.0f), valid, Vl);
  }
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp) {
  check_shape("cross_entropy_forward", V, Vp);
  if (N <= 0) return;
  // The forward-only kernel never writes the logits.
  launch(cross_entropy_kernel<false>, grid_rows(N), kThreads, 0, const_cast<float*>(logits), losses,
                                                                       targets, nullptr, 0.0f, N, V, Vp);
  LATTICE_CUDA_LAUNCHED("cross_entropy_forward");
}

void cross_entropy_forward_backward(float* logits_to_dlogits, float* losses,
                                    const int32_t* targets, const float* loss_mask,
                                    float grad_scale, int64_t N, int64_t V, int64_t Vp) {
  check_shape("cross_entropy_forward_backward", V, Vp);
  if (N <= 0) return;
  launch(cross_entropy_kernel<true>, grid_rows(N), kThreads, 0, logits_to_dlogits, losses, targets,
                                                                      loss_mask, grad_scale, N, V, Vp);
  LATTICE_CUDA_LAUNCHED("cross_entropy_forward_backward");
}

void vocab_parallel_ce_max(float* row_max_out, const float* logits, int64_t N, int64_t valid, int64_t Vl,
                           Rounding round_logits) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_max: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_max_kernel, grid_rows(N), kThreads, 0, row_max_out, logits, N, valid, Vl, round_logits);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_max");
}

void vocab_parallel_ce_partials(double* stats, float* logits, const float* row_max,
                                const int32_t* targets, int64_t vocab_begin, int64_t N,
                                int64_t valid, int64_t Vl, bool store_exp, Rounding round_logits) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_partials: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  if (store_exp)
    launch(vp_partials_kernel<true>, grid_rows(N), kThreads, 0, stats, logits, row_max, targets, vocab_begin, N,
           valid, Vl, round_logits);
  else
    launch(vp_partials_kernel<false>, grid_rows(N), kThreads, 0, stats, logits, row_max, targets, vocab_begin, N,
           valid, Vl, round_logits);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_partials");
}

void vocab_parallel_ce_loss(float* losses, const double* stats, const float* row_max, int64_t N) {
  if (N <= 0) return;
  launch(vp_loss_kernel, grid_for(N, 256), 256, 0, losses, stats, row_max, N);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_loss");
}

void vocab_parallel_ce_backward(float* exp_to_dlogits, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_backward: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_backward_kernel, grid_rows(N), kThreads, 0, exp_to_dlogits, stats, targets, loss_mask,
                                                              grad_scale, vocab_begin, N, valid, Vl);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_backward");
}

void vocab_parallel_ce_max_bf16(float* row_max_out, const uint16_t* logits, int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_max_bf16: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_max_bf16_kernel, grid_rows(N), kThreads, 0, row_max_out, logits, N, valid, Vl);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_max_bf16");
}

void vocab_parallel_ce_partials_bf16(double* stats, const uint16_t* logits, const float* row_max,
                                     const int32_t* targets, int64_t vocab_begin, int64_t N, int64_t valid,
                                     int64_t Vl) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_partials_bf16: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_partials_bf16_kernel, grid_rows(N), kThreads, 0, stats, logits, row_max, targets, vocab_begin, N, valid,
         Vl);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_partials_bf16");
}

void vocab_parallel_ce_backward_bf16(uint16_t* logits_to_dlogits, const float* row_max, const double* stats,
                                     const int32_t* targets, const float* loss_mask, float grad_scale,
                                     int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_backward_bf16: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_backward_bf16_kernel, grid_rows(N), kThreads, 0, logits_to_dlogits, row_max, stats, targets, loss_mask,
         grad_scale, vocab_begin, N, valid, Vl);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_backward_bf16");
}

void vocab_parallel_ce_fused_bf16(float* losses, uint16_t* logits_to_dlogits, float* row_max, double* stats,
                                  const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                                  int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_fused_bf16: valid " << valid << " not in [0, " << Vl << "]";
  if (N <= 0) return;
  launch(vp_fused_bf16_kernel, grid_rows(N), kThreads, 0, losses, logits_to_dlogits, row_max, stats, targets, backward,
         loss_mask, grad_scale, N, valid, Vl);
  LATTICE_CUDA_LAUNCHED("vocab_parallel_ce_fused_bf16");
}

// The four kernels (the bf16 logits, GPUs' path, have their fused kernel).
void vocab_parallel_ce_fused(float* losses, float* logits_to_dlogits, float* row_max, double* stats,
                             const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                             int64_t N, int64_t valid, int64_t Vl, Rounding round_logits) {
  vocab_parallel_ce_max(row_max, logits_to_dlogits, N, valid, Vl, round_logits);
  vocab_parallel_ce_partials(stats, logits_to_dlogits, row_max, targets, 0, N, valid, Vl, backward, round_logits);
  vocab_parallel_ce_loss(losses, stats, row_max, N);
  if (backward)
    vocab_parallel_ce_backward(logits_to_dlogits, stats, targets, loss_mask, grad_scale, 0, N, valid, Vl);
}

}  // namespace lattice::cuda
