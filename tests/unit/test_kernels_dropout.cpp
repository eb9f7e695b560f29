#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::random_floats;
using kernel_test::same_bits;

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

// The fused bias-dropout-add is bias_add, dropout_forward and add_forward one after the
// other, bit for bit: ragged chunks (N*C not a multiple of the 2048-element chunk, C not
// dividing it), a first index inside a Philox block, p = 0 (no mask), no bias, in place
// on the residual, and several thread counts.
// A row-parallel layer's output and bias gradients from the residual stream's gradient in
// one pass: the bits of dropout_backward, then bias_backward_cast_bf16 (dbias accumulated
// onto what it held), for an unaligned first index, C not a multiple of the column chunk,
// one and two threads, and p = 0.
TEST(KernelDropout, BackwardBiasCastIsDropoutBackwardThenBiasBackwardCast) {
  const int64_t N = 150, C = 203;
  const auto dout = random_floats(size_t(N * C), 21, -2.0f, 2.0f), db0 = random_floats(size_t(C), 22);
  const PhiloxStream stream{99, 5, 3, 1};
  const int saved = omp_get_max_threads();
  for (float p : {0.1f, 0.0f})
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> dx(dout.size()), db_ref = db0, db = db0;
      std::vector<uint16_t> cast_ref(dout.size()), cast(dout.size(), 0x7fc1);
      dropout_backward(dx.data(), dout.data(), N * C, p, stream, 7);
      bias_backward_cast_bf16(db_ref.data(), cast_ref.data(), dx.data(), N, C);
      dropout_backward_bias_cast_bf16(db.data(), cast.data(), dout.data(), N, C, p, stream, 7);
      EXPECT_TRUE(same_bits(db, db_ref)) << "p=" << p << ", " << threads << " threads";
      EXPECT_TRUE(same_bits(cast, cast_ref)) << "p=" << p << ", " << threads << " threads";
    }
  omp_set_num_threads(saved);
}

TEST(KernelDropout, BiasDropoutAddIsTheThreeKernelsBitForBit) {
  struct Case {
    int64_t N, C;
    float p;
    uint64_t first;
    bool bias, in_place;
  };
  const PhiloxStream stream{99, fnv1a32("mlp.dropout"), 4, 2};
  const int threads_before = omp_get_max_threads();
  for (const Case k : {Case{37, 77, 0.1f, 5, true, false}, Case{300, 96, 0.5f, 0, true, true},
                       Case{9, 33, 0.0f, 3, true, false}, Case{50, 64, 0.2f, 1, false, false}}) {
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const int64_t n = k.N * k.C;
      const auto y = random_floats(size_t(n), 1, -3.0f, 3.0f);
      const auto residual = random_floats(size_t(n), 2, -1.0f, 1.0f);
      const auto bias = random_floats(size_t(k.C), 3, -0.5f, 0.5f);
      // Unfused.
      std::vector<float> t = y, ref(static_cast<size_t>(n));
      if (k.bias) bias_add(t.data(), bias.data(), k.N, k.C);
      dropout_forward(t.data(), t.data(), n, k.p, stream, k.first);
      add_forward(ref.data(), residual.data(), t.data(), n);
      // Fused.
      std::vector<float> out = k.in_place ? residual : std::vector<float>(static_cast<size_t>(n), 7.0f);
      bias_dropout_add_forward(out.data(), k.in_place ? out.data() : residual.data(), y.data(),
                               k.bias ? bias.data() : nullptr, k.N, k.C, k.p, stream, k.first);
      ASSERT_EQ(0, std::memcmp(out.data(), ref.data(), size_t(n) * sizeof(float)))
          << "N=" << k.N << " C=" << k.C << " p=" << k.p << " threads=" << threads;
      if (k.p > 0.0f) {
        // The case tests something: some elements dropped (out == residual), most kept.
        int64_t dropped = 0;
        for (int64_t i = 0; i < n; ++i) dropped += out[size_t(i)] == residual[size_t(i)];
        EXPECT_GT(dropped, 0);
        EXPECT_LT(dropped, n);
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// The MoE router's input jitter: factors uniform in [1 - eps, 1 + eps) from the documented draws,
// with mean 1; the backward accumulates the same factors; sub-ranges and thread counts change nothing.
TEST(KernelInputJitter, FactorsAreTheDocumentedUniformDraws) {
  const int64_t n = 200003;
  const float eps = 0.25f;
  const uint64_t first = 4097;  // not a multiple of 4
  PhiloxStream stream{31, fnv1a32("jitter"), 4, 2};
  std::vector<float> ones(size_t(n), 1.0f), f(static_cast<size_t>(n));
  input_jitter_forward(f.data(), ones.data(), n, eps, stream, first);
  double sum = 0.0;
  float lo = 2.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float u = stream.uniform(first + uint64_t(i));
    ASSERT_EQ(f[size_t(i)], std::fma(2.0f * eps, u, 1.0f - eps)) << i;
    lo = std::min(lo, f[size_t(i)]);
    hi = std::max(hi, f[size_t(i)]);
    sum += f[size_t(i)];
  }
  EXPECT_GE(lo, 1.0f - eps);
  EXPECT_LT(hi, 1.0f + eps);
  EXPECT_LT(lo, 1.0f - eps + 1e-3f);  // the whole range is drawn
  EXPECT_GT(hi, 1.0f + eps - 1e-3f);
  EXPECT_NEAR(sum / double(n), 1.0, 5 * eps / std::sqrt(3.0 * double(n)));  // 5 sigma
  // eps 0: the identity.
  std::vector<float> x = random_floats(size_t(n), 4), same(static_cast<size_t>(n));
  input_jitter_forward(same.data(), x.data(), n, 0.0f, stream, first);
  EXPECT_EQ(same, x);
}

TEST(KernelInputJitter, BackwardAccumulatesTheSameFactors) {
  const int64_t n = 10007;
  const float eps = 0.1f;
  const uint64_t first = 123457;
  PhiloxStream stream{99, 5, 3, 0};
  auto x = random_floats(size_t(n), 1), d = random_floats(size_t(n), 2), acc = random_floats(size_t(n), 3);
  std::vector<float> out(static_cast<size_t>(n)), dx = acc;
  input_jitter_forward(out.data(), x.data(), n, eps, stream, first);
  input_jitter_backward(dx.data(), d.data(), n, eps, stream, first);
  for (int64_t i = 0; i < n; ++i) {
    const float f = jitter_factor(stream.u32(first + uint64_t(i)), eps);
    ASSERT_EQ(out[size_t(i)], x[size_t(i)] * f) << i;
    ASSERT_EQ(dx[size_t(i)], std::fma(d[size_t(i)], f, acc[size_t(i)])) << i;
  }
  // A sub-range with its global offset draws the same factors; in place works.
  std::vector<float> part(x.begin() + 501, x.begin() + 601);
  input_jitter_forward(part.data(), part.data(), 100, eps, stream, first + 501);
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(part[size_t(i)], out[size_t(501 + i)]) << i;
  // Other threads, the same bits.
  const int saved = omp_get_max_threads();
  std::vector<float> one(static_cast<size_t>(n)), two(static_cast<size_t>(n));
  omp_set_num_threads(1);
  input_jitter_forward(one.data(), x.data(), n, eps, stream, first);
  omp_set_num_threads(2);
  input_jitter_forward(two.data(), x.data(), n, eps, stream, first);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, out);
}

}  // namespace
}  // namespace lattice
