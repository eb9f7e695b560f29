// fp32 <-> bf16 / fp16 rounding and fp8 quantization against hand-computed values:
// ties to even, overflow, infinities, NaN, subnormals, saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast.h"

namespace lattice {
namespace {

float f_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CastBf16, HandValues) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflow -> inf
  EXPECT_EQ(fp32_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-kInf), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(f_of(0x7f800001)))));  // signalling-pattern NaN stays NaN
  EXPECT_EQ(fp32_to_bf16(f_of(0x00018000)), 0x0002);  // subnormal tie -> even
  EXPECT_EQ(fp32_to_bf16(f_of(0x00010001)), 0x0001);
  EXPECT_EQ(bf16_to_fp32(0x3fc0), 1.5f);
}

TEST(CastBf16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float x = bf16_to_fp32(uint16_t(b));
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp32_to_bf16(x), b) << std::hex << b;
  }
}

TEST(CastFp16, HandValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // tie with 65536 -> even = inf
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-kInf), 0xfc00);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(kNaN))));
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);             // smallest normal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);             // tie with 0 -> 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);             // 1.5 units: tie -> 2
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -30)), 0x8000);            // underflow keeps the sign
  EXPECT_EQ(fp32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);          // rounds up into the normals
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x7c00), kInf);
}

TEST(CastFp16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = fp16_to_fp32(uint16_t(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(fp32_to_fp16(x), h) << std::hex << h;
  }
}

TEST(CastFp8, E4m3HandValues) {
  const auto q = [](float x) { return fp8_quantize(x, 1.0f, Fp8Format::e4m3); };
  EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(q(1.0f), 1.0f);
  EXPECT_EQ(q(1.0625f), 1.0f);   // tie between 1 and 1.125 -> even
  EXPECT_EQ(q(1.1875f), 1.25f);  // tie between 1.125 and 1.25 -> even
  EXPECT_EQ(q(1.2f), 1.25f);
  EXPECT_EQ(q(-3.3f), -3.25f);
  EXPECT_EQ(q(448.0f), 448.0f);
  EXPECT_EQ(q(470.0f), 448.0f);  // saturates
  EXPECT_EQ(q(1e9f), 448.0f);
  EXPECT_EQ(q(kInf), 448.0f);
  EXPECT_EQ(q(-kInf), -448.0f);
  EXPECT_TRUE(std::isnan(q(kNaN)));
  EXPECT_EQ(q(std::ldexp(1.0f, -9)), std::ldexp(1.0f, -9));    // smallest subnormal
  EXPECT_EQ(q(std::ldexp(1.0f, -10)), 0.0f);                   // tie with 0 -> 0
  EXPECT_EQ(q(std::ldexp(3.0f, -10)), std::ldexp(2.0f, -9));   // 1.5 units -> 2
  EXPECT_EQ(q(std::ldexp(7.5f, -9)), std::ldexp(1.0f, -6));    // largest subnormal + half -> min normal
  EXPECT_EQ(q(std::ldexp(5.2f, -9)), std::ldexp(5.0f, -9));
  EXPECT_EQ(fp8_quantize(1.0f, 2.0f, Fp8Format::e4m3), 2.0f);  // the scale multiplies first
  EXPECT_EQ(fp8_quantize(300.0f, 2.0f, Fp8Format::e4m3), 448.0f);
}

TEST(CastFp8, E5m2HandValues) {
  const auto q = [](float x) { return fp8_quantize(x, 1.0f, Fp8Format::e5m2); };
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);
  EXPECT_EQ(q(1.125f), 1.0f);  // tie between 1 and 1.25 -> even
  EXPECT_EQ(q(1.375f), 1.5f);  // tie between 1.25 and 1.5 -> even
  EXPECT_EQ(q(57344.0f), 57344.0f);
  EXPECT_EQ(q(61440.0f), 57344.0f);
  EXPECT_EQ(q(-kInf), -57344.0f);
  EXPECT_EQ(q(std::ldexp(1.0f, -16)), std::ldexp(1.0f, -16));  // smallest subnormal
  EXPECT_EQ(q(std::ldexp(1.0f, -17)), 0.0f);
  EXPECT_EQ(q(std::ldexp(1.0f, -15) * 1.25f), std::ldexp(1.0f, -15));  // subnormal step 2^-16: 2.5 units -> 2
}

// Every value of the grid maps to itself, and a point just inside a neighbour's half
// interval goes to that neighbour.
TEST(CastFp8, GridIsFixedAndNearest) {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const int mbits = f == Fp8Format::e4m3 ? 3 : 2, emin = f == Fp8Format::e4m3 ? -6 : -14;
    std::vector<float> grid;
    for (int m = 0; m < (1 << mbits); ++m) grid.push_back(std::ldexp(float(m), emin - mbits));
    for (int e = emin; grid.back() < fp8_max(f); ++e)
      for (int m = 0; m < (1 << mbits) && std::ldexp(1.0f + float(m) / float(1 << mbits), e) <= fp8_max(f); ++m)
        grid.push_back(std::ldexp(1.0f + float(m) / float(1 << mbits), e));
    EXPECT_EQ(grid.back(), fp8_max(f));
    for (size_t i = 0; i < grid.size(); ++i) {
      ASSERT_EQ(fp8_quantize(grid[i], 1.0f, f), grid[i]);
      ASSERT_EQ(fp8_quantize(-grid[i], 1.0f, f), -grid[i]);
      if (i + 1 < grid.size()) {
        const float mid = 0.5f * (grid[i] + grid[i + 1]), eps = (grid[i + 1] - grid[i]) * 1e-3f;
        ASSERT_EQ(fp8_quantize(mid - eps, 1.0f, f), grid[i]);
        ASSERT_EQ(fp8_quantize(mid + eps, 1.0f, f), grid[i + 1]);
      }
    }
  }
}

TEST(CastArrays, MatchScalar) {
  std::vector<float> x = {0.0f, 1.0f, -3.14159f, 1e-6f, 7e4f, kInf, 1e-41f, 123.456f};
  std::vector<uint16_t> b(x.size());
  std::vector<float> r(x.size()), h(x.size()), q(x.size());
  cast_fp32_to_bf16(b.data(), x.data(), int64_t(x.size()));
  round_to_bf16(r.data(), x.data(), int64_t(x.size()));
  round_to_fp16(h.data(), x.data(), int64_t(x.size()));
  quantize_fp8(q.data(), x.data(), int64_t(x.size()), 4.0f, Fp8Format::e4m3);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(b[i], fp32_to_bf16(x[i]));
    EXPECT_EQ(r[i], bf16_to_fp32(fp32_to_bf16(x[i])));
    EXPECT_EQ(h[i], fp16_to_fp32(fp32_to_fp16(x[i])));
    EXPECT_EQ(q[i], fp8_quantize(x[i], 4.0f, Fp8Format::e4m3));
  }
  std::vector<float> back(x.size());
  cast_bf16_to_fp32(back.data(), b.data(), int64_t(x.size()));
  EXPECT_EQ(back, r);
}

TEST(CastArrays, AbsMax) {
  std::vector<float> x = {0.5f, -7.0f, 3.0f};
  EXPECT_EQ(abs_max(x.data(), 3), 7.0f);
  EXPECT_EQ(abs_max(x.data(), 0), 0.0f);
  x.push_back(kNaN);
  x.push_back(1.0f);
  EXPECT_TRUE(std::isnan(abs_max(x.data(), int64_t(x.size()))));
}

}  // namespace
}  // namespace lattice
