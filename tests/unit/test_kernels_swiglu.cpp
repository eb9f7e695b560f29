// SwiGLU kernels (kernels/swiglu.h): the forward against a double-precision silu(g) u, the
// backward against finite differences of it, in place; the unit's other forms (quick GELU, the
// up projection's offset, the clamps: GPT-OSS's) the same way; the bf16 forms against the fp32 forms
// bit for bit (the bf16 storage path of the model relies on it), at widths that are and are
// not a multiple of the CPU's column chunk, and the parallel path against one row at a time.
#include "kernels/swiglu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <vector>

#include "kernels/cast_math.h"
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

// out[n, j] = silu(y[n, j] + b[j]) (y[n, F + j] + b[F + j]) in double.
std::vector<double> swiglu_ref(const std::vector<double>& y, const std::vector<double>& b, int64_t N, int64_t F) {
  std::vector<double> out(size_t(N * F));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j) {
      const double g = y[size_t(n * 2 * F + j)] + (b.empty() ? 0.0 : b[size_t(j)]);
      const double u = y[size_t(n * 2 * F + F + j)] + (b.empty() ? 0.0 : b[size_t(F + j)]);
      out[size_t(n * F + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = math::fp32_to_bf16(v[i]);
  return o;
}

std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = math::bf16_to_fp32(v[i]);
  return o;
}

class KernelSwiglu : public ::testing::TestWithParam<int64_t> {};  // F

TEST_P(KernelSwiglu, ForwardAndBackwardMatchDoubleAndFiniteDifferences) {
  const int64_t N = 5, F = GetParam();
  auto y = random_floats(size_t(N * 2 * F), 1, -5.0f, 5.0f), b = random_floats(size_t(2 * F), 2);
  auto R = random_floats(size_t(N * F), 3);
  y[0] = 0.0f;
  y[1] = -40.0f;  // sigmoid 0: silu and its derivative vanish
  y[2] = 40.0f;   // sigmoid 1
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const std::vector<double> bd = with_bias ? to_double(b) : std::vector<double>{};
    std::vector<float> pre(y.size()), out(size_t(N * F));
    bias_swiglu_forward(pre.data(), out.data(), y.data(), with_bias ? b.data() : nullptr, N, F, Rounding::none);
    expect_close(out, swiglu_ref(to_double(y), bd, N, F), 1e-6, "swiglu");
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(pre[i], y[i] + (with_bias ? b[i % size_t(2 * F)] : 0.0f)) << "pre " << i;

    const auto g = numeric_grad([&](const auto& v) { return project(swiglu_ref(v, bd, N, F), R); }, to_double(y));
    std::vector<float> dx(y.size());
    swiglu_backward(dx.data(), pre.data(), R.data(), N, F);
    expect_close(dx, g, 1e-5, "dswiglu");

    // In place: pre in y's buffer, then dx in pre's.
    std::vector<float> buf = y, out2(out.size());
    bias_swiglu_forward(buf.data(), out2.data(), buf.data(), with_bias ? b.data() : nullptr, N, F, Rounding::none);
    EXPECT_TRUE(same_bits(buf, pre));
    EXPECT_TRUE(same_bits(out2, out));
    swiglu_backward(buf.data(), buf.data(), R.data(), N, F);
    EXPECT_TRUE(same_bits(buf, dx));
  }
}

TEST_P(KernelSwiglu, RoundingAsReadIsRoundingFirst) {
  const int64_t N = 4, F = GetParam();
  const auto y = random_floats(size_t(N * 2 * F), 4, -3.0f, 3.0f), b = random_floats(size_t(2 * F), 5);
  const auto d = random_floats(size_t(N * F), 6);
  std::vector<float> yr = y, dr = d;
  round_to(yr.data(), yr.data(), int64_t(yr.size()), Rounding::bf16);
  round_to(dr.data(), dr.data(), int64_t(dr.size()), Rounding::bf16);
  std::vector<float> pre(y.size()), out(size_t(N * F)), pre_r(y.size()), out_r(size_t(N * F));
  bias_swiglu_forward(pre.data(), out.data(), y.data(), b.data(), N, F, Rounding::bf16);
  bias_swiglu_forward(pre_r.data(), out_r.data(), yr.data(), b.data(), N, F, Rounding::none);
  EXPECT_TRUE(same_bits(pre, pre_r));
  EXPECT_TRUE(same_bits(out, out_r));
  std::vector<float> dx(y.size()), dx_r(y.size());
  swiglu_backward(dx.data(), pre.data(), d.data(), N, F, Rounding::bf16);
  swiglu_backward(dx_r.data(), pre.data(), dr.data(), N, F, Rounding::none);
  EXPECT_TRUE(same_bits(dx, dx_r));
}

// The bf16 path: fc1's bf16 GEMM result in, bf16 out; the gradient's bf16 cast and the bias
// gradient bias_backward gives on the fp32 gradient (accumulated onto what dbias held).
TEST_P(KernelSwiglu, Bf16FormsGiveTheFp32FormsBits) {
  const int64_t N = 9, F = GetParam();
  const auto y16 = to_bf16(random_floats(size_t(N * 2 * F), 7, -4.0f, 4.0f));
  const auto d16 = to_bf16(random_floats(size_t(N * F), 8));
  const auto b = random_floats(size_t(2 * F), 9);
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const float* bias = with_bias ? b.data() : nullptr;
    std::vector<float> pre(y16.size()), out(size_t(N * F));
    bias_swiglu_forward(pre.data(), out.data(), widen(y16).data(), bias, N, F, Rounding::none);
    std::vector<uint16_t> out16(size_t(N * F));
    bias_swiglu_forward_packed(out16.data(), y16.data(), bias, N, F);
    EXPECT_TRUE(same_bits(out16, to_bf16(out)));

    std::vector<float> dx(y16.size());
    swiglu_backward(dx.data(), pre.data(), widen(d16).data(), N, F);
    std::vector<float> dbias_want(size_t(2 * F), 0.25f), dbias(size_t(2 * F), 0.25f);
    bias_backward(dbias_want.data(), dx.data(), N, 2 * F);
    std::vector<uint16_t> dx16 = y16;  // in place of y
    bias_swiglu_backward_packed_dbias(dx16.data(), dbias.data(), dx16.data(), bias, d16.data(), N, F);
    EXPECT_TRUE(same_bits(dx16, to_bf16(dx)));
    EXPECT_TRUE(same_bits(dbias, dbias_want));
  }
}

// The gated unit's forms: quick GELU's alpha, the offset, the clamps (torch.clamp's gradient: none
// where the clamp holds the value), each alone and together, against a double-precision reference
// and its finite differences; the bf16 forms give the fp32 forms' bits.
struct GluCase {
  const char* name;
  GluForm form;
};
void PrintTo(const GluCase& c, std::ostream* os) { *os << c.name; }

// Megatron's glu in double: act(min(g, c)) (clamp(u, -c, c) + offset), act(x) = x sigmoid(alpha x).
std::vector<double> glu_ref(const std::vector<double>& y, int64_t N, int64_t F, const GluForm& f) {
  std::vector<double> out(size_t(N * F));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j) {
      double g = y[size_t(n * 2 * F + j)], u = y[size_t(n * 2 * F + F + j)];
      if (f.clamp > 0) {
        g = std::min(g, double(f.clamp));
        u = std::clamp(u, -double(f.clamp), double(f.clamp));
      }
      out[size_t(n * F + j)] = g / (1.0 + std::exp(-double(f.alpha) * g)) * (u + double(f.linear_offset));
    }
  return out;
}

class KernelGluForms : public ::testing::TestWithParam<GluCase> {};

TEST_P(KernelGluForms, ForwardAndBackwardMatchDoubleAndFiniteDifferences) {
  const GluForm f = GetParam().form;
  const int64_t N = 6, F = 37;
  auto y = random_floats(size_t(N * 2 * F), 21, -4.0f, 4.0f);
  const auto R = random_floats(size_t(N * F), 22);
  if (f.clamp > 0)  // away from the clamps' corners, where the difference quotient straddles them
    for (float& v : y)
      if (std::fabs(std::fabs(v) - f.clamp) < 0.01f) v += 0.05f;
  std::vector<float> pre(y.size()), out(size_t(N * F)), dx(y.size());
  bias_swiglu_forward(pre.data(), out.data(), y.data(), nullptr, N, F, Rounding::none, f);
  expect_close(out, glu_ref(to_double(y), N, F, f), 1e-6, "glu");
  swiglu_backward(dx.data(), pre.data(), R.data(), N, F, Rounding::none, f);
  const auto g = numeric_grad([&](const auto& v) { return project(glu_ref(v, N, F, f), R); }, to_double(y));
  expect_close(dx, g, 1e-5, "dglu");
  if (f.clamp > 0) {  // some values held by each clamp, their gradients exactly 0
    int64_t held_g = 0, held_u = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < F; ++j) {
        const size_t at = size_t(n * 2 * F + j);
        if (y[at] > f.clamp) held_g += dx[at] == 0.0f;
        if (std::fabs(y[at + size_t(F)]) > f.clamp) held_u += dx[at + size_t(F)] == 0.0f;
      }
    EXPECT_GT(held_g, 10);
    EXPECT_GT(held_u, 10);
  }

  const auto y16 = to_bf16(y), d16 = to_bf16(R);
  const auto b = random_floats(size_t(2 * F), 23);
  std::vector<float> pre16(y.size()), out32(size_t(N * F)), dx32(y.size()), dbias_want(size_t(2 * F), 0.0f),
      dbias(size_t(2 * F), 0.0f);
  bias_swiglu_forward(pre16.data(), out32.data(), widen(y16).data(), b.data(), N, F, Rounding::none, f);
  std::vector<uint16_t> out16(size_t(N * F)), dx16(y16.size());
  bias_swiglu_forward_packed(out16.data(), y16.data(), b.data(), N, F, f);
  EXPECT_TRUE(same_bits(out16, to_bf16(out32)));
  swiglu_backward(dx32.data(), pre16.data(), widen(d16).data(), N, F, Rounding::none, f);
  bias_backward(dbias_want.data(), dx32.data(), N, 2 * F);
  bias_swiglu_backward_packed_dbias(dx16.data(), dbias.data(), y16.data(), b.data(), d16.data(), N, F, f);
  EXPECT_TRUE(same_bits(dx16, to_bf16(dx32)));
  EXPECT_TRUE(same_bits(dbias, dbias_want));
}

INSTANTIATE_TEST_SUITE_P(Forms, KernelGluForms,
                         ::testing::Values(GluCase{"quick_gelu", {kQuickGeluAlpha, 0.0f, 0.0f}},
                                           GluCase{"offset", {1.0f, 1.0f, 0.0f}},
                                           GluCase{"clamp", {1.0f, 0.0f, 1.5f}},
                                           GluCase{"gpt_oss", {kQuickGeluAlpha, 1.0f, 1.5f}}),
                         [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(Widths, KernelSwiglu, ::testing::Values(int64_t(1), int64_t(37), int64_t(130)),
                         [](const auto& info) { return "F" + std::to_string(info.param); });

// Enough elements for the parallel loops: the same bits as the rows computed one at a time.
TEST(KernelSwigluParallel, LargeInputsGiveTheRowByRowBits) {
  const int64_t N = 97, F = 400;
  const auto y = random_floats(size_t(N * 2 * F), 10, -4.0f, 4.0f), b = random_floats(size_t(2 * F), 11);
  const auto d = random_floats(size_t(N * F), 12);
  std::vector<float> pre(y.size()), out(size_t(N * F)), dx(y.size());
  bias_swiglu_forward(pre.data(), out.data(), y.data(), b.data(), N, F, Rounding::bf16);
  swiglu_backward(dx.data(), pre.data(), d.data(), N, F, Rounding::bf16);
  for (int64_t n = 0; n < N; n += 31) {
    std::vector<float> p1(static_cast<size_t>(2 * F)), o1(static_cast<size_t>(F)), x1(static_cast<size_t>(2 * F));
    bias_swiglu_forward(p1.data(), o1.data(), y.data() + n * 2 * F, b.data(), 1, F, Rounding::bf16);
    swiglu_backward(x1.data(), p1.data(), d.data() + n * F, 1, F, Rounding::bf16);
    EXPECT_TRUE(same_bits(o1, std::vector<float>(out.begin() + n * F, out.begin() + (n + 1) * F))) << n;
    EXPECT_TRUE(same_bits(x1, std::vector<float>(dx.begin() + n * 2 * F, dx.begin() + (n + 1) * 2 * F))) << n;
  }
  const auto y16 = to_bf16(y), d16 = to_bf16(d);
  std::vector<uint16_t> o16(size_t(N * F)), dx16(y16.size());
  bias_swiglu_forward_packed(o16.data(), y16.data(), b.data(), N, F);
  std::vector<float> pre16(y.size()), out16(size_t(N * F)), dxw(y.size()), dbias_want(size_t(2 * F), 0.0f),
      dbias(size_t(2 * F), 0.0f);
  bias_swiglu_forward(pre16.data(), out16.data(), widen(y16).data(), b.data(), N, F, Rounding::none);
  EXPECT_TRUE(same_bits(o16, to_bf16(out16)));
  swiglu_backward(dxw.data(), pre16.data(), widen(d16).data(), N, F);
  bias_backward(dbias_want.data(), dxw.data(), N, 2 * F);
  bias_swiglu_backward_packed_dbias(dx16.data(), dbias.data(), y16.data(), b.data(), d16.data(), N, F);
  EXPECT_TRUE(same_bits(dx16, to_bf16(dxw)));
  EXPECT_TRUE(same_bits(dbias, dbias_want));
}

}  // namespace
}  // namespace lattice
