// The attention tests' double-precision reference (test_kernels_window_attention.cpp,
// test_kernels_attention_sink.cpp): naive attention over qkv [B, T, G, R+2, D] (Megatron's grouped
// layout: head h reads query h % R of group h / R, and the group's key and value), with every mask
// and extra kernels/attention.h defines written out as plainly as possible.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace lattice::attention_reference {

// Query i of head h sees key j iff j <= i, i - W <= j with a window (W = s.window >= 0) and, with
// ids, doc[b,i] == doc[b,j]. sink: empty, or [H] logits appended to each of that head's rows before
// the softmax and dropped after it (Megatron-Core's softmax_offset). Dropout as AttentionDropout
// defines it. out [B,T,H,D]; lse [B,H,T] when asked for.
inline std::vector<double> attention(const std::vector<double>& qkv, const AttentionShape& s,
                                     const AttentionDropout& drop, const int32_t* doc,
                                     const std::vector<double>& sink = {}, std::vector<double>* lse = nullptr) {
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, G = s.G > 0 ? s.G : s.H, R = H / G;
  std::vector<double> out(static_cast<size_t>(B * T * H * D), 0.0), p(static_cast<size_t>(T));
  if (lse) lse->assign(size_t(B * H * T), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t which, int64_t d) {
    const int64_t g = h / R, slot = which == 0 ? h % R : R + which - 1;
    return qkv[size_t((((b * T + t) * G + g) * (R + 2) + slot) * D + d)];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        auto visible = [&](int64_t j) {
          if (j > i || (s.window >= 0 && j < i - s.window)) return false;
          return !doc || doc[b * T + j] == doc[b * T + i];
        };
        double mx = sink.empty() ? -INFINITY : sink[size_t(h)];  // the sink's column
        for (int64_t j = 0; j < T; ++j) {
          if (!visible(j)) continue;
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, i, h, 0, d) * at(b, j, h, 1, d);
          p[size_t(j)] = dot / std::sqrt(double(D));
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = sink.empty() ? 0.0 : std::exp(sink[size_t(h)] - mx);
        for (int64_t j = 0; j < T; ++j)
          if (visible(j)) sum += std::exp(p[size_t(j)] - mx);
        if (lse) (*lse)[size_t((b * H + h) * T + i)] = mx + std::log(sum);
        for (int64_t j = 0; j < T; ++j) {
          if (!visible(j)) continue;
          double w = std::exp(p[size_t(j)] - mx) / sum;
          if (drop.p > 0.0f) {
            const int64_t heads = drop.total_heads > 0 ? drop.total_heads : H;
            const uint64_t idx = uint64_t(((b * heads + drop.head_offset + h) * T + i) * T + j) + drop.first_index;
            w = drop.stream.uniform(idx) >= drop.p ? w / (1.0 - double(drop.p)) : 0.0;
          }
          for (int64_t d = 0; d < D; ++d) out[size_t(((b * T + i) * H + h) * D + d)] += w * at(b, j, h, 2, d);
        }
      }
  return out;
}

}  // namespace lattice::attention_reference
