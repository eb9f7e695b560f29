#include "kernels/activation.h"

#include "kernels/cpu/simd_math.h"

namespace lattice {

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluCoeff = 0.044715f;
constexpr int64_t kParallelMin = 32768;
}  // namespace

void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind) {
  if (kind == GeluKind::erf) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      out[i] = 0.5f * v * (1.0f + simd::erf(v * kInvSqrt2));
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
      out[i] = 0.5f * v * (1.0f + simd::tanh(u));
    }
  }
}

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind) {
  if (kind == GeluKind::erf) {
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + simd::erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * simd::exp(-0.5f * v * v);
      dx[i] = (cdf + v * pdf) * dout[i];
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float v2 = v * v;
      const float u = kSqrt2OverPi * (v + kGeluCoeff * v2 * v);
      const float t = simd::tanh(u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v2);
      dx[i] = (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du) * dout[i];
    }
  }
}

}  // namespace lattice
