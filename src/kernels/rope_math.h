// The rotary position embedding's arithmetic (kernels/rope.h), shared by the CPU kernel and
// its CUDA twin.
#pragma once
#include <cstdint>

#include "core/hd.h"

namespace lattice::math {

// The two elements of rotated pair d (< half) among a head part's D values.
LATTICE_HD inline int64_t rope_first(int64_t d, int64_t half, bool interleaved) { return interleaved ? 2 * d : d; }
LATTICE_HD inline int64_t rope_second(int64_t d, int64_t half, bool interleaved) {
  return interleaved ? 2 * d + 1 : d + half;
}

// Pair (x[i], x[j]) rotated by the angle whose cosine and sine are c and s (s negated for
// the backward's inverse rotation).
LATTICE_HD inline void rope_rotate(float* x, int64_t i, int64_t j, float c, float s) {
  const float a = x[i], b = x[j];
  x[i] = a * c - b * s;
  x[j] = b * c + a * s;
}

}  // namespace lattice::math
