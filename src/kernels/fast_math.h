// Scalar float math shared by the CPU kernels and their CUDA twins (LATTICE_HD): the
// same polynomials as kernels/cpu/simd_math.h (Cephes exp, the Eigen/XLA rational erf,
// tanh through exp), so the GPU computes the same function as the CPU, not the
// device's own expf/erff/tanhf. Plain float code: no rounding-mode or fast-math tricks.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace lattice::math {

LATTICE_HD inline float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

LATTICE_HD inline uint32_t bits_from_float(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

// exp(x), Cephes' polynomial after a Cody-Waite reduction by ln 2. Relative error
// below 2e-7 on [-87, 88]; returns 0 below -87.3 (softmax needs no subnormals).
LATTICE_HD inline float exp(float x) {
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  const bool underflow = x < -87.33654f;
  x = underflow ? -87.33654f : x;
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick.
  const float shifter = 12582912.0f;
  const float t = x * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = int32_t(n) + 127;
  const float scale = float_from_bits(uint32_t(e) << 23);
  return underflow ? 0.0f : y * scale;
}

// erf(x): odd/even rational approximation (absolute error ~1e-7 on the clamped range
// [-4, 4], where erf is +-1 in float).
LATTICE_HD inline float erf(float x) {
  x = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return p / q;
}

// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)). Absolute error ~1e-7.
LATTICE_HD inline float tanh(float x) {
  float ax = x < 0.0f ? -x : x;
  ax = ax > 9.0f ? 9.0f : ax;  // tanh(9) rounds to 1 in float
  const float t = 1.0f - 2.0f / (lattice::math::exp(2.0f * ax) + 1.0f);
  return x < 0.0f ? -t : t;
}

}  // namespace lattice::math
