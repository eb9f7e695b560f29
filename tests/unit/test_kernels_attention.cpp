#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <sstream>
#include <string>

#include "kernels/attention.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

struct RefOut {
  std::vector<double> out, lse;
};

// Naive causal softmax attention in double, with the documented dropout mask. qkv is Megatron's
// grouped layout [B, T, G, H/G + 2, D]: head h reads query h % (H/G) of group h / (H/G), and the
// group's key and value (after its queries), written out here from the layout's definition.
RefOut attention_ref(const std::vector<double>& qkv, const AttentionShape& s,
                     const AttentionDropout& drop) {
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, G = s.G > 0 ? s.G : s.H, R = H / G;
  RefOut r{std::vector<double>(B * T * H * D, 0.0), std::vector<double>(B * H * T, 0.0)};
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t which, int64_t d) {
    const int64_t g = h / R, slot = which == 0 ? h % R : R + which - 1;
    return qkv[(((b * T + t) * G + g) * (R + 2) + slot) * D + d];
  };
  std::vector<double> p(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, i, h, 0, d) * at(b, j, h, 1, d);
          p[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        r.lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          double w = std::exp(p[j] - mx) / sum;
          if (drop.p > 0.0f) {
            const uint64_t idx = uint64_t(((b * H + h) * T + i) * T + j) + drop.first_index;
            w = drop.stream.uniform(idx) >= drop.p ? w / (1.0 - double(drop.p)) : 0.0;
          }
          for (int64_t d = 0; d < D; ++d) r.out[((b * T + i) * H + h) * D + d] += w * at(b, j, h, 2, d);
        }
      }
  return r;
}

struct Case {
  int64_t B, T, H, D;
  float p;
  size_t fd_coords;  // finite-difference coordinates checked (0: all)
  int64_t G = 0;     // query groups (0: H, no grouping)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D << " p=" << c.p << " G=" << c.G;
}

class KernelAttention : public ::testing::TestWithParam<Case> {};

TEST_P(KernelAttention, ForwardAndBackwardMatchDoubleReference) {
  const Case c = GetParam();
  const AttentionShape s{c.B, c.T, c.H, c.D, c.G};
  AttentionDropout drop;
  drop.p = c.p;
  drop.stream = PhiloxStream{2024, fnv1a32("attention-dropout"), 3, 1};
  drop.first_index = c.p > 0 ? 5 : 0;
  const int64_t n_qkv = c.B * c.T * s.layout().width(), n_out = c.B * c.T * c.H * c.D;
  auto qkv = random_floats(size_t(n_qkv), 11, -1.5f, 1.5f);
  auto R = random_floats(size_t(n_out), 12);

  std::vector<float> out(n_out), lse(c.B * c.H * c.T);
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop);
  const auto ref = attention_ref(to_double(qkv), s, drop);
  expect_close(out, ref.out, 1e-5, "out");
  expect_close(lse, ref.lse, 1e-5, "lse");

  const auto which = c.fd_coords ? kernel_test::sample_indices(size_t(n_qkv), c.fd_coords, 13)
                                 : std::vector<size_t>{};
  auto expected = numeric_grad(
      [&](const std::vector<double>& x) { return project(attention_ref(x, s, drop).out, R); },
      to_double(qkv), which);
  std::vector<float> dqkv(n_qkv, 7.0f);  // written, not accumulated
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s, drop);
  expect_close(dqkv, expected, 1e-4, "dqkv", which);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KernelAttention,
    ::testing::Values(Case{1, 1, 1, 4, 0.0f, 0}, Case{1, 5, 2, 4, 0.0f, 0},
                      Case{2, 70, 2, 8, 0.0f, 200}, Case{1, 130, 1, 8, 0.0f, 200},
                      Case{1, 5, 2, 4, 0.3f, 0}, Case{2, 70, 2, 8, 0.1f, 200},
                      Case{1, 130, 1, 8, 0.2f, 200}, Case{1, 64, 1, 16, 0.0f, 150},
                      // grouped-query attention: each group's key and value gradients summed
                      // over its heads (finite differences over the grouped qkv)
                      Case{1, 5, 4, 4, 0.0f, 0, 2}, Case{2, 70, 4, 8, 0.1f, 250, 2},
                      Case{1, 130, 3, 8, 0.0f, 250, 1}, Case{1, 6, 6, 4, 0.3f, 0, 3}),
    [](const auto& info) {
      const Case& c = info.param;
      std::ostringstream name;
      name << "B" << c.B << "T" << c.T << "H" << c.H << "D" << c.D << (c.G ? "G" + std::to_string(c.G) : "")
           << (c.p > 0 ? "Dropout" : "");
      return name.str();
    });

TEST(KernelAttentionWide, ForwardMatchesNaiveSoftmaxAttention) {
  const AttentionShape s{2, 130, 3, 32};
  const int64_t n_qkv = s.B * s.T * s.H * 3 * s.D;
  auto qkv = random_floats(size_t(n_qkv), 21, -2.0f, 2.0f);
  std::vector<float> out(s.B * s.T * s.H * s.D), lse(s.B * s.H * s.T);
  attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{});
  const auto ref = attention_ref(to_double(qkv), s, AttentionDropout{});
  expect_close(out, ref.out, 1e-5, "out");
  expect_close(lse, ref.lse, 1e-5, "lse");
}

TEST(KernelAttentionWide, IndependentOfThreadCount) {
  const AttentionShape s{2, 150, 4, 16, 2};
  AttentionDropout drop;
  drop.p = 0.1f;
  drop.stream = PhiloxStream{5, 6, 7, 8};
  const int64_t n_qkv = s.B * s.T * s.layout().width(), n_out = s.B * s.T * s.H * s.D;
  auto qkv = random_floats(size_t(n_qkv), 31), dout = random_floats(size_t(n_out), 32);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> out(n_out), lse(s.B * s.H * s.T), dqkv(n_qkv);
    attention_forward(out.data(), lse.data(), qkv.data(), s, drop);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const int saved = omp_get_max_threads();
  auto one = run(1), two = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace lattice
