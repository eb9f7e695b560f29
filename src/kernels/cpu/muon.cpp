#include "kernels/muon.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
}  // namespace

void muon_momentum(float* m, float* u, const float* g, int64_t n, float one_minus_beta, float beta, bool nesterov,
                   float grad_scale) {
  LATTICE_KERNEL_ENTRY(cuda::muon_momentum(m, u, g, n, one_minus_beta, beta, nesterov, grad_scale));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    volatile float scaled = g[i] * grad_scale;  // rounded on its own, as the clipped gradient is stored
    const float gi = grad_scale == 1.0f ? g[i] : float(scaled);
    const float mi = math::torch_lerp(m[i], gi, one_minus_beta);
    m[i] = mi;
    u[i] = nesterov ? math::torch_lerp(gi, mi, beta) : mi;
  }
}

void divide_inplace(float* x, float denom, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::divide_inplace(x, denom, n));
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / denom;
}

void muon_apply(float* p, const float* o, int64_t n, float decay, float scale, float extra, float step) {
  LATTICE_KERNEL_ENTRY(cuda::muon_apply(p, o, n, decay, scale, extra, step));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float decayed = p[i] + p[i] * decay;
    volatile float scaled = o[i] * scale;  // the scaled direction stored, then multiplied again
    volatile float direction = float(scaled) * extra;
    p[i] = decayed + float(direction) * step;
  }
}

}  // namespace lattice
