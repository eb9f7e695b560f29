#include "kernels/gqa.h"

#include <cstring>

#include "core/device.h"
#include "kernels/cuda/ops.h"

namespace lattice {

void gqa_expand(float* qkv, const float* groups, int64_t N, int64_t G, int64_t R, int64_t D) {
  LATTICE_KERNEL_ENTRY(cuda::gqa_expand(qkv, groups, N, G, R, D));
  const size_t vec = size_t(D) * sizeof(float);
#pragma omp parallel for schedule(static) if (N * G * R * D > 32768)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const float* in = groups + (n * G + g) * (R + 2) * D;  // q_0 .. q_{R-1}, k, v
      for (int64_t r = 0; r < R; ++r) {
        float* out = qkv + (n * G * R + g * R + r) * 3 * D;  // q, k, v of head g R + r
        std::memcpy(out, in + r * D, vec);
        std::memcpy(out + D, in + R * D, vec);
        std::memcpy(out + 2 * D, in + (R + 1) * D, vec);
      }
    }
}

void gqa_reduce(float* dgroups, const float* dqkv, int64_t N, int64_t G, int64_t R, int64_t D) {
  LATTICE_KERNEL_ENTRY(cuda::gqa_reduce(dgroups, dqkv, N, G, R, D));
#pragma omp parallel for schedule(static) if (N * G * R * D > 32768)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      float* out = dgroups + (n * G + g) * (R + 2) * D;
      const float* head0 = dqkv + (n * G * R + g * R) * 3 * D;
      for (int64_t r = 0; r < R; ++r) std::memcpy(out + r * D, head0 + r * 3 * D, size_t(D) * sizeof(float));
      for (int part = 1; part <= 2; ++part) {  // k, v: the heads' gradients summed in head order
        float* sum = out + (R + part - 1) * D;
        for (int64_t d = 0; d < D; ++d) {
          float s = head0[part * D + d];
          for (int64_t r = 1; r < R; ++r) s += head0[(r * 3 + part) * D + d];
          sum[d] = s;
        }
      }
    }
}

}  // namespace lattice
