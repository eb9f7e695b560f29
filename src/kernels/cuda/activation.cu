// GELU on the GPU, element by element with the CPU's scalar math (kernels/activation_math.h).
#include "kernels/activation_math.h"
#include "kernels/cast_math.h"
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
__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dout, int64_t n, Rounding r) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = math::round_as(dout[i], r);
    dx[i] = kKind == GeluKind::erf ? math::gelu_erf_backward(x[i], d) : math::gelu_tanh_backward(x[i], d);
  }
}

// pre = round(y) + bias (pre may alias y), out = gelu(pre) in fp32 or bf16; y, pre, out: [N, C]
template <GeluKind kKind, class T>
__global__ void bias_gelu_kernel(float* pre, T* out, const float* y, const float* bias, int64_t C, int64_t n,
                                 Rounding r) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = math::round_as(y[i], r);
    if (bias) v = __fadd_rn(v, bias[i % C]);
    pre[i] = v;
    math::store_as(out, i, kKind == GeluKind::erf ? math::gelu_erf(v) : math::gelu_tanh(v));
  }
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

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind, Rounding round_dout) {
  if (n <= 0) return;
  if (kind == GeluKind::erf)
    launch(gelu_backward_kernel<GeluKind::erf>, grid_for(n, kThreads), kThreads, 0, dx, x, dout, n, round_dout);
  else
    launch(gelu_backward_kernel<GeluKind::tanh>, grid_for(n, kThreads), kThreads, 0, dx, x, dout, n, round_dout);
  LATTICE_CUDA_LAUNCHED("gelu_backward");
}

namespace {
template <class T>
void launch_bias_gelu(float* pre, T* out, const float* y, const float* bias, int64_t N, int64_t C, GeluKind kind,
                      Rounding round_y) {
  const int64_t n = N * C;
  if (n <= 0) return;
  if (kind == GeluKind::erf)
    launch(bias_gelu_kernel<GeluKind::erf, T>, grid_for(n, kThreads), kThreads, 0, pre, out, y, bias, C, n, round_y);
  else
    launch(bias_gelu_kernel<GeluKind::tanh, T>, grid_for(n, kThreads), kThreads, 0, pre, out, y, bias, C, n, round_y);
}
}  // namespace

void bias_gelu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t C,
                       GeluKind kind, Rounding round_y) {
  launch_bias_gelu(pre, out, y, bias, N, C, kind, round_y);
  LATTICE_CUDA_LAUNCHED("bias_gelu_forward");
}

void bias_gelu_forward_bf16(float* pre, uint16_t* out, const float* y, const float* bias, int64_t N, int64_t C,
                            GeluKind kind, Rounding round_y) {
  launch_bias_gelu(pre, out, y, bias, N, C, kind, round_y);
  LATTICE_CUDA_LAUNCHED("bias_gelu_forward_bf16");
}

}  // namespace lattice::cuda
