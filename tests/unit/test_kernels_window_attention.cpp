// Sliding-window attention (AttentionShape::window, Megatron's --window-size W,0): query i sees
// keys i - W .. i only. Forward and backward against a naive double-precision reference with the
// band written out, and central differences; with grouped-query attention, dropout and document
// ids; windows shorter than a tile and spanning tiles (so whole key tiles are skipped); a window
// of 0 (each query sees itself); a window covering the sequence gives the unwindowed kernel's
// bits; and the KV-cache decoder's windowed rows equal the training kernel's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "../attention_test_data.h"
#include "core/error.h"
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
  size_t fd_coords;  // finite-difference coordinates checked (0: all)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class KernelWindowAttention : public ::testing::TestWithParam<Case> {};

TEST_P(KernelWindowAttention, MatchesBandedReferenceAndFiniteDifferences) {
  const Case& c = GetParam();
  const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
  AttentionDropout drop;
  if (c.dropout) drop = attention_test::tensor_parallel_rank1_dropout(c.H);
  const std::vector<int32_t> docs = c.documents ? attention_test::document_ids(c.B, c.T, 9) : std::vector<int32_t>{};
  const int32_t* doc = c.documents ? docs.data() : nullptr;
  const int64_t n_qkv = c.B * c.T * s.layout().width(), n_out = c.B * c.T * c.H * c.D;
  const auto qkv = random_floats(size_t(n_qkv), 71, -1.5f, 1.5f);
  const auto R = random_floats(size_t(n_out), 72);

  std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(c.B * c.H * c.T));
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop, doc);
  std::vector<double> ref_lse;
  const std::vector<double> ref = attention_reference::attention(to_double(qkv), s, drop, doc, {}, &ref_lse);
  expect_close(out, ref, 1e-5, "out");
  expect_close(lse, ref_lse, 1e-5, "lse");
  // The window changes the result (else the case would not test it): the reference without it differs.
  AttentionShape full = s;
  full.window = -1;
  const std::vector<double> unbanded = attention_reference::attention(to_double(qkv), full, drop, doc);
  double moved = 0.0;
  for (size_t k = 0; k < ref.size(); ++k) moved = std::max(moved, std::fabs(ref[k] - unbanded[k]));
  EXPECT_GT(moved, 1e-3) << "the window masks nothing in this case";

  const auto which = c.fd_coords ? kernel_test::sample_indices(size_t(n_qkv), c.fd_coords, 73) : std::vector<size_t>{};
  const auto expected = numeric_grad(
      [&](const std::vector<double>& x) { return project(attention_reference::attention(x, s, drop, doc), R); }, to_double(qkv), which);
  std::vector<float> dqkv(static_cast<size_t>(n_qkv), 7.0f);  // written, not accumulated
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s, drop, doc);
  expect_close(dqkv, expected, 1e-4, "dqkv", which);
}

INSTANTIATE_TEST_SUITE_P(
    Windows, KernelWindowAttention,
    ::testing::Values(Case{"Short", 1, 9, 2, 4, 0, 2, false, false, 0},
                      Case{"SelfOnly", 1, 6, 2, 4, 0, 0, false, false, 0},
                      // 64-key tiles: queries of tiles 2 and 3 skip tile 0 (and 1) outright
                      Case{"AcrossTiles", 1, 230, 2, 8, 0, 40, false, false, 250},
                      Case{"AcrossTilesDropout", 2, 150, 2, 8, 0, 70, true, false, 250},
                      Case{"GroupedQuery", 1, 140, 4, 8, 2, 33, true, false, 250},
                      Case{"MultiQueryTileWide", 1, 200, 3, 8, 1, 64, false, false, 250},
                      Case{"Documents", 2, 130, 2, 8, 0, 20, false, true, 250},
                      Case{"DocumentsDropout", 1, 100, 2, 4, 2, 9, true, true, 250}),
    [](const auto& info) { return std::string(info.param.name); });

std::vector<float> run_all(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s,
                           const AttentionDropout& drop) {
  const size_t n_out = dout.size();
  std::vector<float> out(n_out), lse(size_t(s.B * s.H * s.T)), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop);
  out.insert(out.end(), lse.begin(), lse.end());
  out.insert(out.end(), dqkv.begin(), dqkv.end());
  return out;
}

TEST(KernelWindowAttentionBits, WindowCoveringTheSequenceIsTheCausalKernel) {
  const AttentionShape s{2, 150, 4, 16, 2};
  const AttentionDropout drop = attention_test::tensor_parallel_rank1_dropout(4);
  const auto qkv = random_floats(size_t(s.B * s.T * s.layout().width()), 81);
  const auto dout = random_floats(size_t(s.B * s.T * s.H * s.D), 82);
  const std::vector<float> causal = run_all(qkv, dout, s, drop);
  for (int64_t window : {int64_t(149), int64_t(150), int64_t(1000)}) {
    AttentionShape w = s;
    w.window = window;
    const std::vector<float> banded = run_all(qkv, dout, w, drop);
    EXPECT_EQ(0, std::memcmp(banded.data(), causal.data(), causal.size() * sizeof(float))) << "window " << window;
  }
  AttentionShape narrower = s;
  narrower.window = 148;  // the last query loses its first key
  EXPECT_NE(run_all(qkv, dout, narrower, drop), causal);
}

TEST(KernelWindowAttentionArgs, NegativeWindowBelowMinusOneIsRefused) {
  const AttentionShape s{1, 4, 1, 4, 0, -2};
  std::vector<float> qkv(4 * 12), out(16), lse(4);
  EXPECT_THROW(attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{}), Error);
}

// Generation: each new token's cached attention over the window of cache rows equals the
// training kernel's row at that position (the same softmax over the same keys; the decoder sums
// in another order: 1e-5).
TEST(KernelWindowAttentionDecode, CachedRowsEqualTheTrainingKernel) {
  for (int64_t window : {int64_t(0), int64_t(3), int64_t(17)}) {
    const int64_t T = 40, H = 4, G = 2, D = 8;
    const AttentionShape s{1, T, H, D, G, window};
    const QkvLayout L = s.layout();
    const auto qkv = random_floats(size_t(T * L.width()), 91, -1.5f, 1.5f);
    std::vector<float> out(size_t(T * H * D)), lse(size_t(H * T));
    attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{});
    std::vector<float> k_cache(size_t(G * T * D)), v_cache(k_cache.size()), cached(out.size());
    // Prompt of 11 tokens, then one token at a time.
    int64_t past = 0;
    for (int64_t n : {int64_t(11), int64_t(1), int64_t(1), int64_t(27)}) {
      const float* rows = qkv.data() + past * L.width();
      kv_cache_append(k_cache.data(), v_cache.data(), rows, n, past, L, T);
      cached_attention_forward(cached.data() + past * H * D, rows, k_cache.data(), v_cache.data(), n, past, L, T,
                               window);
      past += n;
    }
    ASSERT_EQ(past, T);
    expect_close(cached, to_double(out), 1e-5, "cached attention, window " + std::to_string(window));
  }
}

}  // namespace
}  // namespace lattice
