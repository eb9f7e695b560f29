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
// out[i] = fp8_quantize(in[i], scale, f): the fp8 numbers (dequantize by 1/scale; out may
// alias in).
void quantize_fp8(float* out, const float* in, int64_t n, float scale, Fp8Format f);
// max |in[i]| (NaN propagates).
float abs_max(const float* in, int64_t n);

}  // namespace lattice
