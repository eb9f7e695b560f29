// GELU and its derivative for one element, shared by the CPU kernels
// (kernels/cpu/activation.cpp) and the CUDA kernels (kernels/cuda/activation.cu).
#pragma once
#include "core/hd.h"
#include "kernels/fast_math.h"

namespace lattice::math {

inline constexpr float kInvSqrt2 = 0.70710678118654752f;
inline constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1 / sqrt(2 pi)
inline constexpr float kSqrt2OverPi = 0.79788456080286536f;
inline constexpr float kGeluCoeff = 0.044715f;

// x Phi(x), exact (erf) form.
LATTICE_HD inline float gelu_erf(float v) { return 0.5f * v * (1.0f + math::erf(v * kInvSqrt2)); }

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
LATTICE_HD inline float gelu_tanh(float v) {
  const float u = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
  return 0.5f * v * (1.0f + math::tanh(u));
}

// d/dx [x Phi(x)] * dout = (Phi(x) + x phi(x)) * dout
LATTICE_HD inline float gelu_erf_backward(float v, float dout) {
  const float cdf = 0.5f * (1.0f + math::erf(v * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * math::exp(-0.5f * v * v);
  return (cdf + v * pdf) * dout;
}

LATTICE_HD inline float gelu_tanh_backward(float v, float dout) {
  const float v2 = v * v;
  const float u = kSqrt2OverPi * (v + kGeluCoeff * v2 * v);
  const float t = math::tanh(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v2);
  return (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du) * dout;
}

// SwiGLU (Megatron's --swiglu): silu(g) u = g sigmoid(g) u for a gate g and an up-projection u.
LATTICE_HD inline float sigmoid(float v) { return 1.0f / (1.0f + math::exp(-v)); }
LATTICE_HD inline float swiglu(float g, float u) { return g * sigmoid(g) * u; }
// Its gradients times dout: dg = dout u silu'(g), silu'(g) = s (1 + g (1 - s)) with
// s = sigmoid(g); du = dout silu(g).
LATTICE_HD inline void swiglu_backward(float g, float u, float dout, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = dout * u * (s * (1.0f + g * (1.0f - s)));
  du = dout * (g * s);
}

}  // namespace lattice::math
