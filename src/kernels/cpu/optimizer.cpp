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

// A chunk of moments as fp32: fp32 ones in place, bf16 ones widened into buf (and narrowed back,
// rounded to nearest even, by store_chunk), so that every moment type runs one loop (the same
// instructions, so the same contractions: bf16 moments get the fp32 step's bits, then rounded).
float* fp32_chunk(float* m, float*, int64_t) { return m; }
float* fp32_chunk(uint16_t* m, float* buf, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) buf[i] = math::bf16_to_fp32(m[i]);
  return buf;
}
void store_chunk(float*, const float*, int64_t) {}
void store_chunk(uint16_t* m, const float* buf, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) m[i] = math::fp32_to_bf16(buf[i]);
}

// The AdamW step over one range with the moments in their stored types (fp32 or bf16).
template <class M, class V>
void adamw_update_stored(float* p, const float* g, M* m, V* v, int64_t n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int64_t step, float grad_scale) {
  LATTICE_CHECK(step >= 1) << "adamw_update: step " << step << " must be >= 1";
  const math::AdamwScalars s = math::adamw_scalars(lr, beta1, beta2, eps, weight_decay, step);
  for_scaled_grads(g, n, grad_scale, [=](int64_t i0, int64_t len, const float* gs) {
    alignas(64) float mbuf[kUpdateChunk], vbuf[kUpdateChunk];
    float* ps = p + i0;
    float* ms = fp32_chunk(m + i0, mbuf, len);
    float* vs = fp32_chunk(v + i0, vbuf, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) math::adamw_step(ps[i], gs[i], ms[i], vs[i], s);
    store_chunk(m + i0, ms, len);
    store_chunk(v + i0, vs, len);
  });
}

template <class M, class V>
void adamw_ranges_stored(float* p, const float* g, M* m, V* v, const AdamwRange* ranges, int64_t count, float beta1,
                         float beta2, float eps, int64_t step, float grad_scale) {
  for (int64_t k = 0; k < count; ++k) {
    const AdamwRange& r = ranges[k];
    adamw_update_stored(p + r.begin, g + r.begin, m + r.state_offset, v + r.state_offset, r.n, r.lr, beta1, beta2,
                        eps, r.weight_decay, step, grad_scale);
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
  adamw_update_stored(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}

void adamw_update_ranges(float* p, const float* g, const AdamwMoments& mo, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  LATTICE_KERNEL_ENTRY(cuda::adamw_update_ranges(p, g, mo, ranges, count, beta1, beta2, eps, step, grad_scale));
  auto* mf = static_cast<float*>(mo.m);
  auto* vf = static_cast<float*>(mo.v);
  auto* mb = static_cast<uint16_t*>(mo.m);
  auto* vb = static_cast<uint16_t*>(mo.v);
  if (!mo.m_bf16 && !mo.v_bf16)
    adamw_ranges_stored(p, g, mf, vf, ranges, count, beta1, beta2, eps, step, grad_scale);
  else if (mo.m_bf16 && mo.v_bf16)
    adamw_ranges_stored(p, g, mb, vb, ranges, count, beta1, beta2, eps, step, grad_scale);
  else if (mo.m_bf16)
    adamw_ranges_stored(p, g, mb, vf, ranges, count, beta1, beta2, eps, step, grad_scale);
  else
    adamw_ranges_stored(p, g, mf, vb, ranges, count, beta1, beta2, eps, step, grad_scale);
}

void adamw_update_ranges(float* p, const float* g, float* m, float* v, const AdamwRange* ranges, int64_t count,
                         float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  LATTICE_KERNEL_ENTRY(cuda::adamw_update_ranges(p, g, m, v, ranges, count, beta1, beta2, eps, step, grad_scale));
  adamw_ranges_stored(p, g, m, v, ranges, count, beta1, beta2, eps, step, grad_scale);
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
