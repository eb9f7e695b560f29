#include "kernels/optimizer.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/optimizer_math.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 16384;
constexpr int64_t kUpdateChunk = 2048;  // elements per task: an L1-resident gradient buffer

// step(i0, len, g): the update of elements [i0, i0 + len) from their gradients g[0, len),
// chunk by chunk. With grad_scale != 1 the chunk's g * grad_scale is first stored in a
// buffer, so each product is rounded on its own (the bits scale_inplace would store) and
// never contracted into the update's FMAs.
template <class Step>
void for_scaled_grads(const float* g, int64_t n, float grad_scale, Step step) {
  const int64_t chunks = (n + kUpdateChunk - 1) / kUpdateChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t i0 = k * kUpdateChunk, len = std::min(n - i0, kUpdateChunk);
    alignas(64) float scaled[kUpdateChunk];
    const float* gk = g + i0;
    if (grad_scale != 1.0f) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) scaled[i] = gk[i] * grad_scale;
      gk = scaled;
    }
    step(i0, len, gk);
  }
}
}  // namespace

// The operation order and the scalar precision follow torch.optim.AdamW's
// single-tensor path: the scalars are formed in double and rounded to float once,
// m uses torch's lerp (m + w (g - m) for weight w < 0.5), and the update is
// p - step_size * m / (sqrt(v) / sqrt(bc2) + eps). The scalars and the element step live
// in kernels/optimizer_math.h, shared with the CUDA kernels.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  LATTICE_KERNEL_ENTRY(cuda::adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale));
  LATTICE_CHECK(step >= 1) << "adamw_update: step " << step << " must be >= 1";
  const math::AdamwScalars s = math::adamw_scalars(lr, beta1, beta2, eps, weight_decay, step);
  // Captures by value: the scalars stay in registers (a reference could alias the stores).
  for_scaled_grads(g, n, grad_scale, [=](int64_t i0, int64_t len, const float* gs) {
    float *ps = p + i0, *ms = m + i0, *vs = v + i0;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) math::adamw_step(ps[i], gs[i], ms[i], vs[i], s);
  });
}

void adamw_update_ranges(float* p, const float* g, float* m, float* v, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  LATTICE_KERNEL_ENTRY(cuda::adamw_update_ranges(p, g, m, v, ranges, count, beta1, beta2, eps, step, grad_scale));
  for (int64_t k = 0; k < count; ++k) {
    const AdamwRange& r = ranges[k];
    adamw_update(p + r.begin, g + r.begin, m + r.state_offset, v + r.state_offset, r.n, r.lr, beta1, beta2, eps,
                 r.weight_decay, step, grad_scale);
  }
}

// momentum_buf may be null when momentum == 0 (torch keeps no buffer then).
void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool first_step, float grad_scale) {
  LATTICE_KERNEL_ENTRY(
      cuda::sgd_update(p, g, momentum_buf, n, lr, momentum, weight_decay, first_step, grad_scale));
  if (momentum == 0.0f || momentum_buf == nullptr) {
    LATTICE_CHECK(momentum == 0.0f) << "sgd_update: momentum " << momentum << " needs a buffer";
    for_scaled_grads(g, n, grad_scale, [=](int64_t i0, int64_t len, const float* gs) {
      float* ps = p + i0;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) math::sgd_step(ps[i], gs[i], lr, weight_decay);
    });
    return;
  }
  for_scaled_grads(g, n, grad_scale, [=](int64_t i0, int64_t len, const float* gs) {
    float *ps = p + i0, *bs = momentum_buf + i0;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i)
      math::sgd_momentum_step(ps[i], gs[i], bs[i], lr, momentum, weight_decay, first_step);
  });
}

// Fixed chunks summed in index order: the result does not depend on the thread count.
double sum_of_squares(const float* x, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::sum_of_squares(x, n));
  constexpr int64_t kChunk = 1 << 16;
  constexpr int kLanes = 8;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t i0 = k * kChunk, i1 = std::min(n, i0 + kChunk);
    double acc[kLanes] = {};
    int64_t i = i0;
    for (; i + kLanes <= i1; i += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += double(x[i + l]) * double(x[i + l]);
    double s = 0.0;
    for (; i < i1; ++i) s += double(x[i]) * double(x[i]);
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    partial[size_t(k)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

bool any_non_finite(const float* x, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::any_non_finite(x, n));
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
  return bad != 0;
}

int64_t count_zeros(const float* x, int64_t n) {
  LATTICE_KERNEL_ENTRY(cuda::count_zeros(x, n));
  int64_t zeros = 0;
#pragma omp parallel for reduction(+ : zeros) schedule(static)
  for (int64_t i = 0; i < n; ++i) zeros += x[i] == 0.0f;
  return zeros;
}

}  // namespace lattice
