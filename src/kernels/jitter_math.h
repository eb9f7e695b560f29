// The MoE router's input jitter (kernels/dropout.h input_jitter_forward/backward) for one Philox
// block, shared by the CPU kernel (kernels/cpu/dropout.cpp) and the CUDA one (kernels/cuda/dropout.cu):
// the same draws, the factor's one FMA (core/philox.h jitter_factor), then a product or an FMA, so
// both give the same bits.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/philox.h"

namespace lattice::math {

// The elements of Philox block blk (indices 4 blk .. 4 blk + 3) within [first_index, first_index + n):
// y[i] = x[i] * factor(first_index + i), or with accumulate y[i] + that as one FMA.
LATTICE_HD inline void jitter_block(float* y, const float* x, int64_t n, float eps, const PhiloxStream& stream,
                                    uint64_t first_index, uint64_t blk, bool accumulate) {
  const PhiloxCounter r = stream.block(blk);
  for (int q = 0; q < 4; ++q) {
    const uint64_t idx = (blk << 2) + uint64_t(q);
    if (idx < first_index || idx >= first_index + uint64_t(n)) continue;
    const int64_t i = int64_t(idx - first_index);
    const float f = jitter_factor(r[q], eps);
    y[i] = accumulate ? fmaf(x[i], f, y[i]) : x[i] * f;
  }
}

}  // namespace lattice::math
