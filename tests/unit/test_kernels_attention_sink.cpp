// Attention sinks (AttentionShape::softmax_offset, Megatron's --softmax-type off-by-one / learnable):
// every head's softmax has one more logit, softmax_offset[h], with no value. Forward (out, lse)
// against a double-precision reference that appends the sink as an extra score column and drops
// it after the softmax (Megatron-Core's forward_torch_softmax); dqkv and the sinks' gradient against
// central differences; with dropout, grouped-query attention, document ids and sliding windows; the
// KV-cache decoder against the training kernel; a sink of -inf (no sink) against the plain kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../attention_test_data.h"
#include "kernels/attention.h"
#include "attention_reference.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

struct Case {
  const char* name;
  int64_t B, T, H, D, G, window;
  bool dropout, documents;
  size_t fd_coords;  // finite-difference coordinates of qkv checked (0: all)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class KernelAttentionSink : public ::testing::TestWithParam<Case> {};

TEST_P(KernelAttentionSink, MatchesReferenceAndFiniteDifferences) {
  const Case& c = GetParam();
  // Logits around the scores' size, so the sink takes a real share of each row.
  const std::vector<float> sink = random_floats(size_t(c.H), 61, -1.0f, 1.5f);
  AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
  s.softmax_offset = sink.data();
  AttentionDropout drop;
  if (c.dropout) drop = attention_test::tensor_parallel_rank1_dropout(c.H);
  const std::vector<int32_t> docs = c.documents ? attention_test::document_ids(c.B, c.T, 7) : std::vector<int32_t>{};
  const int32_t* doc = c.documents ? docs.data() : nullptr;
  const int64_t n_qkv = c.B * c.T * s.layout().width(), n_out = c.B * c.T * c.H * c.D;
  const auto qkv = random_floats(size_t(n_qkv), 62, -1.5f, 1.5f);
  const auto R = random_floats(size_t(n_out), 63);

  std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(c.B * c.H * c.T));
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop, doc);
  std::vector<double> ref_lse;
  expect_close(out, attention_reference::attention(to_double(qkv), s, drop, doc, to_double(sink), &ref_lse), 1e-5, "out");
  expect_close(lse, ref_lse, 1e-5, "lse");

  const auto which = c.fd_coords ? kernel_test::sample_indices(size_t(n_qkv), c.fd_coords, 64) : std::vector<size_t>{};
  const auto dqkv_expected = numeric_grad(
      [&](const std::vector<double>& x) { return project(attention_reference::attention(x, s, drop, doc, to_double(sink)), R); },
      to_double(qkv), which);
  const auto dsink_expected = numeric_grad(
      [&](const std::vector<double>& x) { return project(attention_reference::attention(to_double(qkv), s, drop, doc, x), R); },
      to_double(sink), {});
  std::vector<float> dqkv(static_cast<size_t>(n_qkv), 7.0f), dsink(size_t(c.H), 0.5f);  // dsink accumulates
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s, drop, doc, AttentionMath::fp32,
                     nullptr, nullptr, nullptr, dsink.data());
  expect_close(dqkv, dqkv_expected, 1e-4, "dqkv", which);
  std::vector<double> dsink_plus(dsink_expected);
  for (double& v : dsink_plus) v += 0.5;
  expect_close(dsink, dsink_plus, 1e-4, "d softmax_offset (added to 0.5)");
}

INSTANTIATE_TEST_SUITE_P(Sinks, KernelAttentionSink,
                         ::testing::Values(Case{"Short", 1, 7, 2, 4, 0, -1, false, false, 0},
                                           Case{"AcrossTiles", 2, 150, 2, 8, 0, -1, false, false, 200},
                                           Case{"Dropout", 1, 70, 3, 8, 0, -1, true, false, 200},
                                           Case{"GroupedQueryWindow", 1, 140, 4, 8, 2, 30, true, false, 200},
                                           Case{"DocumentsWindow", 2, 100, 2, 4, 1, 12, false, true, 200}),
                         [](const auto& info) { return std::string(info.param.name); });

// A sink of -inf adds exp(-inf) = 0: the plain kernel's bits; a sink of 0 (off-by-one) differs.
TEST(KernelAttentionSinkBits, MinusInfinityIsNoSink) {
  const AttentionShape plain{2, 90, 4, 16, 2};
  const auto qkv = random_floats(size_t(plain.B * plain.T * plain.layout().width()), 65);
  const auto dout = random_floats(size_t(plain.B * plain.T * plain.H * plain.D), 66);
  const AttentionDropout drop = attention_test::tensor_parallel_rank1_dropout(4);
  auto run = [&](const AttentionShape& s) {
    std::vector<float> out(dout.size()), lse(size_t(s.B * s.H * s.T)), dqkv(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), s, drop);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const std::vector<float> none(4, -std::numeric_limits<float>::infinity()), zeros(4, 0.0f);
  AttentionShape with = plain;
  with.softmax_offset = none.data();
  const std::vector<float> a = run(plain), b = run(with);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  with.softmax_offset = zeros.data();
  EXPECT_NE(run(with), a);
}

// Generation: the cached attention with the sinks equals the training kernel's rows (1e-5).
TEST(KernelAttentionSinkDecode, CachedRowsEqualTheTrainingKernel) {
  const int64_t T = 33, H = 4, G = 2, D = 8;
  const std::vector<float> sink = random_floats(size_t(H), 67, -1.0f, 1.5f);
  for (int64_t window : {int64_t(-1), int64_t(5)}) {
    AttentionShape s{1, T, H, D, G, window};
    s.softmax_offset = sink.data();
    const QkvLayout L = s.layout();
    const auto qkv = random_floats(size_t(T * L.width()), 68, -1.5f, 1.5f);
    std::vector<float> out(size_t(T * H * D)), lse(size_t(H * T));
    attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{});
    std::vector<float> k_cache(size_t(G * T * D)), v_cache(k_cache.size()), cached(out.size());
    int64_t past = 0;
    for (int64_t n : {int64_t(9), int64_t(1), int64_t(23)}) {
      const float* rows = qkv.data() + past * L.width();
      kv_cache_append(k_cache.data(), v_cache.data(), rows, n, past, L, T);
      cached_attention_forward(cached.data() + past * H * D, rows, k_cache.data(), v_cache.data(), n, past, L, T,
                               window, sink.data());
      past += n;
    }
    expect_close(cached, to_double(out), 1e-5, "cached attention with sinks, window " + std::to_string(window));
  }
}

}  // namespace
}  // namespace lattice
