// Vectorisable scalar math for the CPU kernels. glibc's expf/erff/tanhf are only
// vectorised under -ffast-math, which lattice does not use (it would make results
// depend on the compiler's choices); these are plain float code that gcc turns into
// AVX-512 loops, and that give the same bits on every machine.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
// gcc 12 reports its own _mm512_undefined_* placeholders as maybe-uninitialized
// (GCC PR105593); the warning points into the intrinsics header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "core/philox.h"
#include "kernels/fast_math.h"

namespace lattice::simd {

// exp, erf, tanh: the scalar polynomials of kernels/fast_math.h (shared with the CUDA
// kernels); plain float code that gcc vectorises.
using math::erf;
using math::exp;
using math::tanh;

namespace detail {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// Draws of 16 consecutive Philox blocks starting at `block`, in element order
// (r[4 * l + q] = word q of block + l).
inline void philox_16_blocks(uint32_t* r, uint64_t block, uint32_t key0, uint32_t key1,
                             uint32_t tag0, uint32_t tag1) {
#if defined(__AVX512F__)
  alignas(64) uint32_t lo[16], hi[16];
  for (int l = 0; l < 16; ++l) {
    lo[l] = uint32_t(block + uint64_t(l));
    hi[l] = uint32_t((block + uint64_t(l)) >> 32);
  }
  __m512i c0 = _mm512_load_si512(lo), c1 = _mm512_load_si512(hi);
  __m512i c2 = _mm512_set1_epi32(int(tag0)), c3 = _mm512_set1_epi32(int(tag1));
  const __m512i m0 = _mm512_set1_epi64(kPhiloxM0), m1 = _mm512_set1_epi64(kPhiloxM1);
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    // 32x32->64 products of the even and the odd 32-bit lanes.
    const __m512i p0e = _mm512_mul_epu32(c0, m0);
    const __m512i p0o = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
    const __m512i p1e = _mm512_mul_epu32(c2, m1);
    const __m512i p1o = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
    const __mmask16 odd = 0xAAAA;
    const __m512i lo0 = _mm512_mask_blend_epi32(odd, p0e, _mm512_slli_epi64(p0o, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(p0e, 32), p0o);
    const __m512i lo1 = _mm512_mask_blend_epi32(odd, p1e, _mm512_slli_epi64(p1o, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(p1e, 32), p1o);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(int(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(int(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  // Transpose (c0..c3 per block) into element order.
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i a01 = _mm512_shuffle_i32x4(u0, u1, 0x44), a23 = _mm512_shuffle_i32x4(u2, u3, 0x44);
  const __m512i b01 = _mm512_shuffle_i32x4(u0, u1, 0xEE), b23 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
  _mm512_storeu_si512(r + 0, _mm512_shuffle_i32x4(a01, a23, 0x88));
  _mm512_storeu_si512(r + 16, _mm512_shuffle_i32x4(a01, a23, 0xDD));
  _mm512_storeu_si512(r + 32, _mm512_shuffle_i32x4(b01, b23, 0x88));
  _mm512_storeu_si512(r + 48, _mm512_shuffle_i32x4(b01, b23, 0xDD));
#else
  // Portable form: lanes in 64-bit words (values < 2^32) so compilers can vectorise.
  uint64_t c0[16], c1[16], c2[16], c3[16];
  for (int l = 0; l < 16; ++l) {
    const uint64_t bi = block + uint64_t(l);
    c0[l] = bi & 0xFFFFFFFFu;
    c1[l] = bi >> 32;
    c2[l] = tag0;
    c3[l] = tag1;
  }
  uint64_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < 16; ++l) {
      const uint64_t p0 = uint64_t(kPhiloxM0) * (c0[l] & 0xFFFFFFFFu);
      const uint64_t p1 = uint64_t(kPhiloxM1) * (c2[l] & 0xFFFFFFFFu);
      const uint64_t n0 = (p1 >> 32) ^ c1[l] ^ k0;
      const uint64_t n2 = (p0 >> 32) ^ c3[l] ^ k1;
      c0[l] = n0;
      c1[l] = p1 & 0xFFFFFFFFu;
      c2[l] = n2;
      c3[l] = p0 & 0xFFFFFFFFu;
    }
    k0 = uint32_t(k0 + kPhiloxW0);
    k1 = uint32_t(k1 + kPhiloxW1);
  }
  for (int l = 0; l < 16; ++l) {
    r[4 * l + 0] = uint32_t(c0[l]);
    r[4 * l + 1] = uint32_t(c1[l]);
    r[4 * l + 2] = uint32_t(c2[l]);
    r[4 * l + 3] = uint32_t(c3[l]);
  }
#endif
}

}  // namespace detail

// Philox draws for `count` consecutive element indices starting at `first`: u[k] =
// stream.u32(first + k), bit for bit. Sixteen blocks of four are computed at once
// (AVX-512 where the target has it).
inline void philox_u32(uint32_t* u, const PhiloxStream& stream, uint64_t first, int64_t count) {
  const uint32_t key0 = uint32_t(stream.seed) ^ stream.stream * 0x85EBCA6Bu;
  const uint32_t key1 = uint32_t(stream.seed >> 32) ^ stream.stream;
  const uint64_t last = first + uint64_t(count);  // exclusive
  alignas(64) uint32_t r[64];
  for (uint64_t block = first >> 2; (block << 2) < last; block += 16) {
    const uint64_t base = block << 2;
    const uint64_t lo = base > first ? base : first;
    const uint64_t hi = base + 64 < last ? base + 64 : last;
    if (lo == base && hi == base + 64) {
      detail::philox_16_blocks(u + (base - first), block, key0, key1, stream.tag0, stream.tag1);
    } else {
      detail::philox_16_blocks(r, block, key0, key1, stream.tag0, stream.tag1);
      std::memcpy(u + (lo - first), r + (lo - base), (hi - lo) * sizeof(uint32_t));
    }
  }
}

// Dropout keep-scale for `count` consecutive indices: m[k] = keep ? scale : 0 where
// keep = uniform(first + k) >= p, i.e. (u32 >> 8) >= ceil(p * 2^24) in integers.
inline void dropout_mask(float* m, const PhiloxStream& stream, uint64_t first, int64_t count,
                         float p, float scale) {
  constexpr int64_t kBatch = 256;
  const uint32_t threshold = dropout_threshold(p);
  alignas(64) uint32_t u[kBatch];
  for (int64_t k0 = 0; k0 < count; k0 += kBatch) {
    const int64_t len = count - k0 < kBatch ? count - k0 : kBatch;
    philox_u32(u, stream, first + uint64_t(k0), len);
    float* mk = m + k0;
    for (int64_t k = 0; k < len; ++k) mk[k] = (u[k] >> 8) >= threshold ? scale : 0.0f;
  }
}

}  // namespace lattice::simd
