// Muon's element-wise kernels on the GPU (kernels/muon.h): one thread per element, the CPU's math
// with explicitly rounded products (no contraction into FMAs where torch rounds).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/muon.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void muon_momentum_kernel(float* m, float* u, const float* g, int64_t n, float one_minus_beta, float beta,
                                     bool nesterov, float grad_scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = grad_scale == 1.0f ? g[i] : __fmul_rn(g[i], grad_scale);
    const float mi = math::torch_lerp(m[i], gi, one_minus_beta);
    m[i] = mi;
    u[i] = nesterov ? math::torch_lerp(gi, mi, beta) : mi;
  }
}

__global__ void divide_kernel(float* x, float denom, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = x[i] / denom;  // IEEE division (nvcc keeps -prec-div)
}

__global__ void muon_apply_kernel(float* p, const float* o, int64_t n, float decay, float scale, float extra,
                                  float step) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float decayed = __fadd_rn(p[i], __fmul_rn(p[i], decay));
    const float direction = __fmul_rn(__fmul_rn(o[i], scale), extra);
    p[i] = __fadd_rn(decayed, __fmul_rn(direction, step));
  }
}

}  // namespace

void muon_momentum(float* m, float* u, const float* g, int64_t n, float one_minus_beta, float beta, bool nesterov,
                   float grad_scale) {
  if (n <= 0) return;
  launch(muon_momentum_kernel, grid_for(n, kThreads), kThreads, 0, m, u, g, n, one_minus_beta, beta, nesterov,
         grad_scale);
  LATTICE_CUDA_LAUNCHED("muon_momentum");
}

void divide_inplace(float* x, float denom, int64_t n) {
  if (n <= 0) return;
  launch(divide_kernel, grid_for(n, kThreads), kThreads, 0, x, denom, n);
  LATTICE_CUDA_LAUNCHED("divide_inplace");
}

void muon_apply(float* p, const float* o, int64_t n, float decay, float scale, float extra, float step) {
  if (n <= 0) return;
  launch(muon_apply_kernel, grid_for(n, kThreads), kThreads, 0, p, o, n, decay, scale, extra, step);
  LATTICE_CUDA_LAUNCHED("muon_apply");
}

}  // namespace lattice::cuda
