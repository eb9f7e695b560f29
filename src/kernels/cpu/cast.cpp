// Format conversions by bit manipulation (no dependence on the FPU rounding mode except
// the fp8 subnormal step, which uses the default round-to-nearest-even addition). The
// one-value functions live in kernels/cast_math.h, shared with the CUDA kernels.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cast.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"
#include "kernels/cast_math.h"

namespace lattice {
namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per parallel_chunks call

template <class F>
void parallel_chunks(int64_t n, F f) {
  if (n <= kChunk || omp_in_parallel()) {
    f(int64_t(0), n);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

}  // namespace

float fp8_max(Fp8Format f) { return math::fp8_spec(f).max; }

uint16_t fp32_to_bf16(float x) { return math::fp32_to_bf16(x); }
float bf16_to_fp32(uint16_t b) { return math::bf16_to_fp32(b); }
uint16_t fp32_to_fp16(float x) { return math::fp32_to_fp16(x); }
float fp16_to_fp32(uint16_t h) { return math::fp16_to_fp32(h); }
float fp8_quantize(float x, float scale, Fp8Format f) { return math::fp8_quantize(x, scale, f); }

void cast_fp32_to_bf16(uint16_t* out, const float* in, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::cast_fp32_to_bf16(out, in, n));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = math::fp32_to_bf16(in[i]);
  });
}

void cast_bf16_to_fp32(float* out, const uint16_t* in, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::cast_bf16_to_fp32(out, in, n));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = math::bf16_to_fp32(in[i]);
  });
}

void round_to_bf16(float* out, const float* in, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::round_to_bf16(out, in, n));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = math::round_bf16(in[i]);
  });
}

void round_to_fp16(float* out, const float* in, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::round_to_fp16(out, in, n));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = math::fp16_to_fp32(math::fp32_to_fp16(in[i]));
  });
}

void round_to(float* out, const float* in, int64_t n, Rounding r) {
  if (r == Rounding::bf16) round_to_bf16(out, in, n);
  else if (r == Rounding::fp16) round_to_fp16(out, in, n);
  else if (out != in) copy_on_device(out, in, size_t(n) * sizeof(float));
}

void quantize_fp8_to_bf16(uint16_t* out, const float* in, int64_t n, float scale, Fp8Format f) {
  LATTICE_KERNEL_ENTRY(cuda::quantize_fp8_to_bf16(out, in, n, scale, f));
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = math::fp32_to_bf16(math::fp8_quantize(in[i], scale, f));
  });
}

float abs_max(const float* in, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::abs_max(in, n));
  // A max is exact in any order: each chunk's in parallel, then theirs (NaN wins).
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> part(size_t(std::max<int64_t>(chunks, 1)), 0.0f);
  std::vector<char> nan(part.size(), 0);
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    float m = 0.0f;
    bool any_nan = false;
    for (int64_t i = b; i < e; ++i) {
      const float a = std::fabs(in[i]);
      any_nan |= std::isnan(a);
      m = a > m ? a : m;
    }
    part[size_t(b / kChunk)] = std::max(part[size_t(b / kChunk)], m);
    nan[size_t(b / kChunk)] |= any_nan;
  });
  float m = 0.0f;
  for (size_t i = 0; i < part.size(); ++i) {
    if (nan[i]) return std::numeric_limits<float>::quiet_NaN();
    m = std::max(m, part[i]);
  }
  return m;
}

void quantize_fp8_blocks(uint16_t* out, const float* in, int64_t rows, int64_t cols, Fp8Blocks blocks,
                         Fp8Format f) {
  LATTICE_KERNEL_ENTRY(cuda::quantize_fp8_blocks(out, in, rows, cols, blocks, f));
  const int64_t br = blocks.rows, bc = blocks.cols;
  const int64_t bands = (rows + br - 1) / br, col_blocks = (cols + bc - 1) / bc;
  const float max = fp8_max(f);
  // A band of br rows at a time, row by row so that reads stay contiguous: each column's amax
  // over the band (NaN as inf: either gives scale 1), each block's scale spread over its
  // columns, then the band quantized.
  auto band = [&](int64_t b, std::vector<float>& col) {
    const int64_t r0 = b * br, r1 = std::min(rows, r0 + br);
    col.assign(size_t(cols), 0.0f);
    float* m = col.data();
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = in + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const float a = std::isnan(x[c]) ? INFINITY : std::fabs(x[c]);
        m[c] = a > m[c] ? a : m[c];
      }
    }
    for (int64_t k = 0; k < col_blocks; ++k) {
      const int64_t c0 = k * bc, c1 = std::min(cols, c0 + bc);
      const float s = math::fp8_block_scale(*std::max_element(m + c0, m + c1), max, blocks.scale);
      std::fill(m + c0, m + c1, s);
    }
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = in + r * cols;
      uint16_t* o = out + r * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = math::fp32_to_bf16(math::fp8_block_value(x[c], m[c], f));
    }
  };
  if (omp_in_parallel() || rows * cols <= (int64_t(1) << 15)) {
    std::vector<float> col;
    for (int64_t b = 0; b < bands; ++b) band(b, col);
    return;
  }
#pragma omp parallel
  {
    std::vector<float> col;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) band(b, col);
  }
}

}  // namespace lattice
