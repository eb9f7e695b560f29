// Grouped-query attention in the kernels (kernels/qkv_layout.h): the attention and the KV cache
// read a group's key and value in place, in Megatron's grouped layout [N, G, R + 2, D]. Checked
// against the definition HuggingFace's repeat_kv spells out: the same attention over an expanded
// qkv [N, H, 3, D] in which every head gets its own copy of its group's key and value, with the
// key and value gradients of a group the sum of its heads' (the adjoint of the copy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "../attention_test_data.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::random_floats;

// qkv [N, H, 3, D] from grouped [N, G, R + 2, D]: head h = g R + r gets query r of group g and
// the group's key and value.
std::vector<float> expand(const std::vector<float>& grouped, int64_t N, const QkvLayout& L) {
  const int64_t R = L.H / L.G, D = L.D;
  std::vector<float> qkv(size_t(N * L.H * 3 * D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < L.H; ++h)
      for (int part = 0; part < 3; ++part) {
        const int64_t slot = (h / R) * (R + 2) + (part == 0 ? h % R : R + part - 1);
        for (int64_t d = 0; d < D; ++d)
          qkv[size_t(((n * L.H + h) * 3 + part) * D + d)] = grouped[size_t((n * L.slots() + slot) * D + d)];
      }
  return qkv;
}

// The adjoint of expand: a group's key (value) gradient is the sum of its heads', in double.
std::vector<double> reduce(const std::vector<float>& dqkv, int64_t N, const QkvLayout& L) {
  const int64_t R = L.H / L.G, D = L.D;
  std::vector<double> grouped(size_t(N * L.width()), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < L.H; ++h)
      for (int part = 0; part < 3; ++part) {
        const int64_t slot = (h / R) * (R + 2) + (part == 0 ? h % R : R + part - 1);
        for (int64_t d = 0; d < D; ++d)
          grouped[size_t((n * L.slots() + slot) * D + d)] += dqkv[size_t(((n * L.H + h) * 3 + part) * D + d)];
      }
  return grouped;
}

struct GqaCase {
  int64_t B, T, H, G, D;
  bool dropout, documents;
};

std::string name_of(const GqaCase& c) {
  return "B" + std::to_string(c.B) + "T" + std::to_string(c.T) + "H" + std::to_string(c.H) + "G" +
         std::to_string(c.G) + "D" + std::to_string(c.D) + (c.dropout ? "Dropout" : "") +
         (c.documents ? "Documents" : "");
}

void PrintTo(const GqaCase& c, std::ostream* os) { *os << name_of(c); }

class KernelGqaAttention : public ::testing::TestWithParam<GqaCase> {};

// The forward reads exactly the values the expanded layout holds, in the same order: the same
// bits. The backward's query gradients likewise; each key and value gradient is the heads' sum,
// added per key tile inside the kernel (not after it), so it equals the sum of the expanded
// run's gradients to rounding.
TEST_P(KernelGqaAttention, EqualsMultiHeadAttentionOverRepeatedKeysAndValues) {
  const GqaCase c = GetParam();
  const AttentionShape grouped{c.B, c.T, c.H, c.D, c.G}, expanded{c.B, c.T, c.H, c.D};
  const QkvLayout L = grouped.layout();
  const int64_t N = c.B * c.T, n_out = N * c.H * c.D;
  AttentionDropout drop;
  if (c.dropout) drop = attention_test::tensor_parallel_rank1_dropout(c.H);
  const std::vector<int32_t> docs = attention_test::document_ids(c.B, c.T, 5);
  const int32_t* doc = c.documents ? docs.data() : nullptr;
  const std::vector<float> qkv = random_floats(size_t(N * L.width()), 41, -1.5f, 1.5f);
  const std::vector<float> dout = random_floats(size_t(n_out), 42);
  const std::vector<float> qkv_x = expand(qkv, N, L);

  std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(c.B * c.H * c.T));
  std::vector<float> out_x(out.size()), lse_x(lse.size());
  attention_forward(out.data(), lse.data(), qkv.data(), grouped, drop, doc);
  attention_forward(out_x.data(), lse_x.data(), qkv_x.data(), expanded, drop, doc);
  EXPECT_TRUE(kernel_test::same_bits(out, out_x)) << name_of(c) << ": out";
  EXPECT_TRUE(kernel_test::same_bits(lse, lse_x)) << name_of(c) << ": lse";

  std::vector<float> dqkv(qkv.size(), 7.0f), dqkv_x(qkv_x.size());  // written, not accumulated
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), grouped, drop, doc);
  attention_backward(dqkv_x.data(), dout.data(), qkv_x.data(), out_x.data(), lse_x.data(), expanded, drop, doc);
  const std::vector<double> want = reduce(dqkv_x, N, L);
  const int64_t R = L.H / L.G;
  double max_abs = 0;
  for (double v : want) max_abs = std::max(max_abs, std::fabs(v));
  for (size_t e = 0; e < dqkv.size(); ++e) {
    const int64_t slot = int64_t(e) / L.D % L.slots();
    if (slot % (R + 2) < R)  // a query: one head's gradient, the same bits
      ASSERT_EQ(dqkv[e], float(want[e])) << name_of(c) << ": query gradient, element " << e;
    else
      ASSERT_NEAR(dqkv[e], want[e], 2e-6 * max_abs) << name_of(c) << ": key/value gradient, element " << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelGqaAttention,
                         ::testing::Values(GqaCase{1, 5, 4, 2, 4, false, false},   // 2 groups of 2
                                           GqaCase{2, 70, 6, 2, 8, true, false},   // 2 groups of 3, dropout
                                           GqaCase{1, 130, 4, 1, 16, false, true}, // multi-query, documents
                                           GqaCase{2, 66, 3, 3, 8, true, true}),   // no grouping (G = H)
                         [](const auto& info) { return name_of(info.param); });

// Generation: the KV cache holds one row per group (G x D per token, not H x D), filled from the
// grouped qkv as chunks of tokens arrive; the cached attention over it gives the full causal
// attention's outputs.
TEST(KernelGqaDecode, CachePerGroupMatchesTheFullAttention) {
  const int64_t T = 9, H = 6, G = 2, D = 8, Tmax = 12;
  const QkvLayout L{H, G, D};
  const std::vector<float> qkv = random_floats(size_t(T * L.width()), 43, -1.5f, 1.5f);
  std::vector<float> full(size_t(T * H * D)), lse(size_t(H * T));
  attention_forward(full.data(), lse.data(), qkv.data(), AttentionShape{1, T, H, D, G}, AttentionDropout{});

  std::vector<float> k_cache(size_t(G * Tmax * D), NAN), v_cache(k_cache.size(), NAN), out(full.size(), NAN);
  int64_t past = 0;
  for (int64_t n : {4, 1, 3, 1}) {  // a prompt, then tokens one or a few at a time
    const float* rows = qkv.data() + past * L.width();
    kv_cache_append(k_cache.data(), v_cache.data(), rows, n, past, L, Tmax);
    cached_attention_forward(out.data() + past * H * D, rows, k_cache.data(), v_cache.data(), n, past, L, Tmax);
    past += n;
  }
  ASSERT_EQ(past, T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) {
        const size_t at = size_t((g * Tmax + t) * D + d);
        ASSERT_EQ(k_cache[at], qkv[size_t(t * L.width() + L.kv_slot(g, 1) * D + d)]) << "key t " << t << " g " << g;
        ASSERT_EQ(v_cache[at], qkv[size_t(t * L.width() + L.kv_slot(g, 2) * D + d)]) << "value t " << t << " g " << g;
      }
  for (size_t e = 0; e < full.size(); ++e) ASSERT_NEAR(out[e], full[e], 2e-6) << "output element " << e;
}

TEST(KernelGqaDecode, AppendPastTheCacheIsRefused) {
  const QkvLayout L{4, 2, 4};
  std::vector<float> qkv(size_t(3 * L.width()), 1.0f), k(size_t(2 * 4 * 4)), v(k.size());
  EXPECT_THROW(kv_cache_append(k.data(), v.data(), qkv.data(), 3, 2, L, 4), Error);
}

TEST(KernelGqaAttentionShape, GroupsMustDivideTheHeads) {
  std::vector<float> qkv(size_t(2 * (4 + 2 * 3) * 4)), out(size_t(2 * 4 * 4)), lse(8);
  EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), AttentionShape{1, 2, 4, 4, 3}, AttentionDropout{}),
               Error);
}

}  // namespace
}  // namespace lattice
