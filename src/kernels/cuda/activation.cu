// The MLP's activation (GELU, squared ReLU) on the GPU, element by element with the CPU's scalar
// math (kernels/activation_math.h).
#include "kernels/activation_math.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

template <GeluKind kKind>
__global__ void gelu_forward_kernel(float* out, const float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = math::activation<kKind>(x[i]);
}

// dx = gelu'(x + bias) * round(dout): x the fp32 pre-activation (bias null), or a bf16
// GEMM result with its bias [C] (bias_gelu_backward_packed); dx may alias dout, dx16 (dx in
// bf16, or null) may alias x.
// Element i of that gradient (column c = i % C).
template <GeluKind kKind, class Tx, class Td>
__device__ __forceinline__ float gelu_backward_at(const Tx* x, const float* bias, int64_t c, const Td* dout,
                                                  int64_t i, Rounding r) {
  float v = math::load_as(x, i);
  if (bias) v = __fadd_rn(v, bias[c]);
  const float d = math::round_as(math::load_as(dout, i), r);
  return math::activation_backward<kKind>(v, d);
}

template <GeluKind kKind, class Tx, class Td>
__global__ void gelu_backward_kernel(float* dx, uint16_t* dx16, const Tx* x, const float* bias, int64_t C,
                                     const Td* dout, int64_t n, Rounding r) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gelu_backward_at<kKind>(x, bias, i % C, dout, i, r);
    dx[i] = g;
    if (dx16) dx16[i] = math::fp32_to_bf16(g);
  }
}

// The column sums' element (n, c) of bias_gelu_backward_packed_dbias: the gradient, whose
// bf16 cast it stores (each element is visited once).
template <GeluKind kKind>
struct GeluBackwardColumn {
  uint16_t* dx16;
  const uint16_t* y;
  const float* bias;
  const uint16_t* dout;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float v[1]) const {
    const int64_t i = n * C + c;
    v[0] = gelu_backward_at<kKind>(y, bias, c, dout, i, Rounding::none);
    dx16[i] = math::fp32_to_bf16(v[0]);
  }
};

// pre = round(y) + bias (pre may alias y; null: not stored), out = gelu(pre) in fp32 or
// bf16; y (fp32, or a bf16 GEMM result with r none), pre, out: [N, C]
template <GeluKind kKind, class Tin, class Tout>
__global__ void bias_gelu_kernel(float* pre, Tout* out, const Tin* y, const float* bias, int64_t C, int64_t n,
                                 Rounding r) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = math::round_as(math::load_as(y, i), r);
    if (bias) v = __fadd_rn(v, bias[i % C]);
    if (pre) pre[i] = v;
    math::store_as(out, i, math::activation<kKind>(v));
  }
}

}  // namespace

void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind) {
  if (n <= 0) return;
  math::dispatch_activation(kind, [&](auto k) {
    launch(gelu_forward_kernel<k.value>, grid_for(n, kThreads), kThreads, 0, out, x, n);
  });
  LATTICE_CUDA_LAUNCHED("gelu_forward");
}

namespace {
template <class Tx, class Td>
void launch_gelu_backward(float* dx, uint16_t* dx16, const Tx* x, const float* bias, int64_t C, const Td* dout,
                          int64_t n, GeluKind kind, Rounding round_dout) {
  if (n <= 0) return;
  math::dispatch_activation(kind, [&](auto k) {
    launch(gelu_backward_kernel<k.value, Tx, Td>, grid_for(n, kThreads), kThreads, 0, dx, dx16, x, bias, C, dout, n,
           round_dout);
  });
}
}  // namespace

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind, Rounding round_dout) {
  launch_gelu_backward(dx, static_cast<uint16_t*>(nullptr), x, nullptr, 1, dout, n, kind, round_dout);
  LATTICE_CUDA_LAUNCHED("gelu_backward");
}

void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const float* dout, int64_t N,
                               int64_t C, GeluKind kind, Rounding round_dout, uint16_t* dx_bf16) {
  launch_gelu_backward(dx, dx_bf16, y, bias, C, dout, N * C, kind, round_dout);
  LATTICE_CUDA_LAUNCHED("bias_gelu_backward_packed");
}

void bias_gelu_backward_packed(float* dx, const uint16_t* y, const float* bias, const uint16_t* dout, int64_t N,
                               int64_t C, GeluKind kind, uint16_t* dx_bf16) {
  launch_gelu_backward(dx, dx_bf16, y, bias, C, dout, N * C, kind, Rounding::none);
  LATTICE_CUDA_LAUNCHED("bias_gelu_backward_packed");
}

// The bias_backward column sums (the same blocking, so the same bits) of the gradient
// computed in place of reading it.
void bias_gelu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                     const uint16_t* dout, int64_t N, int64_t C, GeluKind kind) {
  const char* what = "bias_gelu_backward_packed_dbias";
  math::dispatch_activation(kind, [&](auto k) {
    column_sums_accumulate<1>(ColumnOutputs{{dbias, nullptr}}, GeluBackwardColumn<k.value>{dx_bf16, y, bias, dout, C},
                              N, C, what);
  });
}

namespace {
template <class Tin, class Tout>
void launch_bias_gelu(float* pre, Tout* out, const Tin* y, const float* bias, int64_t N, int64_t C, GeluKind kind,
                      Rounding round_y) {
  const int64_t n = N * C;
  if (n <= 0) return;
  math::dispatch_activation(kind, [&](auto k) {
    launch(bias_gelu_kernel<k.value, Tin, Tout>, grid_for(n, kThreads), kThreads, 0, pre, out, y, bias, C, n, round_y);
  });
}
}  // namespace

void bias_gelu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t C,
                       GeluKind kind, Rounding round_y) {
  launch_bias_gelu(pre, out, y, bias, N, C, kind, round_y);
  LATTICE_CUDA_LAUNCHED("bias_gelu_forward");
}

void bias_gelu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t C,
                              GeluKind kind) {
  launch_bias_gelu(static_cast<float*>(nullptr), out, y, bias, N, C, kind, Rounding::none);
  LATTICE_CUDA_LAUNCHED("bias_gelu_forward_packed");
}

}  // namespace lattice::cuda
