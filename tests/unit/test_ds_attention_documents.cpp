// Attention with document ids (--reset-attention-mask): forward and backward against a
// naive double-precision reference with an explicit mask and central differences, with
// and without dropout; tiles entirely masked; ids that are not contiguous; and that
// all-zero ids give exactly the unmasked kernel's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "attention_reference.h"
#include "kernels/attention.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

// The reference (attention_reference.h): query i sees key j iff j <= i and doc[b,i] == doc[b,j].
std::vector<double> masked_ref(const std::vector<double>& qkv, const AttentionShape& s,
                               const AttentionDropout& drop, const std::vector<int32_t>& doc,
                               std::vector<double>* lse = nullptr) {
  return attention_reference::attention(qkv, s, drop, doc.data(), {}, lse);
}

// Document ids from document lengths, per batch row (the last one runs to T).
std::vector<int32_t> docs_from_lengths(int64_t B, int64_t T, const std::vector<std::vector<int>>& lens) {
  std::vector<int32_t> doc(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    int32_t id = 0;
    for (int len : lens[size_t(b)])
      for (int k = 0; k < len && t < T; ++k) doc[size_t(b * T + t++)] = id, id += k == len - 1;
    for (; t < T; ++t) doc[size_t(b * T + t)] = id;
  }
  return doc;
}

struct Case {
  const char* name;
  int64_t B, T, H, D;
  float p;
  std::vector<std::vector<int>> lens;
  size_t fd_coords;
};

class DsAttentionDocuments : public ::testing::TestWithParam<Case> {};

TEST_P(DsAttentionDocuments, MatchesMaskedReferenceAndFiniteDifferences) {
  const Case& c = GetParam();
  const AttentionShape s{c.B, c.T, c.H, c.D};
  AttentionDropout drop;
  drop.p = c.p;
  drop.stream = PhiloxStream{99, fnv1a32("doc-attention"), 1, 2};
  const auto doc = docs_from_lengths(c.B, c.T, c.lens);
  const int64_t n_qkv = c.B * c.T * c.H * 3 * c.D, n_out = c.B * c.T * c.H * c.D;
  auto qkv = random_floats(size_t(n_qkv), 41, -1.5f, 1.5f);
  auto R = random_floats(size_t(n_out), 42);
  std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(c.B * c.H * c.T));
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop, doc.data());
  std::vector<double> ref_lse;
  expect_close(out, masked_ref(to_double(qkv), s, drop, doc, &ref_lse), 1e-5, "out");
  expect_close(lse, ref_lse, 1e-5, "lse");

  const auto which = c.fd_coords ? kernel_test::sample_indices(size_t(n_qkv), c.fd_coords, 43)
                                 : std::vector<size_t>{};
  const auto expected = numeric_grad(
      [&](const std::vector<double>& x) { return project(masked_ref(x, s, drop, doc), R); }, to_double(qkv),
      which);
  std::vector<float> dqkv(static_cast<size_t>(n_qkv), 7.0f);
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s, drop, doc.data());
  expect_close(dqkv, expected, 1e-4, "dqkv", which);
}

INSTANTIATE_TEST_SUITE_P(
    DsShapes, DsAttentionDocuments,
    ::testing::Values(
        Case{"TwoDocs", 1, 9, 2, 4, 0.0f, {{4, 5}}, 0},
        Case{"SingleTokenDocs", 2, 7, 1, 4, 0.0f, {{1, 1, 3, 1, 1}, {2, 1, 4}}, 0},
        // 150 tokens, 64-token tiles: the third document starts in tile 1, so tile 0 is
        // skipped for the queries of tile 2 and parts of tiles are masked.
        Case{"AcrossTiles", 2, 150, 2, 8, 0.0f, {{30, 70, 50}, {64, 64, 22}}, 100},
        Case{"AcrossTilesDropout", 1, 150, 1, 8, 0.2f, {{10, 100, 40}}, 200},
        Case{"ShortDropout", 1, 12, 2, 4, 0.3f, {{5, 7}}, 0}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DsAttentionDocumentsIds, NonContiguousIdsMaskByEquality) {
  // ids 0 1 0 1 ...: no tile can be skipped, every other key is masked.
  const AttentionShape s{1, 70, 1, 8};
  std::vector<int32_t> doc(70);
  for (int t = 0; t < 70; ++t) doc[size_t(t)] = t % 2;
  auto qkv = random_floats(size_t(70 * 3 * 8), 51);
  std::vector<float> out(70 * 8), lse(70);
  attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{}, doc.data());
  expect_close(out, masked_ref(to_double(qkv), s, AttentionDropout{}, doc), 1e-5, "out");
}

TEST(DsAttentionDocumentsIds, OneDocumentIsTheUnmaskedKernelBitForBit) {
  const AttentionShape s{2, 130, 2, 16};
  AttentionDropout drop;
  drop.p = 0.1f;
  drop.stream = PhiloxStream{3, 4, 5, 6};
  const int64_t n_qkv = s.B * s.T * s.H * 3 * s.D, n_out = s.B * s.T * s.H * s.D;
  auto qkv = random_floats(size_t(n_qkv), 61), dout = random_floats(size_t(n_out), 62);
  const std::vector<int32_t> zeros(size_t(s.B * s.T), 0);
  auto run = [&](const int32_t* doc) {
    std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(s.B * s.H * s.T)),
        dqkv(static_cast<size_t>(n_qkv));
    attention_forward(out.data(), lse.data(), qkv.data(), s, drop, doc);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop, doc);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  EXPECT_EQ(run(nullptr), run(zeros.data()));
}

}  // namespace
}  // namespace lattice
