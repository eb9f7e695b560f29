#include <gtest/gtest.h>
#include <omp.h>

#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using testing::expect_close;
using testing::numeric_grad;
using testing::project;
using testing::random_floats;
using testing::to_double;

TEST(KernelElementwise, AddAccumulateScale) {
  const int64_t n = 70001;  // large enough to run in parallel, odd to leave a tail
  auto a = random_floats(n, 1), b = random_floats(n, 2);
  std::vector<float> out(n);
  add_forward(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  add_forward(a.data(), a.data(), b.data(), n);  // aliasing
  EXPECT_EQ(a, out);
  std::vector<float> y = b;
  accumulate(y.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], b[i] + out[i]) << i;
  scale_inplace(y.data(), 0.5f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (b[i] + out[i]) * 0.5f) << i;
}

TEST(KernelElementwise, BiasAddAndBackward) {
  const int64_t N = 37, C = 130;
  auto x = random_floats(N * C, 3), bias = random_floats(C, 4), R = random_floats(N * C, 5);
  std::vector<float> out = x;
  bias_add(out.data(), bias.data(), N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], x[n * C + c] + bias[c]);

  auto loss = [&](const std::vector<double>& bd) {
    std::vector<double> o(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) o[n * C + c] = double(x[n * C + c]) + bd[c];
    return project(o, R);
  };
  auto expected = numeric_grad(loss, to_double(bias));
  std::vector<float> dbias(C, 1.0f);  // accumulates
  bias_backward(dbias.data(), R.data(), N, C);
  for (auto& e : expected) e += 1.0;
  expect_close(dbias, expected, 1e-5, "dbias");
}

TEST(KernelElementwise, BiasBackwardIndependentOfThreadCount) {
  const int64_t N = 300, C = 700;
  auto d = random_floats(N * C, 6);
  std::vector<float> one(C, 0.0f), two(C, 0.0f);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  bias_backward(one.data(), d.data(), N, C);
  omp_set_num_threads(2);
  bias_backward(two.data(), d.data(), N, C);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(KernelEmbedding, ForwardAndBackwardMatchReference) {
  const int64_t V = 11, P = 9, C = 70, N = 40;
  auto wte = random_floats(V * C, 7), wpe = random_floats(P * C, 8), R = random_floats(N * C, 9);
  std::vector<int32_t> tokens(N), positions(N);
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = int32_t((n * 7 + 3) % V);  // repeated tokens
    positions[n] = int32_t(n % P);
  }
  std::vector<float> out(N * C);
  embedding_forward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(out[n * C + c], wte[tokens[n] * C + c] + wpe[positions[n] * C + c]);

  auto forward = [&](const std::vector<double>& te, const std::vector<double>& pe) {
    std::vector<double> o(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) o[n * C + c] = te[tokens[n] * C + c] + pe[positions[n] * C + c];
    return project(o, R);
  };
  const auto te0 = to_double(wte), pe0 = to_double(wpe);
  auto g_te = numeric_grad([&](const std::vector<double>& te) { return forward(te, pe0); }, te0);
  auto g_pe = numeric_grad([&](const std::vector<double>& pe) { return forward(te0, pe); }, pe0);
  std::vector<float> dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), positions.data(), N, C);
  expect_close(dwte, g_te, 1e-5, "dwte");
  expect_close(dwpe, g_pe, 1e-5, "dwpe");
}

TEST(KernelEmbedding, NoPositionEmbeddingAndThreadIndependence) {
  const int64_t V = 50, C = 768, N = 512;
  auto wte = random_floats(V * C, 10), d = random_floats(N * C, 11);
  std::vector<int32_t> tokens(N);
  for (int64_t n = 0; n < N; ++n) tokens[n] = int32_t((n * n + 5) % V);
  std::vector<float> out(N * C);
  embedding_forward(out.data(), tokens.data(), nullptr, wte.data(), nullptr, N, C);
  for (int64_t n = 0; n < N; ++n) ASSERT_EQ(out[n * C + 5], wte[tokens[n] * C + 5]);
  std::vector<float> one(V * C, 0.0f), two(V * C, 0.0f);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  embedding_backward(one.data(), nullptr, d.data(), tokens.data(), nullptr, N, C);
  omp_set_num_threads(2);
  embedding_backward(two.data(), nullptr, d.data(), tokens.data(), nullptr, N, C);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace lattice
