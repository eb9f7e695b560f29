// fp32 <-> bf16 / fp16 rounding and fp8 quantization against hand-computed values:
// ties to even, overflow, infinities, NaN, subnormals, saturation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast.h"
#include "kernels/cast_math.h"

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
  std::vector<float> r(x.size()), h(x.size());
  cast_fp32_to_bf16(b.data(), x.data(), int64_t(x.size()));
  round_to_bf16(r.data(), x.data(), int64_t(x.size()));
  round_to_fp16(h.data(), x.data(), int64_t(x.size()));
  std::vector<uint16_t> qb(x.size());
  quantize_fp8_to_bf16(qb.data(), x.data(), int64_t(x.size()), 4.0f, Fp8Format::e4m3);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(b[i], fp32_to_bf16(x[i]));
    EXPECT_EQ(r[i], bf16_to_fp32(fp32_to_bf16(x[i])));
    EXPECT_EQ(h[i], fp16_to_fp32(fp32_to_fp16(x[i])));
    const float q = fp8_quantize(x[i], 4.0f, Fp8Format::e4m3);
    EXPECT_EQ(qb[i], fp32_to_bf16(q));
    EXPECT_EQ(bf16_to_fp32(qb[i]), q) << "an fp8 value is a bf16 value";
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

// The current-scaling recipes' scales (Transformer Engine's formulas), by hand.
TEST(Fp8Scales, HandValues) {
  using math::fp8_block_scale;
  using math::fp8_tensor_scale;
  EXPECT_EQ(fp8_tensor_scale(2.0f, 448.0f), 224.0f);
  EXPECT_EQ(fp8_tensor_scale(3.0f, 448.0f), 448.0f / 3.0f);
  for (float bad : {0.0f, kInf, kNaN}) EXPECT_EQ(fp8_tensor_scale(bad, 448.0f), 1.0f) << bad;
  EXPECT_EQ(fp8_tensor_scale(1e-38f, 448.0f), std::numeric_limits<float>::max());  // the quotient overflows
  // blockwise: 448 / amax rounded down to a power of 2; mxfp8: amax / 448 rounded up, inverted.
  for (Fp8BlockScale s : {Fp8BlockScale::pow2, Fp8BlockScale::e8m0}) {
    EXPECT_EQ(fp8_block_scale(3.0f, 448.0f, s), 128.0f);  // 149.3 -> 128; 3/448 -> 2^-7
    EXPECT_EQ(fp8_block_scale(1.0f, 448.0f, s), 256.0f);
    EXPECT_EQ(fp8_block_scale(448.0f, 448.0f, s), 1.0f);
    EXPECT_EQ(fp8_block_scale(449.0f, 448.0f, s), 0.5f);
    EXPECT_EQ(fp8_block_scale(3.0f, 57344.0f, s), 16384.0f);  // e5m2: 19114.7 -> 2^14
    EXPECT_EQ(fp8_block_scale(1000.0f, 448.0f, s), 0.25f);
    for (float bad : {0.0f, kInf, kNaN}) EXPECT_EQ(fp8_block_scale(bad, 448.0f, s), 1.0f) << bad;
  }
  // Tiny amaxes: blockwise's quotient overflows to the largest float, rounded down to 2^127;
  // mxfp8's E8M0 exponent bottoms out at 2^-127, whose inverse 2^127 is the same.
  EXPECT_EQ(fp8_block_scale(1e-40f, 448.0f, Fp8BlockScale::pow2), std::ldexp(1.0f, 127));
  EXPECT_EQ(fp8_block_scale(1e-40f, 448.0f, Fp8BlockScale::e8m0), std::ldexp(1.0f, 127));
  // and the largest: FLT_MAX / 448 rounded up is 2^120.
  EXPECT_EQ(fp8_block_scale(std::numeric_limits<float>::max(), 448.0f, Fp8BlockScale::e8m0), std::ldexp(1.0f, -120));
}

// quantize_fp8_blocks against a plain per-block loop, on shapes whose last blocks are partial,
// for every block shape the recipes use and a small one; the output values are exact bf16
// numbers, and an outlier moves only its own block's scale.
TEST(Fp8Blocks, EachBlockHasItsOwnScale) {
  const int64_t rows = 37, cols = 300;
  std::vector<float> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) * std::exp2(float(i % 11) - 5.0f);
  x[5 * cols + 7] = 3000.0f;  // an outlier in the first blocks
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (Fp8Blocks b : {Fp8Blocks{1, 32, Fp8BlockScale::e8m0}, Fp8Blocks{32, 1, Fp8BlockScale::e8m0},
                        Fp8Blocks{1, 128, Fp8BlockScale::pow2}, Fp8Blocks{128, 1, Fp8BlockScale::pow2},
                        Fp8Blocks{128, 128, Fp8BlockScale::pow2}, Fp8Blocks{3, 5, Fp8BlockScale::pow2}}) {
      std::vector<uint16_t> q(x.size());
      quantize_fp8_blocks(q.data(), x.data(), rows, cols, b, f);
      for (int64_t r0 = 0; r0 < rows; r0 += b.rows)
        for (int64_t c0 = 0; c0 < cols; c0 += b.cols) {
          float amax = 0;
          for (int64_t r = r0; r < std::min(rows, r0 + b.rows); ++r)
            for (int64_t c = c0; c < std::min(cols, c0 + b.cols); ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
          const float s = math::fp8_block_scale(amax, fp8_max(f), b.scale);
          ASSERT_LE(amax * s, fp8_max(f) * 1.0000001f);
          for (int64_t r = r0; r < std::min(rows, r0 + b.rows); ++r)
            for (int64_t c = c0; c < std::min(cols, c0 + b.cols); ++c) {
              const size_t i = size_t(r * cols + c);
              const float want = fp8_quantize(x[i], s, f) / s;
              ASSERT_EQ(bf16_to_fp32(q[i]), want) << "block " << b.rows << "x" << b.cols << " at " << r << "," << c;
              ASSERT_EQ(fp32_to_bf16(want), q[i]);  // exact in bf16
              // Within the format's relative step of the value (above the subnormals).
              if (std::fabs(x[i]) * s >= std::ldexp(1.0f, f == Fp8Format::e4m3 ? -6 : -14))
                ASSERT_LE(std::fabs(want - x[i]), std::ldexp(std::fabs(x[i]), f == Fp8Format::e4m3 ? -4 : -3));
            }
        }
      // The outlier's block only: a value far from it keeps the format's relative precision.
      const size_t far = size_t((rows - 1) * cols + cols - 1);
      EXPECT_LE(std::fabs(bf16_to_fp32(q[far]) - x[far]), std::ldexp(std::fabs(x[far]), -3));
    }
  // A NaN leaves its block with scale 1; the other blocks are untouched by it.
  std::vector<float> y = {1e-3f, kNaN, 1e-3f, 1e-3f};
  std::vector<uint16_t> q(4);
  quantize_fp8_blocks(q.data(), y.data(), 1, 4, Fp8Blocks{1, 2, Fp8BlockScale::pow2}, Fp8Format::e4m3);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(q[1])));
  EXPECT_EQ(bf16_to_fp32(q[0]), fp8_quantize(1e-3f, 1.0f, Fp8Format::e4m3));
  EXPECT_EQ(bf16_to_fp32(q[2]), fp8_quantize(1e-3f, 262144.0f, Fp8Format::e4m3) / 262144.0f);
}

}  // namespace
}  // namespace lattice
