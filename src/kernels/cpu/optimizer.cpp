#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace lattice {

namespace {
constexpr int64_t kParallelMin = 16384;
}  // namespace

// The operation order and the scalar precision follow torch.optim.AdamW's
// single-tensor path: the scalars are formed in double and rounded to float once,
// m uses torch's lerp (m + w (g - m) for weight w < 0.5), and the update is
// p - step_size * m / (sqrt(v) / sqrt(bc2) + eps).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step) {
  LATTICE_CHECK(step >= 1) << "adamw_update: step " << step << " must be >= 1";
  const double lr_d = lr;
  const float decay = float(1.0 - lr_d * double(weight_decay));
  const float w1 = float(1.0 - double(beta1));
  const float b2 = beta2;
  const float one_minus_b2 = float(1.0 - double(beta2));
  const double bc1 = 1.0 - std::pow(double(beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(beta2), double(step));
  const float step_size = float(lr_d / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const bool lerp_low = w1 < 0.5f;
  const float w1c = 1.0f - w1;
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float pi = p[i] * decay;
    const float mi = lerp_low ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * w1c;
    const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / denom);
  }
}

// momentum_buf may be null when momentum == 0 (torch keeps no buffer then).
void sgd_update(float* p, const float* g, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool first_step) {
  if (momentum == 0.0f || momentum_buf == nullptr) {
    LATTICE_CHECK(momentum == 0.0f) << "sgd_update: momentum " << momentum << " needs a buffer";
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    const float b = first_step ? gi : momentum * momentum_buf[i] + gi;
    momentum_buf[i] = b;
    p[i] -= lr * b;
  }
}

// Fixed chunks summed in index order: the result does not depend on the thread count.
double sum_of_squares(const float* x, int64_t n) {
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

}  // namespace lattice
