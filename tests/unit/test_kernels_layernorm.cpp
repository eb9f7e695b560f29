#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "kernels/cast_math.h"
#include "kernels/layernorm.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

std::vector<double> layernorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int64_t N, int64_t C, double eps) {
  std::vector<double> out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) mean += x[n * C + c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    var /= double(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - mean) * rstd * w[c] + b[c];
  }
  return out;
}

TEST(KernelLayerNorm, ForwardBackwardMatchFiniteDifferences) {
  const int64_t N = 6, C = 37;  // C not a multiple of the vector width
  const float eps = 1e-5f;
  auto x = random_floats(N * C, 1, -2.0f, 3.0f), w = random_floats(C, 2, 0.5f, 1.5f);
  auto b = random_floats(C, 3), R = random_floats(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
  expect_close(out, layernorm_ref(xd, wd, bd, N, C, eps), 2e-6, "out");

  auto gx = numeric_grad([&](const auto& v) { return project(layernorm_ref(v, wd, bd, N, C, eps), R); }, xd);
  auto gw = numeric_grad([&](const auto& v) { return project(layernorm_ref(xd, v, bd, N, C, eps), R); }, wd);
  auto gb = numeric_grad([&](const auto& v) { return project(layernorm_ref(xd, wd, v, N, C, eps), R); }, bd);
  // All three accumulate: start from known values.
  std::vector<float> dx(N * C, 0.25f), dw(C, -1.0f), db(C, 2.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  for (auto& g : gx) g += 0.25;
  for (auto& g : gw) g -= 1.0;
  for (auto& g : gb) g += 2.0;
  expect_close(dx, gx, 1e-4, "dx");
  expect_close(dw, gw, 1e-4, "dw");
  expect_close(db, gb, 1e-4, "db");
}

// RMSNorm: x / sqrt(mean(x^2) + eps) * w, in double.
std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int64_t N, int64_t C,
                                double eps) {
  std::vector<double> out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sq += x[n * C + c] * x[n * C + c];
    const double rstd = 1.0 / std::sqrt(sq / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * rstd * w[c];
  }
  return out;
}

TEST(KernelLayerNorm, RmsNormForwardBackwardMatchFiniteDifferences) {
  const int64_t N = 6, C = 37;
  const float eps = 1e-5f;
  auto x = random_floats(N * C, 11, -2.0f, 3.0f), w = random_floats(C, 12, 0.5f, 1.5f), R = random_floats(N * C, 14);
  const std::vector<float> zeros(size_t(C), 0.0f);  // RMSNorm has no bias: the model passes zeros
  std::vector<float> out(N * C), mean(N, -1.0f), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), zeros.data(), N, C, eps,
                    Normalization::rmsnorm);
  const auto xd = to_double(x), wd = to_double(w);
  expect_close(out, rmsnorm_ref(xd, wd, N, C, eps), 2e-6, "out");
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(mean[size_t(n)], 0.0f) << "row " << n << ": RMSNorm saves mean 0";
  std::vector<uint16_t> out16(N * C);  // the bf16 form: the same values, rounded
  layernorm_forward_bf16(out16.data(), mean.data(), rstd.data(), x.data(), w.data(), zeros.data(), N, C, eps,
                         Normalization::rmsnorm);
  for (size_t i = 0; i < out16.size(); ++i) ASSERT_EQ(out16[i], math::fp32_to_bf16(out[i])) << i;

  auto gx = numeric_grad([&](const auto& v) { return project(rmsnorm_ref(v, wd, N, C, eps), R); }, xd);
  auto gw = numeric_grad([&](const auto& v) { return project(rmsnorm_ref(xd, v, N, C, eps), R); }, wd);
  std::vector<float> dx(N * C, 0.25f), dw(C, -1.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C,
                     {}, Normalization::rmsnorm);
  for (auto& g : gx) g += 0.25;
  for (auto& g : gw) g -= 1.0;
  expect_close(dx, gx, 1e-4, "dx");
  expect_close(dw, gw, 1e-4, "dw");
  // And differs from LayerNorm's (the mean terms matter on this data).
  std::vector<float> ln_out(N * C), ln_mean(N), ln_rstd(N);
  layernorm_forward(ln_out.data(), ln_mean.data(), ln_rstd.data(), x.data(), w.data(), zeros.data(), N, C, eps);
  double diff = 0;
  for (size_t i = 0; i < out.size(); ++i) diff = std::max(diff, std::fabs(double(out[i]) - ln_out[i]));
  EXPECT_GT(diff, 1e-2);
}

TEST(KernelLayerNorm, LargeMeanIsStable) {
  const int64_t N = 2, C = 768;
  auto x = random_floats(N * C, 5, 999.0f, 1001.0f);
  std::vector<float> w(C, 1.0f), b(C, 0.0f), out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  const auto ref = layernorm_ref(to_double(x), to_double(w), to_double(b), N, C, 1e-5);
  expect_close(out, ref, 5e-4, "out");
}

TEST(KernelLayerNorm, BackwardIndependentOfThreadCount) {
  const int64_t N = 128, C = 768;
  auto x = random_floats(N * C, 6), w = random_floats(C, 7), b = random_floats(C, 8);
  auto d = random_floats(N * C, 9);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    dx.insert(dx.end(), dw.begin(), dw.end());
    dx.insert(dx.end(), db.begin(), db.end());
    return dx;
  };
  const int saved = omp_get_max_threads();
  auto one = run(1), two = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

}  // namespace
}  // namespace lattice
