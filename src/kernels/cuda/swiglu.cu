// SwiGLU on the GPU, element by element with the CPU's scalar math (kernels/activation_math.h):
// one thread per (row, column of a half) reads the gate and the up projection together.
#include "kernels/activation_math.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// g and u of element i = n F + j of the output (row n, column j of a half): y[n, j] and
// y[n, F + j] (fp32 rounded by r, or a bf16 GEMM result with r none) plus their biases.
template <class Tin>
__device__ __forceinline__ void gate_up_at(const Tin* y, const float* bias, int64_t n, int64_t j, int64_t F,
                                           Rounding r, float& g, float& u) {
  const int64_t row = n * 2 * F;
  g = math::round_as(math::load_as(y, row + j), r);
  u = math::round_as(math::load_as(y, row + F + j), r);
  if (bias) {
    g = __fadd_rn(g, bias[j]);
    u = __fadd_rn(u, bias[F + j]);
  }
}

// pre = round(y) + bias [N, 2F] (null: not stored; may alias y), out = glu(g, u) [N, F] in
// fp32 or bf16.
template <class Tin, class Tout>
__global__ void bias_swiglu_kernel(float* pre, Tout* out, const Tin* y, const float* bias, int64_t N, int64_t F,
                                   Rounding r, GluForm f) {
  const int64_t total = N * F;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, j = i % F;
    float g, u;
    gate_up_at(y, bias, n, j, F, r, g, u);
    if (pre) {
      pre[n * 2 * F + j] = g;
      pre[n * 2 * F + F + j] = u;
    }
    math::store_as(out, i, math::glu(g, u, f));
  }
}

// dx [N, 2F] (may alias pre) from pre [N, 2F] and round(dout) [N, F].
__global__ void swiglu_backward_kernel(float* dx, const float* pre, const float* dout, int64_t N, int64_t F,
                                       Rounding r, GluForm f) {
  const int64_t total = N * F;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, j = i % F, at = n * 2 * F + j;
    float dg, du;
    math::glu_backward(pre[at], pre[at + F], math::round_as(dout[i], r), f, dg, du);
    dx[at] = dg;
    dx[at + F] = du;
  }
}

// The column sums' element (n, j) of bias_swiglu_backward_packed_dbias: the gate's and the up
// projection's gradients (outputs 0 and 1, columns j and F + j of dbias), whose bf16 casts it
// stores after reading both inputs (each element is visited once; dx16 may alias y).
struct SwigluBackwardColumns {
  uint16_t* dx16;
  const uint16_t* y;
  const float* bias;
  const uint16_t* dout;
  int64_t F;
  GluForm f;
  __device__ void operator()(int64_t n, int64_t j, float v[2]) const {
    float g, u;
    gate_up_at(y, bias, n, j, F, Rounding::none, g, u);
    math::glu_backward(g, u, math::bf16_to_fp32(dout[n * F + j]), f, v[0], v[1]);
    dx16[n * 2 * F + j] = math::fp32_to_bf16(v[0]);
    dx16[n * 2 * F + F + j] = math::fp32_to_bf16(v[1]);
  }
};

template <class Tin, class Tout>
void launch_bias_swiglu(float* pre, Tout* out, const Tin* y, const float* bias, int64_t N, int64_t F, Rounding r,
                        const GluForm& f) {
  const int64_t n = N * F;
  if (n <= 0) return;
  launch(bias_swiglu_kernel<Tin, Tout>, grid_for(n, kThreads), kThreads, 0, pre, out, y, bias, N, F, r, f);
}

}  // namespace

void bias_swiglu_forward(float* pre, float* out, const float* y, const float* bias, int64_t N, int64_t F,
                         Rounding round_y, const GluForm& glu) {
  launch_bias_swiglu(pre, out, y, bias, N, F, round_y, glu);
  LATTICE_CUDA_LAUNCHED("bias_swiglu_forward");
}

void bias_swiglu_forward_packed(uint16_t* out, const uint16_t* y, const float* bias, int64_t N, int64_t F,
                                const GluForm& glu) {
  launch_bias_swiglu(static_cast<float*>(nullptr), out, y, bias, N, F, Rounding::none, glu);
  LATTICE_CUDA_LAUNCHED("bias_swiglu_forward_packed");
}

void swiglu_backward(float* dx, const float* pre, const float* dout, int64_t N, int64_t F, Rounding round_dout,
                     const GluForm& glu) {
  const int64_t n = N * F;
  if (n <= 0) return;
  launch(swiglu_backward_kernel, grid_for(n, kThreads), kThreads, 0, dx, pre, dout, N, F, round_dout, glu);
  LATTICE_CUDA_LAUNCHED("swiglu_backward");
}

// bias_backward's column sums per column (the same blocking, so the same bits), both halves
// in one pass.
void bias_swiglu_backward_packed_dbias(uint16_t* dx_bf16, float* dbias, const uint16_t* y, const float* bias,
                                       const uint16_t* dout, int64_t N, int64_t F, const GluForm& glu) {
  column_sums_accumulate<2>(ColumnOutputs{{dbias, dbias + F, nullptr}},
                            SwigluBackwardColumns{dx_bf16, y, bias, dout, F, glu},
                            N, F, "bias_swiglu_backward_packed_dbias");
}

}  // namespace lattice::cuda
