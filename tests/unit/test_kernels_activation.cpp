#include <gtest/gtest.h>

#include <cmath>

#include "kernels/activation.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

double gelu_ref(double x, GeluKind kind) {
  if (kind == GeluKind::erf) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  if (kind == GeluKind::squared_relu) return x > 0 ? x * x : 0.0;
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

class KernelGelu : public ::testing::TestWithParam<GeluKind> {};

TEST_P(KernelGelu, ForwardBackwardMatchReference) {
  const GeluKind kind = GetParam();
  const int64_t n = 2001;
  auto x = random_floats(n, 1, -6.0f, 6.0f), R = random_floats(n, 2);
  x[0] = 0.0f;
  x[1] = -12.0f;
  x[2] = 12.0f;
  x[3] = 1e-4f;
  auto fwd = [&](const std::vector<double>& v) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = gelu_ref(v[i], kind);
    return o;
  };
  std::vector<float> out(n);
  gelu_forward(out.data(), x.data(), n, kind);
  expect_close(out, fwd(to_double(x)), 1e-6, "gelu");

  auto g = numeric_grad([&](const auto& v) { return project(fwd(v), R); }, to_double(x));
  std::vector<float> dx(n);
  gelu_backward(dx.data(), x.data(), R.data(), n, kind);
  expect_close(dx, g, 1e-5, "dgelu");

  // In place (out aliases x, dx aliases dout).
  std::vector<float> y = x, d = R;
  gelu_forward(y.data(), y.data(), n, kind);
  EXPECT_EQ(y, out);
  gelu_backward(d.data(), x.data(), d.data(), n, kind);
  EXPECT_EQ(d, dx);
}

TEST_P(KernelGelu, LargeInputRunsInParallel) {
  const GeluKind kind = GetParam();
  const int64_t n = 100003;
  auto x = random_floats(n, 3, -8.0f, 8.0f);
  std::vector<float> all(n);
  gelu_forward(all.data(), x.data(), n, kind);
  for (int64_t i = 0; i < n; i += 997)
    ASSERT_NEAR(all[i], gelu_ref(x[i], kind), 1e-6 * (1 + std::fabs(x[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Kinds, KernelGelu, ::testing::Values(GeluKind::erf, GeluKind::tanh, GeluKind::squared_relu),
                         [](const auto& info) {
                           return std::string(info.param == GeluKind::erf    ? "Erf"
                                              : info.param == GeluKind::tanh ? "Tanh"
                                                                             : "SquaredRelu");
                         });

}  // namespace
}  // namespace lattice
