// GELU on the GPU, element by element with the CPU's scalar math (kernels/activation_math.h).
#include "kernels/activation_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

template <GeluKind kKind>
__global__ void gelu_forward_kernel(float* out, const float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = kKind == GeluKind::erf ? math::gelu_erf(x[i]) : math::gelu_tanh(x[i]);
}

template <GeluKind kKind>
__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dout, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = kKind == GeluKind::erf ? math::gelu_erf_backward(x[i], dout[i])
                                   : math::gelu_tanh_backward(x[i], dout[i]);
}

}  // namespace

void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind) {
  if (n <= 0) return;
  if (kind == GeluKind::erf)
    launch(gelu_forward_kernel<GeluKind::erf>, grid_for(n, kThreads), kThreads, 0, out, x, n);
  else
    launch(gelu_forward_kernel<GeluKind::tanh>, grid_for(n, kThreads), kThreads, 0, out, x, n);
  LATTICE_CUDA_LAUNCHED("gelu_forward");
}

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind) {
  if (n <= 0) return;
  if (kind == GeluKind::erf)
    launch(gelu_backward_kernel<GeluKind::erf>, grid_for(n, kThreads), kThreads, 0, dx, x, dout, n);
  else
    launch(gelu_backward_kernel<GeluKind::tanh>, grid_for(n, kThreads), kThreads, 0, dx, x, dout, n);
  LATTICE_CUDA_LAUNCHED("gelu_backward");
}

}  // namespace lattice::cuda
