// The embedding's gradient scatter, per column, shared by the CUDA kernel (one thread per
// column) and tested on the host (tests/unit/test_embedding_math.cpp).
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice::math {

// dst[idx[n] - begin, c] += dout[n, c] for n = 0 .. N-1 in order (rows outside [0, V)
// skipped when V >= 0; V < 0: every row), one thread per column c: each (row, c) gets its
// terms in index order, the CPU's sums bit for bit. Rows go in groups of G whose loads are
// all issued before the adds (one memory latency per group instead of one per row); a
// row repeated inside a group is summed into its first occurrence, in order.
constexpr int kScatterGroup = 8;

LATTICE_HD inline void scatter_add_rows(float* dst, const float* dout, const int32_t* idx, int64_t N, int64_t C,
                                        int64_t begin, int64_t V, int64_t c) {
  for (int64_t n0 = 0; n0 < N; n0 += kScatterGroup) {
    int64_t row[kScatterGroup];
    float v[kScatterGroup], base[kScatterGroup];
    bool live[kScatterGroup], first[kScatterGroup];
    LATTICE_UNROLL
    for (int k = 0; k < kScatterGroup; ++k) {
      live[k] = n0 + k < N;
      row[k] = live[k] ? int64_t(idx[n0 + k]) - begin : -1;
      if (V >= 0) live[k] = live[k] && row[k] >= 0 && row[k] < V;
      v[k] = live[k] ? dout[(n0 + k) * C + c] : 0.0f;
    }
    LATTICE_UNROLL
    for (int k = 0; k < kScatterGroup; ++k) {
      first[k] = live[k];
      LATTICE_UNROLL
      for (int j = 0; j < k; ++j) first[k] = first[k] && !(live[j] && row[j] == row[k]);
      base[k] = first[k] ? dst[row[k] * C + c] : 0.0f;
    }
    LATTICE_UNROLL
    for (int k = 0; k < kScatterGroup; ++k) {
      if (!first[k]) continue;
      float sum = base[k] + v[k];
      LATTICE_UNROLL
      for (int j = k + 1; j < kScatterGroup; ++j)
        if (live[j] && row[j] == row[k]) sum += v[j];
      dst[row[k] * C + c] = sum;
    }
  }
}

}  // namespace lattice::math
