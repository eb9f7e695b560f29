#include <gtest/gtest.h>
#include <omp.h>

#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::same_bits;
using kernel_test::to_double;

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

// The bias gradient with the output gradient's bf16 cast written in the same pass: the bits
// of bias_backward (accumulated onto what dbias held) and of cast_fp32_to_bf16, with one and
// two threads, C not a multiple of the column chunk.
TEST(KernelElementwise, BiasBackwardCastIsBiasBackwardAndTheCast) {
  const int64_t N = 300, C = 701;
  const auto d = random_floats(N * C, 7, -3.0f, 3.0f), db0 = random_floats(C, 8);
  std::vector<uint16_t> cast_ref(size_t(N * C));
  cast_fp32_to_bf16(cast_ref.data(), d.data(), N * C);
  std::vector<float> db_ref = db0;
  bias_backward(db_ref.data(), d.data(), N, C);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::vector<float> db = db0;
    std::vector<uint16_t> cast(size_t(N * C), 0x7fc1);
    bias_backward_cast_bf16(db.data(), cast.data(), d.data(), N, C);
    EXPECT_TRUE(same_bits(db, db_ref)) << threads << " threads";
    EXPECT_TRUE(same_bits(cast, cast_ref)) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace lattice
