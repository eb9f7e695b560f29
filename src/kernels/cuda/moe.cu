// Mixture-of-experts gathers and combines on the GPU (kernels/moe.h): element loops with a grid
// stride, and one block per slot for the probability gradients' dot products (the fixed
// shuffle tree of block_sum).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void gather_rows_kernel(float* xe, const float* x, const int32_t* rows, const float* w, int64_t S,
                                   int64_t C) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < S * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / C, c = i - s * C;
    const float v = x[int64_t(rows[s]) * C + c];
    xe[i] = w ? __fmul_rn(w[s], v) : v;
  }
}

__global__ void combine_kernel(float* out, const float* ye, const int32_t* slot_of, const float* w, int64_t N,
                               int64_t k, int64_t C, bool accumulate) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float o = accumulate ? out[i] : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = slot_of[t * k + j];
      if (s >= 0) o += (w ? w[s] : 1.0f) * ye[s * C + c];  // -1: dropped
    }
    out[i] = o;
  }
}

__global__ void combine_backward_kernel(float* d_ye, float* d_w, const float* dout, const float* ye, const float* w,
                                        const int32_t* rows, int64_t S, int64_t C) {
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    const float* d = dout + int64_t(rows[s]) * C;
    const float* y = ye + s * C;
    const float ws = d_ye ? w[s] : 0.0f;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      if (d_ye) d_ye[s * C + c] = ws * d[c];
      dot += d[c] * y[c];
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) d_w[s] = dot;
  }
}

}  // namespace

void moe_gather_rows(float* xe, const float* x, const int32_t* rows, int64_t S, int64_t C, const float* w) {
  if (S <= 0 || C <= 0) return;
  launch(gather_rows_kernel, grid_for(S * C, kThreads), kThreads, 0, xe, x, rows, w, S, C);
  LATTICE_CUDA_LAUNCHED("moe_gather_rows");
}

void moe_combine(float* out, const float* ye, const int32_t* slot_of, const float* w, int64_t N, int64_t k, int64_t C,
                 bool accumulate) {
  if (N <= 0 || C <= 0) return;
  launch(combine_kernel, grid_for(N * C, kThreads), kThreads, 0, out, ye, slot_of, w, N, k, C, accumulate);
  LATTICE_CUDA_LAUNCHED("moe_combine");
}

void moe_combine_backward(float* d_ye, float* d_w, const float* dout, const float* ye, const float* w,
                          const int32_t* rows, int64_t S, int64_t C) {
  if (S <= 0 || C <= 0) return;
  launch(combine_backward_kernel, grid_rows(S), kThreads, 0, d_ye, d_w, dout, ye, w, rows, S, C);
  LATTICE_CUDA_LAUNCHED("moe_combine_backward");
}

}  // namespace lattice::cuda
