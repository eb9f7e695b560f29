// Number formats for mixed precision: fp32 <-> bf16 / fp16 (round to nearest, ties to
// even; overflow to inf as the hardware conversions do), and fp8 e4m3 / e5m2 with a
// per-tensor scale (saturating to the format's largest finite value, as fp8 training
// casts do). bf16 and fp16 values are stored as their 16-bit patterns; fp8 values are
// kept as the fp32 numbers they stand for ("on the fp8 grid"), since the CPU multiplies
// them in fp32 anyway.
#pragma once
#include <cstdint>

namespace lattice {

enum class Fp8Format { e4m3, e5m2 };

// How a block of an fp8 block-scaled tensor gets its power-of-2 scale from its amax
// (math::fp8_block_scale): --fp8-recipe blockwise (pow2) or mxfp8 (e8m0).
enum class Fp8BlockScale : uint8_t { pow2, e8m0 };

// The blocks of a block-scaled fp8 tensor [rows, cols] (row-major): rows x cols each (the
// last ones of a row or column partial). 1 x 32 with e8m0: an mxfp8 row-wise tensor;
// 32 x 1 its column-wise one; 1 x 128 and 128 x 1 blockwise's activations and gradients,
// 128 x 128 its weights.
struct Fp8Blocks {
  int64_t rows = 1, cols = 1;
  Fp8BlockScale scale = Fp8BlockScale::pow2;
};

// The format a GEMM result is rounded to when a fused kernel reads it: the mixed-precision
// policy's layer-output format (GemmPolicy::result_rounding); none for fp32 results.
enum class Rounding : uint8_t { none, bf16, fp16 };

// Largest finite value: e4m3 448 (no infinities), e5m2 57344.
float fp8_max(Fp8Format f);

// One value. NaN stays NaN (quiet); +-inf stays +-inf for bf16 and fp16.
uint16_t fp32_to_bf16(float x);
float bf16_to_fp32(uint16_t b);
uint16_t fp32_to_fp16(float x);
float fp16_to_fp32(uint16_t h);
// x * scale rounded to the fp8 grid (nearest, ties to even; subnormals kept), clamped to
// +-fp8_max (infinities too); NaN stays NaN. The result is the fp8 number itself
// (not divided by scale).
float fp8_quantize(float x, float scale, Fp8Format f);

// Arrays (n elements, OpenMP over blocks).
void cast_fp32_to_bf16(uint16_t* out, const float* in, int64_t n);
void cast_bf16_to_fp32(float* out, const uint16_t* in, int64_t n);
// out[i] = bf16(in[i]) / fp16(in[i]) as fp32 (out may alias in).
void round_to_bf16(float* out, const float* in, int64_t n);
void round_to_fp16(float* out, const float* in, int64_t n);
// round_to_bf16 / round_to_fp16 by r; none copies (nothing when out == in).
void round_to(float* out, const float* in, int64_t n, Rounding r);
// out[i] = the bf16 pattern of fp8_quantize(in[i], scale, f) (exact: fp8 values are bf16
// values): an fp8 GEMM operand as the bf16 GEMM reads it, in one pass.
void quantize_fp8_to_bf16(uint16_t* out, const float* in, int64_t n, float scale, Fp8Format f);
// max |in[i]| (NaN propagates).
float abs_max(const float* in, int64_t n);
// in [rows, cols] quantized block by block: each value on the fp8 grid with its block's scale
// (math::fp8_block_scale of the block's amax), then divided by that scale again
// (math::fp8_block_value): the values the block-scaled tensor stands for, which are bf16
// numbers, written as bf16 patterns (exact).
void quantize_fp8_blocks(uint16_t* out, const float* in, int64_t rows, int64_t cols, Fp8Blocks blocks, Fp8Format f);

}  // namespace lattice
