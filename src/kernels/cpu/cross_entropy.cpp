#include "kernels/cross_entropy.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/simd_math.h"

namespace lattice {

namespace {

constexpr int kLanes = 16;

void check_targets(const int32_t* targets, int64_t N, int64_t V, int64_t Vp) {
  LATTICE_CHECK(V > 0 && V <= Vp) << "cross entropy: V " << V << " not in [1, Vp = " << Vp << "]";
  for (int64_t n = 0; n < N; ++n)
    LATTICE_CHECK(targets[n] >= 0 && targets[n] < V)
        << "cross entropy: target " << targets[n] << " of row " << n << " not in [0, " << V << ")";
}

float row_max(const float* __restrict x, int64_t V) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -INFINITY;
  int64_t v = 0;
  for (; v + kLanes <= V; v += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[v + l] > acc[l] ? x[v + l] : acc[l];
  float m = -INFINITY;
  for (; v < V; ++v) m = x[v] > m ? x[v] : m;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// Lane sums in float over blocks of 1024 columns, blocks summed in double: the error
// stays at float rounding of a 64-term sum whatever V is.
constexpr int64_t kBlock = 1024;

// kStore: overwrite x with the exponentials (x is then written through the same
// pointer it is read from, so no aliasing question arises).
template <bool kStore, typename Ptr>
double row_sum_exp(Ptr x, float max, int64_t V) {
  double total = 0.0;
  for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
    const int64_t b1 = b0 + kBlock < V ? b0 + kBlock : V;
    float acc[kLanes] = {};
    int64_t v = b0;
    for (; v + kLanes <= b1; v += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float e = simd::exp(x[v + l] - max);
        if constexpr (kStore) x[v + l] = e;
        acc[l] += e;
      }
    float s = 0.0f;
    for (; v < b1; ++v) {
      const float e = simd::exp(x[v] - max);
      if constexpr (kStore) x[v] = e;
      s += e;
    }
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    total += double(s);
  }
  return total;
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp) {
  LATTICE_KERNEL_ENTRY(cuda::cross_entropy_forward(losses, logits, targets, N, V, Vp));
  check_targets(targets, N, V, Vp);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    const float m = row_max(x, V);
    const double sum = row_sum_exp<false>(x, m, V);
    losses[n] = float(std::log(sum) + double(m) - double(x[targets[n]]));
  }
}

// Three sweeps of one row (max; exp stored in place with its sum; scale), each row
// (V * 4 bytes, 200 KB for GPT-2) staying in L2 after the first, with one exp per
// element.
void cross_entropy_forward_backward(float* logits_to_dlogits, float* losses,
                                    const int32_t* targets, const float* loss_mask,
                                    float grad_scale, int64_t N, int64_t V, int64_t Vp) {
  LATTICE_KERNEL_ENTRY(cuda::cross_entropy_forward_backward(logits_to_dlogits, losses, targets, loss_mask, grad_scale, N, V, Vp));
  check_targets(targets, N, V, Vp);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits_to_dlogits + n * Vp;
    const int32_t t = targets[n];
    const float x_t = x[t];
    const float m = row_max(x, V);
    const double sum = row_sum_exp<true>(x, m, V);
    losses[n] = float(std::log(sum) + double(m) - double(x_t));
    const float scale = grad_scale * (loss_mask ? loss_mask[n] : 1.0f);
    const float k = float(double(scale) / sum);
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) x[v] *= k;
    x[t] -= scale;
#pragma omp simd
    for (int64_t v = V; v < Vp; ++v) x[v] = 0.0f;
  }
}

void vocab_parallel_ce_max(float* row_max_out, const float* logits, int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_max(row_max_out, logits, N, valid, Vl));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) row_max_out[n] = valid > 0 ? row_max(logits + n * Vl, valid) : -INFINITY;
}

void vocab_parallel_ce_partials(double* stats, float* logits, const float* rmax, const int32_t* targets,
                                int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl, bool store_exp) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_partials(stats, logits, rmax, targets, vocab_begin, N, valid, Vl, store_exp));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits + n * Vl;
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    stats[2 * n + 1] = t >= 0 && t < valid ? double(x[t]) : 0.0;
    stats[2 * n] = store_exp ? row_sum_exp<true>(x, rmax[n], valid) : row_sum_exp<false>(x, rmax[n], valid);
  }
}

void vocab_parallel_ce_loss(float* losses, const double* stats, const float* rmax, int64_t N) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_loss(losses, stats, rmax, N));
  for (int64_t n = 0; n < N; ++n)
    losses[n] = float(std::log(stats[2 * n]) + double(rmax[n]) - stats[2 * n + 1]);
}

void vocab_parallel_ce_backward(float* x_all, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_backward(x_all, stats, targets, loss_mask, grad_scale, vocab_begin, N, valid, Vl));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* x = x_all + n * Vl;
    const float scale = grad_scale * (loss_mask ? loss_mask[n] : 1.0f);
    const float k = float(double(scale) / stats[2 * n]);
#pragma omp simd
    for (int64_t v = 0; v < valid; ++v) x[v] *= k;
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    if (t >= 0 && t < valid) x[t] -= scale;
#pragma omp simd
    for (int64_t v = valid; v < Vl; ++v) x[v] = 0.0f;
  }
}

}  // namespace lattice
