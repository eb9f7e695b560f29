// The element-wise parts of the Muon optimizer (optim/muon.h; Megatron's --optimizer muon through
// Emerging-Optimizers' OrthogonalizedOptimizer), with torch's fp32 arithmetic: the momentum as
// torch.lerp computes it, the Frobenius normalization's division, and the decoupled weight decay
// and update as two in-place adds. The Newton-Schulz iteration between them is GEMMs (blas/gemm.h).
// The element math is here (host and device); the CPU kernels are in kernels/cpu/muon.cpp, their
// CUDA twins in kernels/cuda/muon.cu.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice {

namespace math {
// torch.lerp(self, end, w) for fp32 tensors and a scalar weight (ATen's lerp: the form depends on
// whether |w| < 0.5).
LATTICE_HD inline float torch_lerp(float self, float end, float w) {
  return (w < 0.5f && w > -0.5f) ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}
}  // namespace math

// Muon's momentum for n elements: g' = g * grad_scale (rounded on its own; 1: g), then
//   m = lerp(m, g', 1 - beta)                  (m.lerp_(grad, 1 - beta), an EMA of the gradients)
//   u = nesterov ? lerp(g', m, beta) : m       (the update's direction, before orthogonalization)
// one_minus_beta and beta are the fp32 values of torch's scalar weights (1 - beta in double, rounded).
void muon_momentum(float* m, float* u, const float* g, int64_t n, float one_minus_beta, float beta, bool nesterov,
                   float grad_scale = 1.0f);
// x[i] = x[i] / denom (torch.nn.functional.normalize's division by max(||x||, eps)).
void divide_inplace(float* x, float denom, int64_t n);
// The decoupled weight decay and the update of a parameter with its orthogonalized direction o:
//   p = p + p * decay      (p.add_(p, alpha=-lr*wd); decay = fp32(-lr * wd))
//   p = p + ((o * scale) * extra) * step     (p.add_(o * scale * extra, alpha=-lr); step = fp32(-lr))
void muon_apply(float* p, const float* o, int64_t n, float decay, float scale, float extra, float step);

}  // namespace lattice
