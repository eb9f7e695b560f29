// Shared by the attention tests of the CPU suite (tests/unit) and the GPU suite
// (tests/cuda): random inputs, document ids, and the reference and error measure of the
// tensor-core attention (the CPU's fp32 attention on inputs rounded to the format; each
// tensor's relative Frobenius error).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cast_math.h"

namespace lattice::attention_test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Non-decreasing document ids per batch row, a new document starting at a position with
// probability 1/12 (so documents are shorter than a tile and some key tiles miss a query
// tile's documents entirely); each batch row gets its own boundaries.
inline std::vector<int32_t> document_ids(int64_t B, int64_t T, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> start(0, 11);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 100 * int32_t(b);
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && start(gen) == 0) ++id;
      ids[size_t(b * T + t)] = id;
    }
  }
  return ids;
}

// Attention dropout p = 0.1 as tensor-parallel rank 1 of 2 sees it: this rank's H heads
// are heads [H, 2H) of 2H, and the stream starts past earlier draws.
inline AttentionDropout tensor_parallel_rank1_dropout(int64_t H) {
  AttentionDropout drop;
  drop.p = 0.1f;
  drop.stream = PhiloxStream{2024, fnv1a32("attention-dropout"), 3, 1};
  drop.first_index = 7;
  drop.total_heads = 2 * H;
  drop.head_offset = H;
  return drop;
}

// The values rounded to fp16 (else bf16), kept in fp32.
inline std::vector<float> rounded(std::vector<float> v, bool fp16) {
  for (float& x : v) x = fp16 ? math::fp16_to_fp32(math::fp32_to_fp16(x)) : math::round_bf16(x);
  return v;
}

// |a - b| / |b| (Frobenius norms) over the elements `pick` selects; NaN -> infinity.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b,
                             const std::function<bool(size_t)>& pick) {
  double err = 0.0, ref = 0.0;
  for (size_t k = 0; k < b.size(); ++k) {
    if (!pick(k)) continue;
    const double d = double(a[k]) - double(b[k]);
    err += d * d;
    ref += double(b[k]) * double(b[k]);
  }
  return std::isnan(err) ? INFINITY : std::sqrt(err / std::max(ref, 1e-300));
}

// The tensor-core attention's reference: the CPU's fp32 kernels on q, k, v and dO rounded
// to the format (the kernels round them where they enter a product).
struct RoundedReference {
  std::vector<float> out, lse, dqkv;
};
inline RoundedReference rounded_reference(const std::vector<float>& qkv, const std::vector<float>& dout,
                                          const AttentionShape& s, const AttentionDropout& drop,
                                          const int32_t* document_ids, bool fp16) {
  const auto qkv_r = rounded(qkv, fp16), dout_r = rounded(dout, fp16);
  RoundedReference r{std::vector<float>(dout.size()), std::vector<float>(size_t(s.B * s.H * s.T)),
                     std::vector<float>(qkv.size())};
  attention_forward(r.out.data(), r.lse.data(), qkv_r.data(), s, drop, document_ids);
  attention_backward(r.dqkv.data(), dout_r.data(), qkv_r.data(), r.out.data(), r.lse.data(), s, drop,
                     document_ids);
  return r;
}

// Whether element k of a qkv [B,T,G,R+2,D] is a query (which 0), a key (1) or a value (2).
inline std::function<bool(size_t)> part_of(const QkvLayout& L, int which) {
  return [L, which](size_t k) {
    const int64_t R = L.R(), in_group = int64_t(k) / L.D % L.slots() % (R + 2);
    return (in_group < R ? 0 : in_group == R ? 1 : 2) == which;
  };
}

// Relative errors of out and of dq, dk, dv (the parts of dqkv [B,T,G,R+2,D]).
struct Errors {
  double out, dq, dk, dv;
};
inline Errors errors(const std::vector<float>& out, const std::vector<float>& dqkv, const RoundedReference& ref,
                     const QkvLayout& L) {
  return {relative_error(out, ref.out, [](size_t) { return true; }), relative_error(dqkv, ref.dqkv, part_of(L, 0)),
          relative_error(dqkv, ref.dqkv, part_of(L, 1)), relative_error(dqkv, ref.dqkv, part_of(L, 2))};
}

}  // namespace lattice::attention_test
