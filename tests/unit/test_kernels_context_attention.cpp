// The attention of a context-parallel rank (kernels/attention.h ContextKeys, model/context_parallel.h):
// rank r of P holds chunks r and 2P-1-r of each sequence and attends the whole sequence's keys and
// values. Emulated in one process: every rank's outputs and log-sum-exps are the single-process
// attention's rows at its tokens' positions, its query gradients likewise, and the ranks' key and
// value gradients summed are the single-process ones; with attention dropout too (the masks are
// keyed by position in the whole sequence).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../attention_test_data.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels_test_util.h"
#include "model/context_parallel.h"

namespace lattice {
namespace {

struct CpCase {
  int64_t B, T, H, G, D;
  int P;
  bool dropout;
  int64_t window = -1;  // sliding window (AttentionShape::window)
  bool documents = false;  // document ids (--reset-attention-mask): the queries' and the whole sequence's keys'
};

std::string name_of(const CpCase& c) {
  return "B" + std::to_string(c.B) + "T" + std::to_string(c.T) + "H" + std::to_string(c.H) + "G" +
         std::to_string(c.G) + "D" + std::to_string(c.D) + "P" + std::to_string(c.P) + (c.dropout ? "Dropout" : "") +
         (c.window >= 0 ? "Window" + std::to_string(c.window) : "") + (c.documents ? "Documents" : "");
}

void PrintTo(const CpCase& c, std::ostream* os) { *os << name_of(c); }

class KernelContextAttention : public ::testing::TestWithParam<CpCase> {};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

TEST_P(KernelContextAttention, RanksTogetherEqualTheWholeSequence) {
  const CpCase c = GetParam();
  const AttentionShape whole{c.B, c.T, c.H, c.D, c.G, c.window};
  const QkvLayout L = whole.layout();
  const int64_t W = L.width(), KW = 2 * L.G * c.D, HD = c.H * c.D;
  AttentionDropout drop;
  if (c.dropout) drop = attention_test::tensor_parallel_rank1_dropout(c.H);
  const std::vector<float> qkv = kernel_test::random_floats(size_t(c.B * c.T * W), 51, -1.5f, 1.5f);
  const std::vector<float> dout = kernel_test::random_floats(size_t(c.B * c.T * HD), 52);
  std::vector<float> out(size_t(c.B * c.T * HD)), lse(size_t(c.B * c.H * c.T)), dqkv(qkv.size());
  const std::vector<int32_t> ids = c.documents ? attention_test::document_ids(c.B, c.T, 53) : std::vector<int32_t>{};
  const int32_t* doc = c.documents ? ids.data() : nullptr;
  attention_forward(out.data(), lse.data(), qkv.data(), whole, drop, doc);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), whole, drop, doc);

  // The gathered keys and values [B, T, G, 2, D] every rank attends.
  std::vector<float> kv(size_t(c.B * c.T * KW));
  for (int64_t n = 0; n < c.B * c.T; ++n)
    for (int64_t g = 0; g < L.G; ++g)
      std::copy_n(qkv.begin() + n * W + L.kv_slot(g, 1) * c.D, 2 * c.D, kv.begin() + n * KW + g * 2 * c.D);
  std::vector<double> dkv_sum(kv.size(), 0.0);
  const double out_tol = 1e-6 * max_abs(out), dq_tol = 2e-6 * max_abs(dqkv);
  for (int r = 0; r < c.P; ++r) {
    const ContextSplit split{r, c.P, c.T};
    const int64_t Tl = split.rows();
    const AttentionShape local{c.B, Tl, c.H, c.D, c.G, c.window};
    std::vector<float> qkv_l(size_t(c.B * Tl * W)), dout_l(size_t(c.B * Tl * HD));
    std::vector<int32_t> ids_l(size_t(c.B * Tl));  // the local rows' document ids
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < Tl; ++i) {
        const int64_t t = b * c.T + split.position(i), l = b * Tl + i;
        std::copy_n(qkv.begin() + t * W, W, qkv_l.begin() + l * W);
        std::copy_n(dout.begin() + t * HD, HD, dout_l.begin() + l * HD);
        if (c.documents) ids_l[size_t(l)] = ids[size_t(t)];
      }
    std::vector<float> out_l(dout_l.size()), lse_l(size_t(c.B * c.H * Tl)), dqkv_l(qkv_l.size(), 7.0f);
    std::vector<float> dkv(kv.size(), NAN);  // every element written
    ContextKeys keys = split.keys(kv.data(), dkv.data());
    keys.key_document_ids = doc;  // the whole sequence's
    const int32_t* doc_l = c.documents ? ids_l.data() : nullptr;
    attention_forward(out_l.data(), lse_l.data(), qkv_l.data(), local, drop, doc_l, AttentionMath::fp32, nullptr,
                      &keys);
    attention_backward(dqkv_l.data(), dout_l.data(), qkv_l.data(), out_l.data(), lse_l.data(), local, drop, doc_l,
                       AttentionMath::fp32, nullptr, nullptr, &keys);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < Tl; ++i) {
        const int64_t t = split.position(i);
        for (int64_t e = 0; e < HD; ++e)
          ASSERT_NEAR(out_l[size_t((b * Tl + i) * HD + e)], out[size_t((b * c.T + t) * HD + e)], out_tol)
              << name_of(c) << " rank " << r << ": out of batch row " << b << ", position " << t;
        for (int64_t h = 0; h < c.H; ++h) {
          ASSERT_NEAR(lse_l[size_t((b * c.H + h) * Tl + i)], lse[size_t((b * c.H + h) * c.T + t)], 1e-5)
              << name_of(c) << " rank " << r << ": lse at position " << t;
          const int64_t q = L.slot(h, 0) * c.D;
          for (int64_t d = 0; d < c.D; ++d)
            ASSERT_NEAR(dqkv_l[size_t((b * Tl + i) * W + q + d)], dqkv[size_t((b * c.T + t) * W + q + d)], dq_tol)
                << name_of(c) << " rank " << r << ": query gradient at position " << t << ", head " << h;
        }
        for (int64_t g = 0; g < L.G; ++g)  // the key and value slots are left as they were
          for (int64_t d = 0; d < 2 * c.D; ++d)
            ASSERT_EQ(dqkv_l[size_t((b * Tl + i) * W + L.kv_slot(g, 1) * c.D + d)], 7.0f);
      }
    for (size_t e = 0; e < dkv.size(); ++e) {
      ASSERT_FALSE(std::isnan(dkv[e])) << name_of(c) << " rank " << r << ": dkv element " << e << " not written";
      dkv_sum[e] += dkv[e];
    }
  }
  for (int64_t n = 0; n < c.B * c.T; ++n)
    for (int64_t g = 0; g < L.G; ++g)
      for (int64_t d = 0; d < 2 * c.D; ++d)
        ASSERT_NEAR(dkv_sum[size_t(n * KW + g * 2 * c.D + d)], dqkv[size_t(n * W + L.kv_slot(g, 1) * c.D + d)], dq_tol)
            << name_of(c) << ": summed key/value gradient of token " << n << ", group " << g << ", element " << d;
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelContextAttention,
                         ::testing::Values(CpCase{2, 40, 4, 2, 8, 2, true},     // chunks of 10, GQA, dropout
                                           CpCase{1, 256, 2, 2, 16, 2, false},  // chunks of one tile
                                           CpCase{2, 96, 3, 1, 8, 4, false},    // multi-query, 8 chunks of 12
                                           CpCase{1, 200, 2, 2, 8, 4, true},    // chunks of 25 across tiles
                                           CpCase{2, 16, 2, 2, 4, 1, true},     // one rank: two halves of itself
                                           // sliding windows: inside a chunk, and across chunks and tiles
                                           CpCase{2, 40, 4, 2, 8, 2, true, 4},
                                           CpCase{1, 256, 2, 1, 8, 4, true, 70},
                                           // document ids (--reset-attention-mask): documents shorter than a
                                           // chunk, key tiles of other documents skipped; with a window too
                                           CpCase{2, 96, 4, 2, 8, 2, true, -1, true},
                                           CpCase{1, 200, 2, 2, 8, 4, false, 30, true}),
                         [](const auto& info) { return name_of(info.param); });

// Document ids go with the keys' ids (both or neither).
TEST(KernelContextAttentionArgs, RefusesDocumentIdsAndBadSplits) {
  const AttentionShape s{1, 4, 1, 4};
  std::vector<float> qkv(4 * 12), kv(8 * 8), out(16), lse(4);
  std::vector<int32_t> docs(4, 0);
  ContextKeys keys = ContextSplit{0, 2, 8}.keys(kv.data(), nullptr);
  EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{}, docs.data(),
                                 AttentionMath::fp32, nullptr, &keys),
               Error);
  keys.Tk = 4;  // position(3) = 7 is past the keys
  EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{}, nullptr,
                                 AttentionMath::fp32, nullptr, &keys),
               Error);
}

}  // namespace
}  // namespace lattice
