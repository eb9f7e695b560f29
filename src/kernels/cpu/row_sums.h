// Row-segment helpers shared by the CPU kernels that read bf16 GEMM results or sum a
// gradient's columns (the CPU twin of the CUDA kernels' column_sums_accumulate).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cast_math.h"

namespace lattice::cpu {

// v[j] = y[j] + bias[j] in fp32 for j < len (bias null: y[j] alone): a bf16 GEMM result
// with its bias, as bias_add computes the sum.
inline void widen_with_bias(float* v, const uint16_t* y, const float* bias, int64_t len) {
  if (bias) {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) v[j] = math::bf16_to_fp32(y[j]) + bias[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) v[j] = math::bf16_to_fp32(y[j]);
  }
}

// The largest of x[0 .. n) (-inf for none; NaNs are passed over), in 16 lanes so that it
// vectorizes (a single running max is a loop-carried scalar chain).
inline float row_max(const float* __restrict x, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -INFINITY;
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[v + l] > acc[l] ? x[v + l] : acc[l];
  float m = -INFINITY;
  for (; v < n; ++v) m = x[v] > m ? x[v] : m;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// Columns per task: a multiple of the vector width, large enough to amortise the task,
// small enough to spread C = 768 over the cores.
inline constexpr int64_t kSumColumns = 64;

// dbias[c] += sum_n x[n, c] for an [N, C] x given row segment by row segment, and with
// x16 (may be null) x's bf16 cast stored at x16[n * C + c]. row(n, c0, len, buf) returns
// x[n, c0 .. c0 + len): its own pointer, or buf (kSumColumns floats) filled. Tasks are
// column chunks, each summing its rows in order: the bits of bias_backward on a stored x,
// whatever the thread count.
template <class Row>
void column_sums(float* dbias, uint16_t* x16, int64_t N, int64_t C, const Row& row) {
  const int64_t chunks = (C + kSumColumns - 1) / kSumColumns;
#pragma omp parallel for schedule(static) if (N * C > 32768)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c0 = k * kSumColumns, len = std::min(C - c0, kSumColumns);
    alignas(64) float acc[kSumColumns] = {}, buf[kSumColumns];
    for (int64_t n = 0; n < N; ++n) {
      const float* __restrict x = row(n, c0, len, buf);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) acc[j] += x[j];
      if (x16) {
        uint16_t* __restrict o = x16 + n * C + c0;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) o[j] = math::fp32_to_bf16(x[j]);
      }
    }
    for (int64_t j = 0; j < len; ++j) dbias[c0 + j] += acc[j];
  }
}

}  // namespace lattice::cpu
