#include "kernels/attention_gate.h"

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 32768;

void check_layout(const QkvLayout& L, const char* what) {
  LATTICE_CHECK(L.gated && L.H > 0 && L.G > 0 && L.D > 0 && L.H % L.G == 0)
      << what << ": qkv without gates, or heads " << L.H << ", groups " << L.G << ", head dim " << L.D;
}
}  // namespace

void attention_output_gate_forward(float* y, const float* o, const float* qkv, int64_t N, const QkvLayout& L) {
  LATTICE_KERNEL_ENTRY(cuda::attention_output_gate_forward(y, o, qkv, N, L));
  check_layout(L, "attention_output_gate_forward");
  const int64_t H = L.H, D = L.D;
#pragma omp parallel for schedule(static) if (N * H * D > kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const float* g = qkv + n * L.width() + L.gate_slot(h) * D;
      const int64_t at = (n * H + h) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) y[at + d] = math::output_gate(o[at + d], g[d]);
    }
}

void attention_output_gate_backward(float* d_o, float* dqkv, const float* dy, const float* o, const float* qkv,
                                    int64_t N, const QkvLayout& L) {
  LATTICE_KERNEL_ENTRY(cuda::attention_output_gate_backward(d_o, dqkv, dy, o, qkv, N, L));
  check_layout(L, "attention_output_gate_backward");
  const int64_t H = L.H, D = L.D;
#pragma omp parallel for schedule(static) if (N * H * D > kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t gate = n * L.width() + L.gate_slot(h) * D, at = (n * H + h) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        float dod, dg;
        math::output_gate_backward(o[at + d], qkv[gate + d], dy[at + d], dod, dg);
        d_o[at + d] = dod;
        dqkv[gate + d] = dg;
      }
    }
}

}  // namespace lattice
