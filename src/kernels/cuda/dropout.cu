// Dropout on the GPU: one thread per Philox block (four consecutive global element
// indices), drawing the same stream as the CPU (core/philox.h), so the masks match bit
// for bit whatever the launch shape.
#include <cmath>

#include "core/philox.h"
#include "kernels/cast_math.h"
#include "kernels/jitter_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;

// out[i] = (u32(first + i) >> 8) >= threshold ? x[i] * scale : 0   (a select, so dropped
// infinities and NaNs become 0 as on the CPU; out may alias x).
__global__ void dropout_kernel(float* out, const float* x, int64_t n, uint32_t threshold, float scale,
                               PhiloxStream stream, uint64_t first_index, uint64_t first_block,
                               int64_t blocks) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < blocks;
       j += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t blk = first_block + uint64_t(j);
    const PhiloxCounter r = stream.block(blk);
    for (int q = 0; q < 4; ++q) {
      const uint64_t idx = (blk << 2) + uint64_t(q);
      if (idx < first_index || idx >= first_index + uint64_t(n)) continue;
      const int64_t i = int64_t(idx - first_index);
      out[i] = (r[q] >> 8) >= threshold ? x[i] * scale : 0.0f;
    }
  }
}

void apply_mask(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                uint64_t first_index, const char* what) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << what << ": dropout probability " << p << " not in [0, 1)";
  if (n <= 0) return;
  if (p == 0.0f) {
    if (out != x)
      LATTICE_CUDA_CALL(cudaMemcpyAsync(out, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, cuda::stream()));
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  // keep = uniform(i) >= p  <=>  (u32 >> 8) >= ceil(p * 2^24), as the CPU mask computes it.
  const uint32_t threshold = dropout_threshold(p);
  const uint64_t first_block = first_index >> 2;
  const uint64_t last_block = (first_index + uint64_t(n) - 1) >> 2;
  const int64_t blocks = int64_t(last_block - first_block + 1);
  launch(dropout_kernel, grid_for(blocks, kThreads), kThreads, 0,
      out, x, n, threshold, scale, stream, first_index, first_block, blocks);
  LATTICE_CUDA_LAUNCHED(what);
}

// out[i] = residual[i] + dropout(round(y[i]) + bias[i % C]), one thread per Philox block as above;
// y fp32, or bf16 (already rounded: round_y none). Explicitly rounded operations (no contraction
// into an FMA), so the bits are those of bias_add, dropout and add_forward run one after the other.
template <typename Y>
__global__ void bias_dropout_add_kernel(float* out, const float* residual, const Y* y, const float* bias,
                                        int64_t C, int64_t n, bool dropout, uint32_t threshold, float scale,
                                        PhiloxStream stream, uint64_t first_index, uint64_t first_block,
                                        int64_t blocks, Rounding round_y) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < blocks;
       j += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t blk = first_block + uint64_t(j);
    PhiloxCounter r{};
    if (dropout) r = stream.block(blk);
    for (int q = 0; q < 4; ++q) {
      const uint64_t idx = (blk << 2) + uint64_t(q);
      if (idx < first_index || idx >= first_index + uint64_t(n)) continue;
      const int64_t i = int64_t(idx - first_index);
      const float yi = math::round_as(math::load_as(y, i), round_y);
      float v = bias ? __fadd_rn(yi, bias[i % C]) : yi;
      if (dropout) v = (r[q] >> 8) >= threshold ? __fmul_rn(v, scale) : 0.0f;
      out[i] = __fadd_rn(residual[i], v);
    }
  }
}

}  // namespace

namespace {

template <typename Y>
void launch_bias_dropout_add(float* out, const float* residual, const Y* y, const float* bias, int64_t N, int64_t C,
                             float p, const PhiloxStream& stream, uint64_t first_index, Rounding round_y) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "bias_dropout_add: dropout probability " << p << " not in [0, 1)";
  const int64_t n = N * C;
  if (n <= 0) return;
  const float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  const uint32_t threshold = dropout_threshold(p);
  const uint64_t first_block = first_index >> 2;
  const int64_t blocks = int64_t(((first_index + uint64_t(n) - 1) >> 2) - first_block + 1);
  launch(bias_dropout_add_kernel<Y>, grid_for(blocks, kThreads), kThreads, 0,
      out, residual, y, bias, C, n, p > 0.0f, threshold, scale, stream, first_index, first_block, blocks, round_y);
  LATTICE_CUDA_LAUNCHED("bias_dropout_add_forward");
}

}  // namespace

void bias_dropout_add_forward(float* out, const float* residual, const float* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index,
                              Rounding round_y) {
  launch_bias_dropout_add(out, residual, y, bias, N, C, p, stream, first_index, round_y);
}

void bias_dropout_add_forward(float* out, const float* residual, const uint16_t* y, const float* bias, int64_t N,
                              int64_t C, float p, const PhiloxStream& stream, uint64_t first_index) {
  launch_bias_dropout_add(out, residual, y, bias, N, C, p, stream, first_index, Rounding::none);
}

namespace {

// The column sums' element (n, c): dropout_kernel's value for element n * C + c, whose bf16
// cast it stores (each element is visited once).
struct DropoutGradColumn {
  const float* dout;
  uint16_t* dx16;
  int64_t C;
  uint32_t threshold;
  float scale;
  PhiloxStream stream;
  uint64_t first_index;
  __device__ void operator()(int64_t n, int64_t c, float v[1]) const {
    const int64_t i = n * C + c;
    v[0] = (stream.u32(first_index + uint64_t(i)) >> 8) >= threshold ? dout[i] * scale : 0.0f;
    dx16[i] = math::fp32_to_bf16(v[0]);
  }
};

}  // namespace

void dropout_backward_bias_cast_bf16(float* dbias, uint16_t* dx_bf16, const float* dout, int64_t N, int64_t C,
                                     float p, const PhiloxStream& stream, uint64_t first_index) {
  LATTICE_CHECK(p >= 0.0f && p < 1.0f) << "dropout_backward: dropout probability " << p << " not in [0, 1)";
  const float scale = 1.0f / (1.0f - p);
  const uint32_t threshold = dropout_threshold(p);
  column_sums_accumulate<1>(ColumnOutputs{{dbias, nullptr}},
                            DropoutGradColumn{dout, dx_bf16, C, threshold, scale, stream, first_index}, N, C,
                            "dropout_backward_bias_cast_bf16");
}

void dropout_forward(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                     uint64_t first_index) {
  apply_mask(out, x, n, p, stream, first_index, "dropout_forward");
}

namespace {

// math::jitter_block over the blocks, one thread per Philox block (the CPU's operations: its bits).
__global__ void jitter_kernel(float* y, const float* x, int64_t n, float eps, PhiloxStream stream,
                              uint64_t first_index, uint64_t first_block, int64_t blocks, bool accumulate) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < blocks;
       j += int64_t(gridDim.x) * blockDim.x)
    math::jitter_block(y, x, n, eps, stream, first_index, first_block + uint64_t(j), accumulate);
}

void apply_jitter(float* y, const float* x, int64_t n, float eps, const PhiloxStream& stream, uint64_t first_index,
                  bool accumulate, const char* what) {
  LATTICE_CHECK(eps >= 0.0f && eps < 1.0f) << what << ": input jitter eps " << eps << " not in [0, 1)";
  if (n <= 0) return;
  const uint64_t first_block = first_index >> 2;
  const uint64_t last_block = (first_index + uint64_t(n) - 1) >> 2;
  const int64_t blocks = int64_t(last_block - first_block + 1);
  launch(jitter_kernel, grid_for(blocks, kThreads), kThreads, 0, y, x, n, eps, stream, first_index, first_block,
         blocks, accumulate);
  LATTICE_CUDA_LAUNCHED(what);
}

}  // namespace

void input_jitter_forward(float* out, const float* x, int64_t n, float eps, const PhiloxStream& stream,
                          uint64_t first_index) {
  apply_jitter(out, x, n, eps, stream, first_index, false, "input_jitter_forward");
}

void input_jitter_backward(float* dx, const float* dout, int64_t n, float eps, const PhiloxStream& stream,
                           uint64_t first_index) {
  apply_jitter(dx, dout, n, eps, stream, first_index, true, "input_jitter_backward");
}

void dropout_backward(float* dx, const float* dout, int64_t n, float p,
                      const PhiloxStream& stream, uint64_t first_index) {
  apply_mask(dx, dout, n, p, stream, first_index, "dropout_backward");
}

}  // namespace lattice::cuda
