// Dropout with masks drawn from a counter-based stream: element i of a tensor is
// kept when stream.uniform(first_index + i) >= p. Nothing is stored for backward:
// the mask is drawn again. So the mask depends only on (seed, stream tags, global
// element index), never on the thread count or the parallel layout.
#pragma once
#include <cstdint>

#include "core/philox.h"

namespace lattice {

// out[i] = keep(i) ? x[i] / (1 - p) : 0      (out may alias x; p == 0 copies)
void dropout_forward(float* out, const float* x, int64_t n, float p, const PhiloxStream& stream,
                     uint64_t first_index);

// dx[i] = keep(i) ? dout[i] / (1 - p) : 0    (written; dx may alias dout)
void dropout_backward(float* dx, const float* dout, int64_t n, float p,
                      const PhiloxStream& stream, uint64_t first_index);

}  // namespace lattice
