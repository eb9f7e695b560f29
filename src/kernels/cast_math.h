// One-value format conversions shared by the CPU cast kernels (kernels/cpu/cast.cpp)
// and the CUDA ones (kernels/cuda/cast.cu): bit manipulation only (plus the exact fp32
// addition of the fp8 subnormal step), so both give the same bits.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/hd.h"
#include "kernels/cast.h"
#include "kernels/fast_math.h"

namespace lattice::math {

LATTICE_HD inline bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// m >> s rounded to nearest, ties to even (1 <= s < 32).
LATTICE_HD inline uint32_t shift_rne(uint32_t m, int s) {
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1u : 0u);
}

// 2^e for a normal float exponent (exact).
LATTICE_HD inline float pow2(int e) { return float_from_bits(uint32_t(e + 127) << 23); }

LATTICE_HD inline uint16_t fp32_to_bf16(float x) {
  const uint32_t u = bits_from_float(x);
  if (is_nan_bits(u)) return uint16_t((u >> 16) | 0x40);                // quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);             // overflow -> inf
}

LATTICE_HD inline float bf16_to_fp32(uint16_t b) { return float_from_bits(uint32_t(b) << 16); }

// bf16(x) as fp32; NaN passes through unchanged.
LATTICE_HD inline float round_bf16(float x) {
  const uint32_t u = bits_from_float(x);
  return is_nan_bits(u) ? x : float_from_bits((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

LATTICE_HD inline uint16_t fp32_to_fp16(float x) {
  uint32_t u = bits_from_float(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 (and inf) -> inf
  if (u >= 0x38800000u) {                                  // normal: >= 2^-14
    const uint32_t e = (u >> 23) - 127 + 15;
    return uint16_t(sign | shift_rne((e << 23) | (u & 0x7fffffu), 13));  // carry may bump e
  }
  if (u <= 0x33000000u) return sign;  // <= 2^-25: ties to even gives zero
  const uint32_t m = (u & 0x7fffffu) | 0x800000u;
  const int exp = int(u >> 23);
  return uint16_t(sign | shift_rne(m, 126 - exp));  // subnormal, unit 2^-24
}

LATTICE_HD inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return float_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * (float(m) * pow2(-24));  // exact
  return float_from_bits(sign | ((e - 15 + 127) << 23) | (m << 13));
}

// o[i] = v, or its bf16 pattern for a bf16 array (kernels that write either format).
LATTICE_HD inline void store_as(float* o, int64_t i, float v) { o[i] = v; }
LATTICE_HD inline void store_as(uint16_t* o, int64_t i, float v) { o[i] = fp32_to_bf16(v); }
// x[i] as fp32, from an fp32 array or a bf16 one (kernels that read either format).
LATTICE_HD inline float load_as(const float* x, int64_t i) { return x[i]; }
LATTICE_HD inline float load_as(const uint16_t* x, int64_t i) { return bf16_to_fp32(x[i]); }

// x rounded to the format, as fp32 (kernels that round a GEMM result as they read it).
template <Rounding R>
LATTICE_HD inline float round_as(float x) {
  if constexpr (R == Rounding::bf16) return round_bf16(x);
  else if constexpr (R == Rounding::fp16) return fp16_to_fp32(fp32_to_fp16(x));
  else return x;
}
LATTICE_HD inline float round_as(float x, Rounding r) {
  return r == Rounding::bf16 ? round_as<Rounding::bf16>(x) : r == Rounding::fp16 ? round_as<Rounding::fp16>(x) : x;
}

// f(std::integral_constant<Rounding, R>{}) for r's R: kernels resolve the format once,
// outside their loops (host code).
template <class F>
decltype(auto) dispatch_rounding(Rounding r, F&& f) {
  if (r == Rounding::bf16) return f(std::integral_constant<Rounding, Rounding::bf16>{});
  if (r == Rounding::fp16) return f(std::integral_constant<Rounding, Rounding::fp16>{});
  return f(std::integral_constant<Rounding, Rounding::none>{});
}

struct Fp8Spec {
  int mbits;  // mantissa bits
  int emin;   // exponent of the smallest normal
  float max;  // largest finite
};
LATTICE_HD inline Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Spec{3, -6, 448.0f} : Fp8Spec{2, -14, 57344.0f};
}

// Rounds |a| (finite, < max) to the fp8 grid.
LATTICE_HD inline float fp8_round_abs(float a, const Fp8Spec& s) {
  if (a < pow2(s.emin)) {
    // Subnormals: a fixed step 2^(emin - mbits); adding 2^(emin - mbits + 23) makes the fp32
    // addition round at exactly that step (ties to even).
    const float magic = pow2(s.emin - s.mbits + 23);
    return (a + magic) - magic;
  }
  const int drop = 23 - s.mbits;
  return float_from_bits(shift_rne(bits_from_float(a), drop) << drop);
}

LATTICE_HD inline float fp8_quantize(float x, float scale, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  const float v = x * scale;
  const uint32_t u = bits_from_float(v);
  if (is_nan_bits(u)) return v;
  const float a = float_from_bits(u & 0x7fffffffu);
  const float r = a >= s.max ? s.max : fp8_round_abs(a, s);
  return (u >> 31) ? -r : r;
}

// The scales of fp8's current-scaling recipes (Transformer Engine's), from the amax of the
// values they scale, so that x * scale lands within +-max.
// Per tensor (--fp8-recipe tensorwise, Float8CurrentScaling): max / amax; 1 for an amax of 0,
// inf or NaN; the largest float where the quotient overflows.
LATTICE_HD inline float fp8_tensor_scale(float amax, float max) {
  if (!(amax > 0.0f) || amax > 3.4028235e38f) return 1.0f;  // 0, NaN, inf
  const float s = max / amax;
  return s > 3.4028235e38f ? 3.4028235e38f : s;
}
// Per block, powers of 2 (exact to undo): blockwise (Float8BlockScaling's power_2_scale):
// max / amax rounded down to a power of 2; mxfp8 (MXFP8BlockScaling): the reciprocal of
// the block's E8M0 exponent, amax / max rounded up to a power of 2 (1 for an amax of 0,
// inf or NaN in both).
LATTICE_HD inline float fp8_block_scale(float amax, float max, Fp8BlockScale rule) {
  if (rule == Fp8BlockScale::pow2) return float_from_bits(bits_from_float(fp8_tensor_scale(amax, max)) & 0xff800000u);
  if (!(amax > 0.0f) || amax > 3.4028235e38f) return 1.0f;
  const uint32_t v = bits_from_float(amax * (1.0f / max));
  uint32_t e = v >> 23;  // the biased exponent, rounded up below (as a saturating ue8m0 conversion)
  const uint32_t mantissa = v & 0x7fffffu;
  if (mantissa > 0 && e != 0xfe && !(e == 0 && mantissa <= 0x400000u)) ++e;
  const int k = 127 - int(e);  // the scale 2^k, k in [-127, 127]
  return k >= -126 ? pow2(k) : float_from_bits(0x00400000u);
}
// x on the block-scaled fp8 grid, back in x's units: fp8_quantize(x, scale) / scale, exact
// for a power-of-2 scale (an fp8 value times a power of 2: a bf16 number).
LATTICE_HD inline float fp8_block_value(float x, float scale, Fp8Format f) {
  return math::fp8_quantize(x, scale, f) / scale;
}

}  // namespace lattice::math
