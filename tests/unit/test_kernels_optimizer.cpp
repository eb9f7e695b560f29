#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/optimizer.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::random_floats;
using kernel_test::same_bits;
using kernel_test::to_double;

TEST(KernelOptimizer, AdamWMatchesDoubleReferenceOverSteps) {
  const int64_t n = 40000;
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  auto p = random_floats(n, 1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto pd = to_double(p);
  std::vector<double> md(n, 0.0), vd(n, 0.0);
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = random_floats(n, uint32_t(10 + step), -0.5f, 0.5f);
    g[0] = 0.0f;  // a zero gradient: only decay moves the parameter
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
    const double bc1 = 1.0 - std::pow(double(b1), double(step));
    const double bc2 = 1.0 - std::pow(double(b2), double(step));
    for (int64_t i = 0; i < n; ++i) {
      pd[i] -= double(lr) * double(wd) * pd[i];
      md[i] = double(b1) * md[i] + (1.0 - double(b1)) * g[i];
      vd[i] = double(b2) * vd[i] + (1.0 - double(b2)) * double(g[i]) * g[i];
      pd[i] -= double(lr) * (md[i] / bc1) / (std::sqrt(vd[i] / bc2) + double(eps));
    }
  }
  expect_close(p, pd, 2e-6, "p");
  expect_close(m, md, 2e-6, "m");
  expect_close(v, vd, 2e-6, "v");
}

TEST(KernelOptimizer, AdamWFirstStepMovesByLr) {
  // With no decay, the first step moves every parameter by ~lr * sign(g).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 1e-3f}, m(3, 0.0f), v(3, 0.0f);
  adamw_update(p.data(), g.data(), m.data(), v.data(), 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], -1.99f, 1e-6);
  EXPECT_NEAR(p[2], 0.49f, 1e-5);
}

TEST(KernelOptimizer, SgdMomentumMatchesDoubleReference) {
  const int64_t n = 30000;
  const float lr = 0.05f, mom = 0.9f, wd = 0.01f;
  auto p = random_floats(n, 2);
  std::vector<float> buf(n, 123.0f);  // ignored on the first step
  auto pd = to_double(p);
  std::vector<double> bd(n, 0.0);
  for (int step = 1; step <= 4; ++step) {
    auto g = random_floats(n, uint32_t(20 + step));
    sgd_update(p.data(), g.data(), buf.data(), n, lr, mom, wd, step == 1);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) + double(wd) * pd[i];
      bd[i] = step == 1 ? gi : double(mom) * bd[i] + gi;
      pd[i] -= double(lr) * bd[i];
    }
  }
  expect_close(p, pd, 1e-5, "p");
  expect_close(buf, bd, 1e-5, "buf");
}

// Gradient clipping's coefficient applied as the update reads the gradients: the bits of
// scaling them in place first (scale_inplace), g left as it was; for both optimizers, on a
// length that is not a multiple of the kernel's chunk, with one and two threads.
TEST(KernelOptimizer, GradScaleGivesTheBitsOfScaledGradients) {
  const int64_t n = 40001;
  const float scale = 0.3719f;
  const auto g = random_floats(n, 5, -2.0f, 2.0f), p0 = random_floats(n, 6);
  const auto m0 = random_floats(n, 7, -0.1f, 0.1f), v0 = random_floats(n, 8, 0.0f, 0.01f);
  auto scaled = g;
  scale_inplace(scaled.data(), scale, n);
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const std::string what = std::to_string(threads) + " threads";
    auto p = p0, m = m0, v = v0, pr = p0, mr = m0, vr = v0, gin = g;
    adamw_update(p.data(), gin.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, scale);
    adamw_update(pr.data(), scaled.data(), mr.data(), vr.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    EXPECT_TRUE(same_bits(p, pr) && same_bits(m, mr) && same_bits(v, vr)) << "adamw, " << what;
    EXPECT_TRUE(same_bits(gin, g)) << "adamw changed g, " << what;
    for (float momentum : {0.0f, 0.9f}) {
      auto ps = p0, buf = m0, psr = p0, bufr = m0;
      float* b = momentum != 0.0f ? buf.data() : nullptr;
      float* br = momentum != 0.0f ? bufr.data() : nullptr;
      sgd_update(ps.data(), gin.data(), b, n, 0.05f, momentum, 0.01f, false, scale);
      sgd_update(psr.data(), scaled.data(), br, n, 0.05f, momentum, 0.01f, false);
      EXPECT_TRUE(same_bits(ps, psr) && same_bits(buf, bufr)) << "sgd momentum " << momentum << ", " << what;
    }
    // And a scale of 1 is no scaling at all.
    auto p1 = p0, m1 = m0, v1 = v0, p1r = p0, m1r = m0, v1r = v0;
    adamw_update(p1.data(), g.data(), m1.data(), v1.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 1.0f);
    adamw_update(p1r.data(), g.data(), m1r.data(), v1r.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    EXPECT_TRUE(same_bits(p1, p1r) && same_bits(m1, m1r) && same_bits(v1, v1r)) << what;
    // The scale does change the update (the test could fail).
    EXPECT_FALSE(same_bits(p, p1)) << what;
  }
  omp_set_num_threads(2);
}

TEST(KernelOptimizer, SgdWithoutMomentum) {
  std::vector<float> p = {1.0f, 2.0f}, g = {0.5f, -1.0f};
  sgd_update(p.data(), g.data(), nullptr, 2, 0.1f, 0.0f, 0.0f, true);
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], 2.1f);
}

TEST(KernelOptimizer, SumOfSquaresIsDoubleAndThreadIndependent) {
  const int64_t n = 1000003;
  auto x = random_floats(n, 3);
  double ref = 0.0;
  for (float v : x) ref += double(v) * double(v);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_of_squares(x.data(), n);
  omp_set_num_threads(2);
  const double two = sum_of_squares(x.data(), n);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, ref, 1e-9 * ref);
  EXPECT_EQ(sum_of_squares(x.data(), 0), 0.0);
  const float big[2] = {1e20f, 1e20f};  // would overflow a float accumulator
  EXPECT_DOUBLE_EQ(sum_of_squares(big, 2), 2.0 * double(1e20f) * double(1e20f));
}

}  // namespace
}  // namespace lattice
