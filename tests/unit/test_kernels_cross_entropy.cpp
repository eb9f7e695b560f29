#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "core/error.h"
#include "kernels/cross_entropy.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::random_floats;
using kernel_test::to_double;

// losses in double over the first V of Vp columns.
std::vector<double> ce_ref(const std::vector<double>& logits, const std::vector<int32_t>& t,
                           int64_t N, int64_t V, int64_t Vp) {
  std::vector<double> loss(N);
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[n * Vp + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[n * Vp + v] - mx);
    loss[n] = std::log(s) + mx - logits[n * Vp + t[n]];
  }
  return loss;
}

struct Case {
  int64_t N, V, Vp;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "N=" << c.N << " V=" << c.V << " Vp=" << c.Vp; }

class KernelCrossEntropy : public ::testing::TestWithParam<Case> {};

TEST_P(KernelCrossEntropy, LossAndGradientMatchReference) {
  const auto [N, V, Vp] = GetParam();
  auto logits = random_floats(N * Vp, 1, -4.0f, 4.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) logits[n * Vp + v] = 1e30f;  // padding must not matter
  logits[0] = 80.0f;                                               // large logit: stability
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = int32_t((n * 31 + 7) % V);
  std::vector<float> mask(N);
  for (int64_t n = 0; n < N; ++n) mask[n] = n % 3 == 0 ? 0.0f : 1.0f;
  const float grad_scale = 0.25f;

  const auto ref = ce_ref(to_double(logits), targets, N, V, Vp);
  std::vector<float> losses(N);
  cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
  expect_close(losses, ref, 2e-6, "forward losses");

  // d/dlogits of sum_n loss_n * mask_n * grad_scale.
  const std::vector<size_t> which = kernel_test::sample_indices(size_t(N * Vp), 400, 2);
  auto expected = numeric_grad(
      [&](const std::vector<double>& x) {
        auto l = ce_ref(x, targets, N, V, Vp);
        double s = 0.0;
        for (int64_t n = 0; n < N; ++n) s += l[n] * mask[n] * grad_scale;
        return s;
      },
      to_double(logits), which, 1e-4);
  // The padded columns carry 1e30, where differences mean nothing: the gradient is 0.
  for (size_t i : which)
    if (int64_t(i) % Vp >= V) expected[i] = 0.0;

  std::vector<float> d = logits, losses2(N);
  cross_entropy_forward_backward(d.data(), losses2.data(), targets.data(), mask.data(), grad_scale,
                                 N, V, Vp);
  EXPECT_EQ(losses, losses2);
  expect_close(d, expected, 1e-6, "dlogits", which);
  for (int64_t n = 0; n < N; ++n) {
    double row = 0.0;
    for (int64_t v = 0; v < Vp; ++v) {
      if (v >= V) {
        ASSERT_EQ(d[n * Vp + v], 0.0f) << "padded column " << v;
      }
      if (mask[n] == 0.0f) {
        ASSERT_EQ(d[n * Vp + v], 0.0f) << "masked row " << n;
      }
      row += d[n * Vp + v];
    }
    EXPECT_NEAR(row, 0.0, 1e-6) << "softmax gradient rows sum to 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelCrossEntropy,
                         ::testing::Values(Case{5, 7, 7}, Case{9, 50, 64}, Case{4, 1000, 1024},
                                           Case{3, 3000, 3072}));

TEST(KernelCrossEntropyPadding, PaddedColumnsDoNotChangeLosses) {
  const int64_t N = 16, V = 1003, Vp = 1024;
  auto logits = random_floats(N * Vp, 3, -3.0f, 3.0f);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = int32_t(n * 61 % V);
  std::vector<float> a(N), b(N);
  cross_entropy_forward(a.data(), logits.data(), targets.data(), N, V, Vp);
  auto huge = logits;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) huge[n * Vp + v] = (v % 2) ? 3e38f : NAN;
  cross_entropy_forward(b.data(), huge.data(), targets.data(), N, V, Vp);
  EXPECT_EQ(a, b);
  std::vector<float> c(N);
  cross_entropy_forward_backward(huge.data(), c.data(), targets.data(), nullptr, 1.0f, N, V, Vp);
  EXPECT_EQ(a, c);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) ASSERT_EQ(huge[n * Vp + v], 0.0f);
}

TEST(KernelCrossEntropyPadding, NullMaskAndThreadIndependence) {
  const int64_t N = 64, V = 5000, Vp = 5056;
  auto logits = random_floats(N * Vp, 4, -10.0f, 10.0f);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = int32_t(n * 97 % V);
  std::vector<float> ones(N, 1.0f);
  auto run = [&](int threads, const float* mask) {
    omp_set_num_threads(threads);
    std::vector<float> d = logits, l(N);
    cross_entropy_forward_backward(d.data(), l.data(), targets.data(), mask, 2.0f, N, V, Vp);
    d.insert(d.end(), l.begin(), l.end());
    return d;
  };
  const int saved = omp_get_max_threads();
  auto one = run(1, nullptr), two = run(2, nullptr), masked = run(2, ones.data());
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, masked);
}

TEST(KernelCrossEntropyPadding, RejectsBadTargets) {
  std::vector<float> logits(8, 0.0f), losses(1);
  std::vector<int32_t> t = {6};
  EXPECT_THROW(cross_entropy_forward(losses.data(), logits.data(), t.data(), 1, 6, 8), Error);
  t = {-1};
  EXPECT_THROW(cross_entropy_forward(losses.data(), logits.data(), t.data(), 1, 6, 8), Error);
}

}  // namespace
}  // namespace lattice
