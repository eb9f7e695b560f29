#include <gtest/gtest.h>
#include <omp.h>

#include "kernels/dropout.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::random_floats;

TEST(KernelDropout, KeepsAboutOneMinusPAndScales) {
  const int64_t n = 200000;
  const float p = 0.3f;
  std::vector<float> x(n, 1.0f), out(n);
  PhiloxStream stream{1234, fnv1a32("attn"), 7, 1};
  dropout_forward(out.data(), x.data(), n, p, stream, 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] != 0.0f) {
      ++kept;
      ASSERT_FLOAT_EQ(out[i], 1.0f / (1.0f - p)) << i;
    }
    // The mask is the documented one: uniform(first_index + i) >= p.
    ASSERT_EQ(out[i] != 0.0f, stream.uniform(uint64_t(i)) >= p) << i;
  }
  const double frac = double(kept) / double(n);
  EXPECT_NEAR(frac, 1.0 - p, 0.005);  // ~5 sigma
}

TEST(KernelDropout, BackwardUsesTheSameMaskAndFirstIndexShifts) {
  const int64_t n = 10007;
  const float p = 0.5f;
  const uint64_t first = 123457;  // not a multiple of 4
  auto x = random_floats(n, 1), d = random_floats(n, 2);
  PhiloxStream stream{99, 5, 3, 0};
  std::vector<float> out(n), dx(n);
  dropout_forward(out.data(), x.data(), n, p, stream, first);
  dropout_backward(dx.data(), d.data(), n, p, stream, first);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = stream.uniform(first + uint64_t(i)) >= p;
    ASSERT_EQ(out[i], keep ? x[i] * 2.0f : 0.0f) << i;
    ASSERT_EQ(dx[i], keep ? d[i] * 2.0f : 0.0f) << i;
  }
  // A sub-range with its global offset reproduces the same mask.
  std::vector<float> part(100);
  dropout_forward(part.data(), x.data() + 501, 100, p, stream, first + 501);
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(part[i], out[501 + i]) << i;
}

TEST(KernelDropout, MaskMatchesStreamAcrossCounterCarry) {
  // Philox blocks near 2^32 carry into the counter's high word.
  const uint64_t first = (uint64_t(1) << 34) - 37;
  const int64_t n = 301;
  std::vector<float> x(n, 1.0f), out(n);
  PhiloxStream s{0xDEADBEEFCAFEull, 3, 4, 5};
  dropout_forward(out.data(), x.data(), n, 0.5f, s, first);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i] != 0.0f, s.uniform(first + uint64_t(i)) >= 0.5f) << i;
}

TEST(KernelDropout, DeterministicPerStreamAndDifferentAcrossTags) {
  const int64_t n = 4096;
  std::vector<float> x(n, 1.0f), a(n), b(n), c(n), e(n);
  PhiloxStream s{42, 1, 0, 0};
  dropout_forward(a.data(), x.data(), n, 0.1f, s, 0);
  dropout_forward(b.data(), x.data(), n, 0.1f, s, 0);
  EXPECT_EQ(a, b);
  PhiloxStream t0 = s, t1 = s, other = s;
  t0.tag0 = 1;
  t1.tag1 = 1;
  other.stream = 2;
  dropout_forward(c.data(), x.data(), n, 0.1f, t0, 0);
  dropout_forward(e.data(), x.data(), n, 0.1f, t1, 0);
  EXPECT_NE(a, c);
  EXPECT_NE(a, e);
  EXPECT_NE(c, e);
  dropout_forward(c.data(), x.data(), n, 0.1f, other, 0);
  EXPECT_NE(a, c);
}

TEST(KernelDropout, IndependentOfThreadCount) {
  const int64_t n = 100001;
  auto x = random_floats(n, 3);
  PhiloxStream s{7, 8, 9, 10};
  std::vector<float> one(n), two(n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  dropout_forward(one.data(), x.data(), n, 0.2f, s, 5);
  omp_set_num_threads(2);
  dropout_forward(two.data(), x.data(), n, 0.2f, s, 5);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(KernelDropout, ZeroProbabilityCopiesAndInPlaceWorks) {
  const int64_t n = 1000;
  auto x = random_floats(n, 4);
  std::vector<float> out(n);
  PhiloxStream s{1, 2};
  dropout_forward(out.data(), x.data(), n, 0.0f, s, 0);
  EXPECT_EQ(out, x);
  std::vector<float> y = x, ref(n);
  dropout_forward(ref.data(), x.data(), n, 0.4f, s, 0);
  dropout_forward(y.data(), y.data(), n, 0.4f, s, 0);
  EXPECT_EQ(y, ref);
}

}  // namespace
}  // namespace lattice
