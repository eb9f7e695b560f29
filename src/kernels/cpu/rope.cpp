#include "kernels/rope.h"

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope_math.h"

namespace lattice {

namespace {

void check_shape(const RopeTable& t, int64_t T, int64_t pos0, int64_t D, const char* what) {
  LATTICE_CHECK(t.cos && t.sin && t.half >= 1 && 2 * t.half <= D && T >= 1 && pos0 >= 0 &&
                pos0 + T <= t.positions)
      << what << ": positions " << pos0 << ".." << pos0 + T << " of a " << t.positions << "-position table, "
      << 2 * t.half << " of " << D << " dims rotated";
}

// Rotates q and k of every row by +angle (sign 1) or -angle (sign -1).
void rotate(float* qkv, const RopeTable& t, int64_t N, int64_t T, int64_t pos0, int64_t H, int64_t D, float sign) {
#pragma omp parallel for schedule(static) if (N * H * D > 32768)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t pos = pos0 + n % T;
    const float* c = t.cos + pos * t.half;
    const float* s = t.sin + pos * t.half;
    for (int64_t h = 0; h < H; ++h)
      for (int part = 0; part < 2; ++part) {
        float* x = qkv + ((n * H + h) * 3 + part) * D;
        for (int64_t d = 0; d < t.half; ++d)
          math::rope_rotate(x, math::rope_first(d, t.half, t.interleaved), math::rope_second(d, t.half, t.interleaved),
                            c[d], sign * s[d]);
      }
  }
}

}  // namespace

void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, int64_t H, int64_t D) {
  check_shape(table, T, pos0, D, "rope_forward");
  LATTICE_KERNEL_ENTRY(cuda::rope_forward(qkv, table, N, T, pos0, H, D));
  rotate(qkv, table, N, T, pos0, H, D, 1.0f);
}

void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, int64_t H, int64_t D) {
  check_shape(table, T, 0, D, "rope_backward");
  LATTICE_KERNEL_ENTRY(cuda::rope_backward(dqkv, table, N, T, H, D));
  rotate(dqkv, table, N, T, 0, H, D, -1.0f);
}

}  // namespace lattice
