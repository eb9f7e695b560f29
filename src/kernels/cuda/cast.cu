// Format conversions on the GPU with the CPU's bit-level functions (kernels/cast_math.h):
// the same bits on both. abs_max reduces the bit patterns of |x| with an integer max
// (order-free, so exact and deterministic; NaN patterns sort above infinity).
#include <limits>

#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_reduce.cuh"

namespace lattice::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

#define LATTICE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void to_bf16_kernel(uint16_t* out, const float* in, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) out[i] = math::fp32_to_bf16(in[i]);
}
__global__ void from_bf16_kernel(float* out, const uint16_t* in, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) out[i] = math::bf16_to_fp32(in[i]);
}
__global__ void round_bf16_kernel(float* out, const float* in, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) out[i] = math::round_bf16(in[i]);
}
__global__ void round_fp16_kernel(float* out, const float* in, int64_t n) {
  LATTICE_GRID_STRIDE(i, n) out[i] = math::fp16_to_fp32(math::fp32_to_fp16(in[i]));
}
__global__ void quantize_fp8_to_bf16_kernel(uint16_t* out, const float* in, int64_t n, float scale, Fp8Format f) {
  LATTICE_GRID_STRIDE(i, n) out[i] = math::fp32_to_bf16(math::fp8_quantize(in[i], scale, f));
}
// *result = max over i of the bits of |in[i]| (unsigned compare = magnitude order).
__global__ void abs_max_bits_kernel(unsigned* result, const float* in, int64_t n) {
  unsigned m = 0;
  LATTICE_GRID_STRIDE(i, n) {
    const unsigned a = math::bits_from_float(in[i]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  m = block_reduce(m, MaxOp{}, 0u);
  if (threadIdx.x == 0) atomicMax(result, m);  // integer max: the order does not matter
}

// One thread block per fp8 block (grid-stride over them): the bits of |x| MAX-reduced over
// the block (NaN patterns sort above inf, as on the CPU), its scale, then its values.
__global__ void quantize_fp8_blocks_kernel(uint16_t* out, const float* in, int64_t rows, int64_t cols,
                                           Fp8Blocks blocks, Fp8Format f) {
  const int64_t col_blocks = (cols + blocks.cols - 1) / blocks.cols;
  const int64_t count = (rows + blocks.rows - 1) / blocks.rows * col_blocks;
  const int64_t elems = blocks.rows * blocks.cols;
  for (int64_t b = blockIdx.x; b < count; b += gridDim.x) {
    const int64_t r0 = b / col_blocks * blocks.rows, c0 = b % col_blocks * blocks.cols;
    unsigned m = 0;
    for (int64_t i = threadIdx.x; i < elems; i += blockDim.x) {
      const int64_t r = r0 + i / blocks.cols, c = c0 + i % blocks.cols;
      if (r < rows && c < cols) {
        const unsigned a = math::bits_from_float(in[r * cols + c]) & 0x7fffffffu;
        m = a > m ? a : m;
      }
    }
    m = block_reduce(m, MaxOp{}, 0u);
    const float amax = math::float_from_bits(m);  // (a NaN pattern stays NaN)
    const float scale = math::fp8_block_scale(amax, math::fp8_spec(f).max, blocks.scale);
    for (int64_t i = threadIdx.x; i < elems; i += blockDim.x) {
      const int64_t r = r0 + i / blocks.cols, c = c0 + i % blocks.cols;
      if (r < rows && c < cols) out[r * cols + c] = math::fp32_to_bf16(math::fp8_block_value(in[r * cols + c], scale, f));
    }
  }
}

#undef LATTICE_GRID_STRIDE

unsigned blocks_for(int64_t n) {
  const unsigned b = grid_for(n, kThreads);
  return b < kMaxBlocks ? b : kMaxBlocks;
}

}  // namespace

void cast_fp32_to_bf16(uint16_t* out, const float* in, int64_t n) {
  if (n <= 0) return;
  launch(to_bf16_kernel, grid_for(n, kThreads), kThreads, 0, out, in, n);
  LATTICE_CUDA_LAUNCHED("cast_fp32_to_bf16");
}

void cast_bf16_to_fp32(float* out, const uint16_t* in, int64_t n) {
  if (n <= 0) return;
  launch(from_bf16_kernel, grid_for(n, kThreads), kThreads, 0, out, in, n);
  LATTICE_CUDA_LAUNCHED("cast_bf16_to_fp32");
}

void round_to_bf16(float* out, const float* in, int64_t n) {
  if (n <= 0) return;
  launch(round_bf16_kernel, grid_for(n, kThreads), kThreads, 0, out, in, n);
  LATTICE_CUDA_LAUNCHED("round_to_bf16");
}

void round_to_fp16(float* out, const float* in, int64_t n) {
  if (n <= 0) return;
  launch(round_fp16_kernel, grid_for(n, kThreads), kThreads, 0, out, in, n);
  LATTICE_CUDA_LAUNCHED("round_to_fp16");
}

void quantize_fp8_to_bf16(uint16_t* out, const float* in, int64_t n, float scale, Fp8Format f) {
  if (n <= 0) return;
  launch(quantize_fp8_to_bf16_kernel, grid_for(n, kThreads), kThreads, 0, out, in, n, scale, f);
  LATTICE_CUDA_LAUNCHED("quantize_fp8_to_bf16");
}

float abs_max(const float* in, int64_t n) {
  if (n <= 0) return 0.0f;
  unsigned* result = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&result), sizeof(unsigned), stream()));
  LATTICE_CUDA_CALL(cudaMemsetAsync(result, 0, sizeof(unsigned), stream()));
  launch(abs_max_bits_kernel, blocks_for(n), kThreads, 0, result, in, n);
  LATTICE_CUDA_LAUNCHED("abs_max");
  unsigned bits = 0;
  LATTICE_CUDA_CALL(cudaMemcpyAsync(&bits, result, sizeof(unsigned), cudaMemcpyDeviceToHost, stream()));
  LATTICE_CUDA_CALL(cudaFreeAsync(result, stream()));
  LATTICE_CUDA_CALL(cudaStreamSynchronize(stream()));
  return math::is_nan_bits(bits) ? std::numeric_limits<float>::quiet_NaN() : math::float_from_bits(bits);
}

void quantize_fp8_blocks(uint16_t* out, const float* in, int64_t rows, int64_t cols, Fp8Blocks blocks, Fp8Format f) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t count = (rows + blocks.rows - 1) / blocks.rows * ((cols + blocks.cols - 1) / blocks.cols);
  const int64_t elems = blocks.rows * blocks.cols;
  const int threads = elems >= kThreads ? kThreads : int((elems + 31) / 32 * 32);  // whole warps
  launch(quantize_fp8_blocks_kernel, unsigned(count < 65535 * 16 ? count : 65535 * 16), threads, 0, out, in, rows,
         cols, blocks, f);
  LATTICE_CUDA_LAUNCHED("quantize_fp8_blocks");
}

}  // namespace lattice::cuda
