#include "kernels/cross_entropy.h"

#include "core/device.h"
#include "kernels/cuda/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/row_sums.h"
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

// Logits that are not plain fp32 values: fp32 GEMM results to be rounded by R, or bf16
// patterns. Each block of kBlock columns is staged as fp32 values in a buffer (a loop that
// vectorizes on its own), then goes through the fp32 code above: the same operations in
// the same order as on logits rounded (widened) beforehand.
template <Rounding R>
void stage(float* buf, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) buf[j] = math::round_as<R>(x[j]);
}
template <Rounding R>
void stage(float* buf, const uint16_t* x, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) buf[j] = math::bf16_to_fp32(x[j]);
}

template <Rounding R, class T>
float staged_row_max(const T* x, int64_t V) {
  if constexpr (R == Rounding::none && std::is_same_v<T, float>) {
    return cpu::row_max(x, V);
  } else {
    alignas(64) float buf[kBlock];
    float m = -INFINITY;
    for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
      const int64_t len = std::min(kBlock, V - b0);
      stage<R>(buf, x + b0, len);
      const float bm = cpu::row_max(buf, len);
      m = bm > m ? bm : m;
    }
    return m;
  }
}

// kStore (fp32 logits only): the exponentials overwrite the logits.
template <bool kStore, Rounding R, class T>
double staged_row_sum_exp(T* x, float max, int64_t V) {
  if constexpr (R == Rounding::none && std::is_same_v<T, float>) {
    return row_sum_exp<kStore>(x, max, V);
  } else {
    alignas(64) float buf[kBlock];
    double total = 0.0;
    for (int64_t b0 = 0; b0 < V; b0 += kBlock) {
      const int64_t len = std::min(kBlock, V - b0);
      stage<R>(buf, x + b0, len);
      total += row_sum_exp<kStore>(buf, max, len);  // one block: the same float sum
      if constexpr (kStore) std::memcpy(x + b0, buf, size_t(len) * sizeof(float));
    }
    return total;
  }
}

}  // namespace

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp) {
  LATTICE_KERNEL_ENTRY(cuda::cross_entropy_forward(losses, logits, targets, N, V, Vp));
  check_targets(targets, N, V, Vp);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    const float m = cpu::row_max(x, V);
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
    const float m = cpu::row_max(x, V);
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

void vocab_parallel_ce_max(float* row_max_out, const float* logits, int64_t N, int64_t valid, int64_t Vl,
                           Rounding round_logits) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_max(row_max_out, logits, N, valid, Vl, round_logits));
  math::dispatch_rounding(round_logits, [&](auto r) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      row_max_out[n] = valid > 0 ? staged_row_max<r.value>(logits + n * Vl, valid) : -INFINITY;
  });
}

void vocab_parallel_ce_partials(double* stats, float* logits, const float* rmax, const int32_t* targets,
                                int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl, bool store_exp,
                                Rounding round_logits) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_partials(stats, logits, rmax, targets, vocab_begin, N, valid, Vl,
                                                        store_exp, round_logits));
  math::dispatch_rounding(round_logits, [&](auto r) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* x = logits + n * Vl;
      const int64_t t = int64_t(targets[n]) - vocab_begin;
      stats[2 * n + 1] = t >= 0 && t < valid ? double(math::round_as<r.value>(x[t])) : 0.0;
      stats[2 * n] = store_exp ? staged_row_sum_exp<true, r.value>(x, rmax[n], valid)
                               : staged_row_sum_exp<false, r.value>(x, rmax[n], valid);
    }
  });
}

void vocab_parallel_ce_loss(float* losses, const double* stats, const float* rmax, int64_t N) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_loss(losses, stats, rmax, N));
  for (int64_t n = 0; n < N; ++n)
    losses[n] = float(std::log(stats[2 * n]) + double(rmax[n]) - stats[2 * n + 1]);
}

namespace {
// One row of the backward: the exponentials x[0, valid) (of sum `sum`) into dlogits, the
// target column t (outside [0, valid): none) less the scale, the padding zeroed.
void backward_row(float* __restrict x, double sum, int64_t t, float scale, int64_t valid, int64_t Vl) {
  const float k = float(double(scale) / sum);
#pragma omp simd
  for (int64_t v = 0; v < valid; ++v) x[v] *= k;
  if (t >= 0 && t < valid) x[t] -= scale;
#pragma omp simd
  for (int64_t v = valid; v < Vl; ++v) x[v] = 0.0f;
}
}  // namespace

void vocab_parallel_ce_backward(float* x_all, const double* stats, const int32_t* targets,
                                const float* loss_mask, float grad_scale, int64_t vocab_begin,
                                int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_backward(x_all, stats, targets, loss_mask, grad_scale, vocab_begin, N, valid, Vl));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    backward_row(x_all + n * Vl, stats[2 * n], int64_t(targets[n]) - vocab_begin,
                 grad_scale * (loss_mask ? loss_mask[n] : 1.0f), valid, Vl);
}

// Row by row, each row's passes one after the other while it is in the cache (200 KB for
// GPT-2's vocabulary): the same per-row code as the four kernels, so the same bits, and
// one sweep of the [N, Vl] logits through memory instead of three.
void vocab_parallel_ce_fused(float* losses, float* logits_to_dlogits, float* row_max, double* stats,
                             const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                             int64_t N, int64_t valid, int64_t Vl, Rounding round_logits) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_fused(losses, logits_to_dlogits, row_max, stats, targets, backward,
                                                     loss_mask, grad_scale, N, valid, Vl, round_logits));
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_fused: valid " << valid << " not in [0, " << Vl << "]";
  math::dispatch_rounding(round_logits, [&](auto r) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* x = logits_to_dlogits + n * Vl;
      const float m = valid > 0 ? staged_row_max<r.value>(x, valid) : -INFINITY;
      const int64_t t = int64_t(targets[n]);
      const double target_logit = t >= 0 && t < valid ? double(math::round_as<r.value>(x[t])) : 0.0;
      const double sum = backward ? staged_row_sum_exp<true, r.value>(x, m, valid)
                                  : staged_row_sum_exp<false, r.value>(x, m, valid);
      row_max[n] = m;
      stats[2 * n] = sum;
      stats[2 * n + 1] = target_logit;
      losses[n] = float(std::log(sum) + double(m) - target_logit);
      if (backward) backward_row(x, sum, t, grad_scale * (loss_mask ? loss_mask[n] : 1.0f), valid, Vl);
    }
  });
}

void vocab_parallel_ce_max_bf16(float* row_max_out, const uint16_t* logits, int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_max_bf16(row_max_out, logits, N, valid, Vl));
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_max_bf16: valid " << valid << " not in [0, " << Vl << "]";
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    row_max_out[n] = valid > 0 ? staged_row_max<Rounding::none>(logits + n * Vl, valid) : -INFINITY;
}

void vocab_parallel_ce_partials_bf16(double* stats, const uint16_t* logits, const float* rmax,
                                     const int32_t* targets, int64_t vocab_begin, int64_t N, int64_t valid,
                                     int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_partials_bf16(stats, logits, rmax, targets, vocab_begin, N, valid, Vl));
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_partials_bf16: valid " << valid << " not in [0, " << Vl << "]";
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* x = logits + n * Vl;
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    stats[2 * n + 1] = t >= 0 && t < valid ? double(math::bf16_to_fp32(x[t])) : 0.0;
    stats[2 * n] = staged_row_sum_exp<false, Rounding::none>(x, rmax[n], valid);
  }
}

// Block by block through an fp32 row segment, in the fp32 kernels' steps (the exponentials
// as row_sum_exp makes them; times k; the target's -scale), then rounded to bf16.
void vocab_parallel_ce_backward_bf16(uint16_t* x_all, const float* rmax, const double* stats,
                                     const int32_t* targets, const float* loss_mask, float grad_scale,
                                     int64_t vocab_begin, int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_backward_bf16(x_all, rmax, stats, targets, loss_mask, grad_scale,
                                                             vocab_begin, N, valid, Vl));
  LATTICE_CHECK(valid >= 0 && valid <= Vl) << "vocab_parallel_ce_backward_bf16: valid " << valid << " not in [0, " << Vl << "]";
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    uint16_t* x = x_all + n * Vl;
    const float m = rmax[n];
    const float scale = grad_scale * (loss_mask ? loss_mask[n] : 1.0f);
    const float k = float(double(scale) / stats[2 * n]);
    const int64_t t = int64_t(targets[n]) - vocab_begin;
    alignas(64) float g[kBlock];
    for (int64_t b0 = 0; b0 < valid; b0 += kBlock) {
      const int64_t len = std::min(kBlock, valid - b0);
      stage<Rounding::none>(g, x + b0, len);
      for (int64_t j = 0; j < len; ++j) g[j] = simd::exp(g[j] - m);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) g[j] *= k;
      if (t >= b0 && t < b0 + len) g[t - b0] -= scale;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) x[b0 + j] = math::fp32_to_bf16(g[j]);
    }
    for (int64_t v = valid; v < Vl; ++v) x[v] = 0;
  }
}

// The CPU runs the four kernels (bf16 logits are the GPU's choice; the CPU keeps fp32 ones).
void vocab_parallel_ce_fused_bf16(float* losses, uint16_t* logits_to_dlogits, float* row_max, double* stats,
                                  const int32_t* targets, bool backward, const float* loss_mask, float grad_scale,
                                  int64_t N, int64_t valid, int64_t Vl) {
  LATTICE_KERNEL_ENTRY(cuda::vocab_parallel_ce_fused_bf16(losses, logits_to_dlogits, row_max, stats, targets, backward,
                                                          loss_mask, grad_scale, N, valid, Vl));
  vocab_parallel_ce_max_bf16(row_max, logits_to_dlogits, N, valid, Vl);
  vocab_parallel_ce_partials_bf16(stats, logits_to_dlogits, row_max, targets, 0, N, valid, Vl);
  vocab_parallel_ce_loss(losses, stats, row_max, N);
  if (backward)
    vocab_parallel_ce_backward_bf16(logits_to_dlogits, row_max, stats, targets, loss_mask, grad_scale, 0, N, valid,
                                    Vl);
}

}  // namespace lattice
