#include "kernels/activation.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include "kernels/activation_math.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;
}  // namespace

// The element math lives in kernels/activation_math.h, shared with the CUDA kernels.
void gelu_forward(float* out, const float* x, int64_t n, GeluKind kind) {
  LATTICE_KERNEL_ENTRY(cuda::gelu_forward(out, x, n, kind));
  if (kind == GeluKind::erf) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = math::gelu_erf(x[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = math::gelu_tanh(x[i]);
  }
}

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n, GeluKind kind) {
  LATTICE_KERNEL_ENTRY(cuda::gelu_backward(dx, x, dout, n, kind));
  if (kind == GeluKind::erf) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) dx[i] = math::gelu_erf_backward(x[i], dout[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) dx[i] = math::gelu_tanh_backward(x[i], dout[i]);
  }
}

}  // namespace lattice
