// Grouped-query attention's layout changes (kernels/gqa.h): gqa_expand gives each head its
// group's query, key and value (checked element by element against the layouts' definitions),
// is the identity without grouping, and gqa_reduce is its adjoint (<expand x, y> = <x, reduce y>
// in double: the gradient of a linear map), summing the key and value gradients in head order.
#include "kernels/gqa.h"

#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::random_floats;
using kernel_test::same_bits;

struct GqaShape {
  int64_t N, G, R, D;
};
void PrintTo(const GqaShape& s, std::ostream* os) {
  *os << "N=" << s.N << " G=" << s.G << " R=" << s.R << " D=" << s.D;
}

class KernelGqa : public ::testing::TestWithParam<GqaShape> {};

TEST_P(KernelGqa, ExpandCopiesEachGroupsVectorsToItsHeads) {
  const auto [N, G, R, D] = GetParam();
  const auto groups = random_floats(size_t(N * G * (R + 2) * D), 1);
  std::vector<float> qkv(size_t(N * G * R * 3 * D), -1.0f);
  gqa_expand(qkv.data(), groups.data(), N, G, R, D);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < G * R; ++h)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t g = h / R, slot = part == 0 ? h % R : R + part - 1;
          ASSERT_EQ(qkv[size_t(((n * G * R + h) * 3 + part) * D + d)],
                    groups[size_t(((n * G + g) * (R + 2) + slot) * D + d)])
              << "n " << n << " head " << h << " part " << part << " d " << d;
        }
}

TEST_P(KernelGqa, ReduceIsTheAdjointOfExpand) {
  const auto [N, G, R, D] = GetParam();
  const auto x = random_floats(size_t(N * G * (R + 2) * D), 2);
  const auto y = random_floats(size_t(N * G * R * 3 * D), 3);
  std::vector<float> ex(y.size()), ry(x.size(), 99.0f);  // written, not accumulated
  gqa_expand(ex.data(), x.data(), N, G, R, D);
  gqa_reduce(ry.data(), y.data(), N, G, R, D);
  double lhs = 0, rhs = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) lhs += double(ex[i]) * y[i];
  for (size_t i = 0; i < x.size(); ++i) {
    rhs += double(x[i]) * ry[i];
    scale += std::fabs(double(x[i]) * ry[i]);
  }
  EXPECT_NEAR(lhs, rhs, 1e-6 * scale);
  // A group's key gradient by hand: its R heads' in order.
  for (int64_t d = 0; d < D; ++d) {
    float s = y[size_t(1 * D + d)];
    for (int64_t r = 1; r < R; ++r) s += y[size_t((r * 3 + 1) * D + d)];
    EXPECT_EQ(ry[size_t(R * D + d)], s) << d;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelGqa,
                         ::testing::Values(GqaShape{3, 2, 3, 5}, GqaShape{2, 1, 4, 8}, GqaShape{4, 3, 1, 4}),
                         [](const auto& info) {
                           const GqaShape& s = info.param;
                           return "N" + std::to_string(s.N) + "G" + std::to_string(s.G) + "R" + std::to_string(s.R) +
                                  "D" + std::to_string(s.D);
                         });

TEST(KernelGqaLayouts, WithoutGroupingBothAreTheIdentity) {
  const int64_t N = 5, H = 4, D = 6;
  const auto x = random_floats(size_t(N * H * 3 * D), 4);
  std::vector<float> a(x.size()), b(x.size());
  gqa_expand(a.data(), x.data(), N, H, 1, D);
  gqa_reduce(b.data(), x.data(), N, H, 1, D);
  EXPECT_TRUE(same_bits(a, x));
  EXPECT_TRUE(same_bits(b, x));
}

// Enough elements for the parallel loops: the bits of the rows done one at a time.
TEST(KernelGqaLayouts, LargeInputsGiveTheRowByRowBits) {
  const int64_t N = 64, G = 4, R = 4, D = 64;
  const auto x = random_floats(size_t(N * G * (R + 2) * D), 5), y = random_floats(size_t(N * G * R * 3 * D), 6);
  std::vector<float> ex(y.size()), ry(x.size());
  gqa_expand(ex.data(), x.data(), N, G, R, D);
  gqa_reduce(ry.data(), y.data(), N, G, R, D);
  for (int64_t n = 0; n < N; n += 21) {
    std::vector<float> e1(static_cast<size_t>(G * R * 3 * D)), r1(static_cast<size_t>(G * (R + 2) * D));
    gqa_expand(e1.data(), x.data() + n * G * (R + 2) * D, 1, G, R, D);
    gqa_reduce(r1.data(), y.data() + n * G * R * 3 * D, 1, G, R, D);
    EXPECT_TRUE(same_bits(e1, std::vector<float>(ex.begin() + n * G * R * 3 * D, ex.begin() + (n + 1) * G * R * 3 * D)));
    EXPECT_TRUE(same_bits(r1, std::vector<float>(ry.begin() + n * G * (R + 2) * D, ry.begin() + (n + 1) * G * (R + 2) * D)));
  }
}

}  // namespace
}  // namespace lattice
