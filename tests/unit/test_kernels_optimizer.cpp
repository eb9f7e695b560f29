#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>

#include "kernels/cast_math.h"
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

// --exp-avg-dtype / --exp-avg-sq-dtype bf16 (AdamwMoments): each step is the fp32 step on the
// stored moments read exactly, the parameter updated with the new moments before rounding, and
// the moments stored rounded to nearest even: bit for bit the fp32 kernel followed by a rounding
// of m and v, for each of the four storage combinations, over several steps and ranges.
TEST(KernelOptimizer, Bf16MomentsAreTheFp32StepWithTheMomentsRounded) {
  const int64_t n = 5000;
  const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  const std::vector<AdamwRange> ranges = {{0, 3000, 0, 1e-3f, 0.1f}, {3000, 2000, 3000, 2e-3f, 0.0f}};
  for (int combo = 1; combo < 4; ++combo) {
    const bool mb = combo & 1, vb = combo & 2;
    std::vector<float> p = random_floats(n, 1), pr = p, mr(n, 0.0f), vr(n, 0.0f);
    std::vector<uint16_t> m16(n, 0), v16(n, 0);
    std::vector<float> m32(n, 0.0f), v32(n, 0.0f);
    const AdamwMoments mo{mb ? static_cast<void*>(m16.data()) : m32.data(), vb ? static_cast<void*>(v16.data())
                                                                             : v32.data(), mb, vb};
    for (int64_t step = 1; step <= 4; ++step) {
      const std::vector<float> g = random_floats(n, uint32_t(20 + step), -0.5f, 0.5f);
      adamw_update_ranges(p.data(), g.data(), mo, ranges.data(), int64_t(ranges.size()), b1, b2, eps, step, 0.75f);
      adamw_update_ranges(pr.data(), g.data(), mr.data(), vr.data(), ranges.data(), int64_t(ranges.size()), b1, b2,
                          eps, step, 0.75f);
      for (int64_t i = 0; i < n; ++i) {
        if (mb) mr[i] = math::round_bf16(mr[i]);
        if (vb) vr[i] = math::round_bf16(vr[i]);
      }
      const std::string what = "combo " + std::to_string(combo) + " step " + std::to_string(step);
      ASSERT_TRUE(same_bits(p, pr)) << "parameters, " << what;
      for (int64_t i = 0; i < n; ++i) {
        const float m = mb ? math::bf16_to_fp32(m16[i]) : m32[i], v = vb ? math::bf16_to_fp32(v16[i]) : v32[i];
        ASSERT_EQ(m, mr[i]) << "m[" << i << "], " << what;
        ASSERT_EQ(v, vr[i]) << "v[" << i << "], " << what;
      }
    }
  }
}

// bf16 moments follow fp32 Adam closely (each step's moments within 2^-8 relative), yet differ.
TEST(KernelOptimizer, Bf16MomentsTrackFp32Adam) {
  const int64_t n = 20000;
  const float lr = 1e-3f;
  std::vector<float> p = random_floats(n, 3), pf = p, mf(n, 0.0f), vf(n, 0.0f);
  std::vector<uint16_t> m16(n, 0), v16(n, 0);
  const AdamwRange all{0, n, 0, lr, 0.1f};
  for (int64_t step = 1; step <= 10; ++step) {
    const std::vector<float> g = random_floats(n, uint32_t(40 + step), -0.5f, 0.5f);
    adamw_update_ranges(p.data(), g.data(), AdamwMoments{m16.data(), v16.data(), true, true}, &all, 1, 0.9f, 0.95f,
                        1e-8f, step);
    adamw_update_ranges(pf.data(), g.data(), mf.data(), vf.data(), &all, 1, 0.9f, 0.95f, 1e-8f, step);
  }
  double max_diff = 0;
  for (int64_t i = 0; i < n; ++i) max_diff = std::max(max_diff, std::fabs(double(p[i]) - pf[i]));
  EXPECT_GT(max_diff, 0.0) << "bf16 moments changed nothing";
  EXPECT_LE(max_diff, 10 * lr * 0.02) << "10 steps of lr, each off by at most a few bf16 ulps of its size";
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
