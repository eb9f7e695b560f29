// Philox4x32-10 counter-based RNG (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC'11). A draw depends only on (key, counter), never on which thread
// or rank makes it: this is what makes dropout masks and initial values independent
// of the thread count and of the parallel layout. The integer draws are LATTICE_HD, so
// the CUDA kernels draw the same stream bit for bit.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace lattice {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

LATTICE_HD inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * ctr[0];
    uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Uniform in [0, 1) with 24 bits of precision.
LATTICE_HD inline float philox_uniform(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

// Multiplicative jitter uniform in [1 - eps, 1 + eps) from a draw x (the MoE router's input
// jitter): one explicit FMA, so the CPU and the GPU get the same bits.
LATTICE_HD inline float jitter_factor(uint32_t x, float eps) { return fmaf(2.0f * eps, philox_uniform(x), 1.0f - eps); }

// Dropout's keep test in integers: uniform(x) >= p  <=>  (x >> 8) >= dropout_threshold(p),
// ceil(p * 2^24) (host code; every kernel that draws a mask compares against it).
inline uint32_t dropout_threshold(float p) { return uint32_t(std::ceil(double(p) * 16777216.0)); }

// Uniform in (0, 1], for logs.
inline double philox_uniform_open0(uint32_t hi, uint32_t lo) {
  uint64_t bits = (uint64_t(hi) << 21) ^ uint64_t(lo);  // 53 bits
  bits &= (uint64_t(1) << 53) - 1;
  return (double(bits) + 1.0) * (1.0 / 9007199254740992.0);
}

// A stream of independent draws addressed by a 64-bit element index.
// key = (seed, stream), counter = (index / 4 low, high, tag0, tag1); each Philox call
// yields the draws of four consecutive element indices.
struct PhiloxStream {
  uint64_t seed;
  uint32_t stream;      // what the draws are for (a parameter name hash, a dropout site ...)
  uint32_t tag0 = 0;    // e.g. iteration
  uint32_t tag1 = 0;    // e.g. micro-batch

  LATTICE_HD PhiloxCounter block(uint64_t block_index) const {
    PhiloxCounter ctr = {uint32_t(block_index), uint32_t(block_index >> 32), tag0, tag1};
    PhiloxKey key = {uint32_t(seed) ^ stream * 0x85EBCA6Bu, uint32_t(seed >> 32) ^ stream};
    return philox4x32_10(ctr, key);
  }
  LATTICE_HD uint32_t u32(uint64_t index) const { return block(index >> 2)[index & 3]; }
  LATTICE_HD float uniform(uint64_t index) const { return philox_uniform(u32(index)); }
  // Standard normals of elements 2 * pair and 2 * pair + 1: Box-Muller on one block, the
  // cosine to the even element and the sine to the odd one.
  void normal_pair(uint64_t pair, double& even, double& odd) const {
    PhiloxCounter r = block(pair);
    double u1 = philox_uniform_open0(r[0], r[1]);
    double u2 = philox_uniform_open0(r[2], r[3]);
    double radius = std::sqrt(-2.0 * std::log(u1));
    double angle = 6.283185307179586 * u2;
    even = radius * std::cos(angle);
    odd = radius * std::sin(angle);
  }
  // Standard normal for element `index` (its half of normal_pair).
  double normal(uint64_t index) const {
    double even, odd;
    normal_pair(index >> 1, even, odd);
    return index & 1 ? odd : even;
  }
  // out[k] = float(scale * normal(first + k)) for k < n: one block, one log and one sincos per
  // two elements (normal() alone spends them on one), the same bits.
  void fill_normal(float* out, int64_t n, uint64_t first, double scale) const {
    int64_t k = 0;
    if (n > 0 && (first & 1)) out[k++] = float(scale * normal(first));
    for (; k + 1 < n; k += 2) {
      double even, odd;
      normal_pair((first + uint64_t(k)) >> 1, even, odd);
      out[k] = float(scale * even);
      out[k + 1] = float(scale * odd);
    }
    if (k < n) out[k] = float(scale * normal(first + uint64_t(k)));
  }
};

// FNV-1a, 32-bit: a stable hash for stream ids made from names.
inline uint32_t fnv1a32(const char* s) {
  uint32_t h = 2166136261u;
  for (; *s; ++s) h = (h ^ uint8_t(*s)) * 16777619u;
  return h;
}

}  // namespace lattice
