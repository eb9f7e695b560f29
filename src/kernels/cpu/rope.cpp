#include "kernels/rope.h"

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope_math.h"

namespace lattice {

namespace {

void check_shape(const RopeTable& t, int64_t T, int64_t pos0, const QkvLayout& L, const char* what) {
  LATTICE_CHECK(L.H >= 1 && L.G >= 1 && L.H % L.G == 0)
      << what << ": " << L.H << " query heads in " << L.G << " groups";
  LATTICE_CHECK(t.cos && t.sin && t.half >= 1 && 2 * t.half <= L.D && T >= 1 && pos0 >= 0 &&
                pos0 + T <= t.positions)
      << what << ": positions " << pos0 << ".." << pos0 + T << " of a " << t.positions << "-position table, "
      << 2 * t.half << " of " << L.D << " dims rotated";
}

// Rotates the queries and keys of every row by +angle (sign 1) or -angle (sign -1).
void rotate(float* qkv, const RopeTable& t, int64_t N, int64_t T, int64_t pos0, const QkvLayout& L, float sign) {
  const int64_t rotated = L.H + L.G, D = L.D;
#pragma omp parallel for schedule(static) if (N * L.width() > 32768)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t pos = pos0 + n % T;
    const float* c = t.cos + pos * t.half;
    const float* s = t.sin + pos * t.half;
    for (int64_t v = 0; v < rotated; ++v) {
      float* x = qkv + n * L.width() + rope_slot(L, v) * D;
      for (int64_t d = 0; d < t.half; ++d)
        math::rope_rotate(x, math::rope_first(d, t.half, t.interleaved), math::rope_second(d, t.half, t.interleaved),
                          c[d], sign * s[d]);
    }
  }
}

}  // namespace

void rope_forward(float* qkv, const RopeTable& table, int64_t N, int64_t T, int64_t pos0, const QkvLayout& layout) {
  check_shape(table, T, pos0, layout, "rope_forward");
  LATTICE_KERNEL_ENTRY(cuda::rope_forward(qkv, table, N, T, pos0, layout));
  rotate(qkv, table, N, T, pos0, layout, 1.0f);
}

void rope_backward(float* dqkv, const RopeTable& table, int64_t N, int64_t T, const QkvLayout& layout) {
  check_shape(table, T, 0, layout, "rope_backward");
  LATTICE_KERNEL_ENTRY(cuda::rope_backward(dqkv, table, N, T, layout));
  rotate(dqkv, table, N, T, 0, layout, -1.0f);
}

}  // namespace lattice
