// Format conversions by bit manipulation (no dependence on the FPU rounding mode except
// the fp8 subnormal step, which uses the default round-to-nearest-even addition).
#include <omp.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cast.h"

namespace lattice {
namespace {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// m >> s rounded to nearest, ties to even (1 <= s < 32).
inline uint32_t shift_rne(uint32_t m, int s) {
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1u : 0u);
}

struct Fp8Spec {
  int mbits;   // mantissa bits
  int emin;    // exponent of the smallest normal
  float max;   // largest finite
};
inline Fp8Spec spec(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Spec{3, -6, 448.0f} : Fp8Spec{2, -14, 57344.0f};
}

// Rounds |a| (finite, < max) to the fp8 grid.
inline float fp8_round_abs(float a, const Fp8Spec& s) {
  const float min_normal = std::ldexp(1.0f, s.emin);
  if (a < min_normal) {
    // Subnormals: a fixed step 2^(emin - mbits); adding 2^(emin - mbits + 23) makes the fp32
    // addition round at exactly that step (ties to even).
    const float magic = std::ldexp(1.0f, s.emin - s.mbits + 23);
    return (a + magic) - magic;
  }
  const int drop = 23 - s.mbits;
  return float_of(shift_rne(bits_of(a), drop) << drop);
}

template <class F>
void parallel_chunks(int64_t n, F f) {
  constexpr int64_t kChunk = 1 << 16;
  if (n <= kChunk || omp_in_parallel()) {
    f(int64_t(0), n);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

}  // namespace

float fp8_max(Fp8Format f) { return spec(f).max; }

uint16_t fp32_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                // overflow -> inf
}

float bf16_to_fp32(uint16_t b) { return float_of(uint32_t(b) << 16); }

uint16_t fp32_to_fp16(float x) {
  uint32_t u = bits_of(x);
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

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(float(m), -24);
  return float_of(sign | ((e - 15 + 127) << 23) | (m << 13));
}

float fp8_quantize(float x, float scale, Fp8Format f) {
  const Fp8Spec s = spec(f);
  const float v = x * scale;
  if (std::isnan(v)) return v;
  const float a = std::fabs(v);
  const float r = a >= s.max ? s.max : fp8_round_abs(a, s);
  return std::signbit(v) ? -r : r;
}

void cast_fp32_to_bf16(uint16_t* out, const float* in, int64_t n) {
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint32_t u = bits_of(in[i]);
      out[i] = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40)
                                                : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  });
}

void cast_bf16_to_fp32(float* out, const uint16_t* in, int64_t n) {
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = float_of(uint32_t(in[i]) << 16);
  });
}

void round_to_bf16(float* out, const float* in, int64_t n) {
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint32_t u = bits_of(in[i]);
      out[i] = (u & 0x7fffffffu) > 0x7f800000u ? in[i] : float_of((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
    }
  });
}

void round_to_fp16(float* out, const float* in, int64_t n) {
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(in[i]));
  });
}

void quantize_fp8(float* out, const float* in, int64_t n, float scale, Fp8Format f) {
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = fp8_quantize(in[i], scale, f);
  });
}

float abs_max(const float* in, int64_t n) {
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    nan |= std::isnan(a);
    m = a > m ? a : m;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

}  // namespace lattice
