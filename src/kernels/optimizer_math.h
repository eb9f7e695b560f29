// Per-element optimizer steps shared by the CPU kernels (kernels/cpu/optimizer.cpp)
// and the CUDA ones (kernels/cuda/optimizer.cu), with the scalars formed once on the
// host in the same precision.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "kernels/cast_math.h"

namespace lattice::math {

// AdamW's per-step scalars, following torch.optim.AdamW's single-tensor path: formed in
// double and rounded to float once.
struct AdamwScalars {
  float decay;         // 1 - lr * wd
  float w1;            // 1 - beta1, the lerp weight of m
  float w1c;           // 1 - w1
  bool lerp_low;       // w1 < 0.5: torch's lerp takes the m + w (g - m) form
  float b2;            // beta2
  float one_minus_b2;  // 1 - beta2
  float step_size;     // lr / (1 - beta1^step)
  float bc2_sqrt;      // sqrt(1 - beta2^step)
  float eps;
};

inline AdamwScalars adamw_scalars(float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int64_t step) {
  AdamwScalars s;
  const double lr_d = lr;
  s.decay = float(1.0 - lr_d * double(weight_decay));
  s.w1 = float(1.0 - double(beta1));
  s.w1c = 1.0f - s.w1;
  s.lerp_low = s.w1 < 0.5f;
  s.b2 = beta2;
  s.one_minus_b2 = float(1.0 - double(beta2));
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  s.step_size = float(lr_d / bc1);
  s.bc2_sqrt = float(std::sqrt(bc2));
  s.eps = eps;
  return s;
}

// p = p * decay;  m = lerp(m, g, w1);  v = b2 v + (1 - b2) g^2;
// p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
LATTICE_HD inline void adamw_step(float& p, float g, float& m, float& v, const AdamwScalars& s) {
  const float pi = p * s.decay;
  const float mi = s.lerp_low ? m + s.w1 * (g - m) : g - (g - m) * s.w1c;
  const float vi = v * s.b2 + s.one_minus_b2 * g * g;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  m = mi;
  v = vi;
  p = pi - s.step_size * (mi / denom);
}

// A moment as stored (--exp-avg-dtype, --exp-avg-sq-dtype): fp32, or bf16 bit patterns read
// exactly into fp32 and written rounded to nearest even.
LATTICE_HD inline float load_moment(float x) { return x; }
LATTICE_HD inline float load_moment(uint16_t x) { return bf16_to_fp32(x); }
LATTICE_HD inline void store_moment(float& o, float x) { o = x; }
LATTICE_HD inline void store_moment(uint16_t& o, float x) { o = fp32_to_bf16(x); }

// adamw_step with the moments in their stored types: read into fp32, the step in fp32 (the
// update uses the new moments before their rounding), stored back. Both fp32: adamw_step's bits.
template <class M, class V>
LATTICE_HD inline void adamw_step_stored(float& p, float g, M& m, V& v, const AdamwScalars& s) {
  float mi = load_moment(m), vi = load_moment(v);
  adamw_step(p, g, mi, vi, s);
  store_moment(m, mi);
  store_moment(v, vi);
}

// Plain SGD with L2 weight decay (no momentum buffer).
LATTICE_HD inline void sgd_step(float& p, float g, float lr, float weight_decay) {
  p -= lr * (g + weight_decay * p);
}

// SGD with momentum (dampening 0): buf = g' on the first step, else momentum buf + g'.
LATTICE_HD inline void sgd_momentum_step(float& p, float g, float& buf, float lr, float momentum,
                                         float weight_decay, bool first_step) {
  const float gi = g + weight_decay * p;
  const float b = first_step ? gi : momentum * buf + gi;
  buf = b;
  p -= lr * b;
}

}  // namespace lattice::math
