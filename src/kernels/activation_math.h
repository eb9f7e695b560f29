// The MLP's activation and its derivative for one element (GELU's two forms, squared ReLU), shared
// by the CPU kernels (kernels/cpu/activation.cpp) and the CUDA kernels (kernels/cuda/activation.cu).
#pragma once
#include <type_traits>

#include "core/hd.h"
#include "kernels/fast_math.h"

namespace lattice {

// The dense MLP's activation: GELU, exact (erf, Megatron's default) or its tanh form
// (--openai-gelu, HuggingFace's gelu_new), or squared ReLU (--squared-relu: relu(x)^2).
enum class GeluKind { erf, tanh, squared_relu };

// A gated linear unit's form (Megatron's gated_linear_unit): from the gate g and the up projection
// u, act(min(g, clamp)) (clamp(u, -clamp, clamp) + linear_offset), act(x) = x sigmoid(alpha x):
// SiLU (alpha 1, --swiglu) or quick GELU (alpha 1.702, --quick-geglu, GPT-OSS's); linear_offset
// is --glu-linear-offset, clamp --activation-func-clamp-value (0: none).
struct GluForm {
  float alpha = 1.0f;
  float linear_offset = 0.0f;
  float clamp = 0.0f;
};
inline constexpr float kQuickGeluAlpha = 1.702f;

}  // namespace lattice

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

// relu(x)^2 and its derivative 2 relu(x) times dout.
LATTICE_HD inline float squared_relu(float v) {
  const float r = v > 0.0f ? v : 0.0f;
  return r * r;
}
LATTICE_HD inline float squared_relu_backward(float v, float dout) { return (v > 0.0f ? 2.0f * v : 0.0f) * dout; }

// The activation of kind K, and its derivative times dout.
template <GeluKind K>
LATTICE_HD inline float activation(float v) {
  if constexpr (K == GeluKind::erf) return gelu_erf(v);
  else if constexpr (K == GeluKind::tanh) return gelu_tanh(v);
  else return squared_relu(v);
}
template <GeluKind K>
LATTICE_HD inline float activation_backward(float v, float dout) {
  if constexpr (K == GeluKind::erf) return gelu_erf_backward(v, dout);
  else if constexpr (K == GeluKind::tanh) return gelu_tanh_backward(v, dout);
  else return squared_relu_backward(v, dout);
}

// f(std::integral_constant<GeluKind, kind>{}): the kind as a compile-time constant (host code).
template <class F>
inline void dispatch_activation(GeluKind kind, const F& f) {
  switch (kind) {
    case GeluKind::erf: return f(std::integral_constant<GeluKind, GeluKind::erf>{});
    case GeluKind::tanh: return f(std::integral_constant<GeluKind, GeluKind::tanh>{});
    case GeluKind::squared_relu: return f(std::integral_constant<GeluKind, GeluKind::squared_relu>{});
  }
}

// The gated linear unit of form f (GluForm; SwiGLU by default: silu(g) u = g sigmoid(g) u) for a
// gate g and an up projection u. The clamps let NaN through (as torch.clamp does).
LATTICE_HD inline float sigmoid(float v) { return 1.0f / (1.0f + math::exp(-v)); }
LATTICE_HD inline float clamp_gate(float g, const GluForm& f) { return f.clamp > 0.0f && g > f.clamp ? f.clamp : g; }
LATTICE_HD inline float clamp_up(float u, const GluForm& f) {
  if (f.clamp <= 0.0f) return u;
  return u > f.clamp ? f.clamp : u < -f.clamp ? -f.clamp : u;
}
LATTICE_HD inline float glu(float g, float u, const GluForm& f = {}) {
  const float gc = clamp_gate(g, f);
  return gc * sigmoid(f.alpha * gc) * (clamp_up(u, f) + f.linear_offset);
}
// Its gradients times dout: dg = dout (u + offset) act'(g), act'(g) = s (1 + alpha g (1 - s)) with
// s = sigmoid(alpha g); du = dout act(g); each 0 where its clamp holds the value (torch.clamp's
// gradient: 1 inside [min, max], its ends included).
LATTICE_HD inline void glu_backward(float g, float u, float dout, const GluForm& f, float& dg, float& du) {
  const float gc = clamp_gate(g, f), uc = clamp_up(u, f);
  const float ag = f.alpha * gc;
  const float s = sigmoid(ag);
  dg = dout * (uc + f.linear_offset) * (s * (1.0f + ag * (1.0f - s)));
  du = dout * (gc * s);
  if (f.clamp > 0.0f) {
    if (!(g <= f.clamp)) dg = 0.0f;
    if (!(u >= -f.clamp && u <= f.clamp)) du = 0.0f;
  }
}

}  // namespace lattice::math
