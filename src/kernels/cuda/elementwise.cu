// Residual adds, bias, scaling on the GPU: grid-stride element loops; bias_backward
// through the deterministic column sums.
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

#define LATTICE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* y, const float* x, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) y[i] += x[i];
}

// out: [N, C]; out = round(out) + bias
__global__ void bias_add_kernel(float* out, const float* bias, int64_t N, int64_t C, Rounding r) {
  LATTICE_GRID_STRIDE(i, N * C) out[i] = math::round_as(out[i], r) + bias[i % C];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) x[i] *= s;
}

// One thread per destination element (n, h, j); with dst_head 0 (H summed) h is 0 and the thread
// sums the row's H source blocks in order, as the CPU does.
__global__ void copy_head_blocks_kernel(float* dst, int64_t dst_row, int64_t dst_head, const float* src,
                                        int64_t src_row, int64_t src_head, int64_t N, int64_t H, int64_t len,
                                        float scale) {
  const bool sum = dst_head == 0;
  const int64_t heads = sum ? 1 : H;
  LATTICE_GRID_STRIDE(i, N * heads * len) {
    const int64_t j = i % len, h = i / len % heads, n = i / len / heads;
    float* o = dst + n * dst_row + h * dst_head + j;
    if (!sum) {
      *o = src ? scale * src[n * src_row + h * src_head + j] : 0.0f;
      continue;
    }
    float s = 0.0f;
    for (int64_t k = 0; k < H && src; ++k) s += src[n * src_row + k * src_head + j];
    *o = s * scale;
  }
}

#undef LATTICE_GRID_STRIDE

struct DoutAt {
  const float* dout;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float v[1]) const { v[0] = dout[n * C + c]; }
};

// The same element, whose bf16 cast it also stores (each element is visited once).
struct DoutAtCast {
  const float* dout;
  uint16_t* dout16;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float v[1]) const {
    v[0] = dout[n * C + c];
    dout16[n * C + c] = math::fp32_to_bf16(v[0]);
  }
};

}  // namespace

void add_forward(float* out, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  launch(add_kernel, grid_for(n, kThreads), kThreads, 0, out, a, b, n);
  LATTICE_CUDA_LAUNCHED("add_forward");
}

void copy_head_blocks(float* dst, int64_t dst_row, int64_t dst_head, const float* src, int64_t src_row,
                      int64_t src_head, int64_t N, int64_t H, int64_t len, float scale) {
  const int64_t n = N * (dst_head == 0 ? 1 : H) * len;
  if (n <= 0) return;
  launch(copy_head_blocks_kernel, grid_for(n, kThreads), kThreads, 0, dst, dst_row, dst_head, src, src_row, src_head,
         N, H, len, scale);
  LATTICE_CUDA_LAUNCHED("copy_head_blocks");
}

void accumulate(float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  launch(accumulate_kernel, grid_for(n, kThreads), kThreads, 0, y, x, n);
  LATTICE_CUDA_LAUNCHED("accumulate");
}

void bias_add(float* out, const float* bias, int64_t N, int64_t C, Rounding round_out) {
  if (N <= 0 || C <= 0) return;
  launch(bias_add_kernel, grid_for(N * C, kThreads), kThreads, 0, out, bias, N, C, round_out);
  LATTICE_CUDA_LAUNCHED("bias_add");
}

void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  column_sums_accumulate<1>(ColumnOutputs{{dbias, nullptr}}, DoutAt{dout, C}, N, C, "bias_backward");
}

void bias_backward_cast_bf16(float* dbias, uint16_t* dout_bf16, const float* dout, int64_t N, int64_t C) {
  column_sums_accumulate<1>(ColumnOutputs{{dbias, nullptr}}, DoutAtCast{dout, dout_bf16, C}, N, C,
                            "bias_backward_cast_bf16");
}

void scale_inplace(float* x, float s, int64_t n) {
  if (n <= 0) return;
  launch(scale_kernel, grid_for(n, kThreads), kThreads, 0, x, s, n);
  LATTICE_CUDA_LAUNCHED("scale_inplace");
}

}  // namespace lattice::cuda
