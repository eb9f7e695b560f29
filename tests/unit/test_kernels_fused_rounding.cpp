// The GEMM-result rounding fused into the kernels that read the result (GemmSite::
// caller_rounds): bias_add, bias_gelu_forward, bias_dropout_add_forward, gelu_backward,
// layernorm_backward and the vocab-parallel cross entropy each give, bit for bit, what round_to followed by the
// unfused kernel gives, for every format, thread count and aliasing. Each case also checks
// that the rounding changed something (the unrounded inputs give other bits), so a kernel
// that ignored its rounding argument would fail.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/activation.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::random_floats;
using kernel_test::same_bits;

std::string name(Rounding r) { return r == Rounding::bf16 ? "bf16" : r == Rounding::fp16 ? "fp16" : "none"; }

std::vector<float> rounded(std::vector<float> v, Rounding r) {
  round_to(v.data(), v.data(), int64_t(v.size()), r);
  return v;
}

// Runs body(rounding, threads) for every format and 1 and 3 threads, restoring the thread count.
template <class F>
void for_each_case(F body) {
  const int before = omp_get_max_threads();
  for (Rounding r : {Rounding::none, Rounding::bf16, Rounding::fp16})
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      body(r, threads);
    }
  omp_set_num_threads(before);
}

// N * C above the kernels' parallel thresholds, C not a multiple of the vector width.
constexpr int64_t kN = 97, kC = 403;

TEST(KernelFusedRounding, BiasAddRoundsFirst) {
  const auto y = random_floats(size_t(kN * kC), 1, -4.0f, 4.0f), b = random_floats(size_t(kC), 2);
  for_each_case([&](Rounding r, int threads) {
    std::vector<float> ref = rounded(y, r), out = y;
    bias_add(ref.data(), b.data(), kN, kC);
    bias_add(out.data(), b.data(), kN, kC, r);
    EXPECT_TRUE(same_bits(out, ref)) << name(r) << ", " << threads << " threads";
    std::vector<float> unrounded = y;
    bias_add(unrounded.data(), b.data(), kN, kC);
    EXPECT_EQ(r == Rounding::none, same_bits(out, unrounded)) << name(r);
  });
}

TEST(KernelFusedRounding, BiasGeluIsRoundBiasGelu) {
  const auto y = random_floats(size_t(kN * kC), 3, -6.0f, 6.0f), b = random_floats(size_t(kC), 4, -0.5f, 0.5f);
  for (GeluKind kind : {GeluKind::erf, GeluKind::tanh})
    for (bool bias : {true, false})
      for_each_case([&](Rounding r, int threads) {
        const std::string what = name(r) + (kind == GeluKind::erf ? " erf" : " tanh") + (bias ? "" : " no bias") +
                                 ", " + std::to_string(threads) + " threads";
        std::vector<float> pre_ref = rounded(y, r), out_ref(y.size());
        if (bias) bias_add(pre_ref.data(), b.data(), kN, kC);
        gelu_forward(out_ref.data(), pre_ref.data(), int64_t(y.size()), kind);
        std::vector<float> pre(y.size()), out(y.size());
        bias_gelu_forward(pre.data(), out.data(), y.data(), bias ? b.data() : nullptr, kN, kC, kind, r);
        EXPECT_TRUE(same_bits(pre, pre_ref)) << what;
        EXPECT_TRUE(same_bits(out, out_ref)) << what;
        std::vector<float> in_place = y;  // pre aliases y, as the model calls it
        bias_gelu_forward(in_place.data(), out.data(), in_place.data(), bias ? b.data() : nullptr, kN, kC, kind, r);
        EXPECT_TRUE(same_bits(in_place, pre_ref)) << what << " (in place)";
        EXPECT_TRUE(same_bits(out, out_ref)) << what << " (in place)";
        EXPECT_EQ(r == Rounding::none && !bias, same_bits(pre, y)) << what;
      });
}

TEST(KernelFusedRounding, GeluBackwardRoundsTheOutputGradient) {
  const int64_t n = kN * kC;
  const auto x = random_floats(size_t(n), 5, -6.0f, 6.0f), dout = random_floats(size_t(n), 6, -3.0f, 3.0f);
  for (GeluKind kind : {GeluKind::erf, GeluKind::tanh})
    for_each_case([&](Rounding r, int threads) {
      std::vector<float> ref = rounded(dout, r), dx(size_t(n), 7.0f);
      gelu_backward(ref.data(), x.data(), ref.data(), n, kind);
      gelu_backward(dx.data(), x.data(), dout.data(), n, kind, r);
      EXPECT_TRUE(same_bits(dx, ref)) << name(r) << ", " << threads << " threads";
      std::vector<float> in_place = dout;  // dx aliases dout, as the model calls it
      gelu_backward(in_place.data(), x.data(), in_place.data(), n, kind, r);
      EXPECT_TRUE(same_bits(in_place, ref)) << name(r) << " (in place)";
      std::vector<float> unrounded(static_cast<size_t>(n));
      gelu_backward(unrounded.data(), x.data(), dout.data(), n, kind);
      EXPECT_EQ(r == Rounding::none, same_bits(dx, unrounded)) << name(r);
    });
}

TEST(KernelFusedRounding, BiasDropoutAddRoundsTheGemmResult) {
  const auto y = random_floats(size_t(kN * kC), 7, -4.0f, 4.0f), res = random_floats(size_t(kN * kC), 8);
  const auto b = random_floats(size_t(kC), 9, -0.5f, 0.5f);
  const PhiloxStream stream{7, 11, 2, 1};
  for (float p : {0.0f, 0.1f})
    for_each_case([&](Rounding r, int threads) {
      const std::vector<float> yr = rounded(y, r);
      std::vector<float> ref(y.size()), out(y.size());
      bias_dropout_add_forward(ref.data(), res.data(), yr.data(), b.data(), kN, kC, p, stream, 3);
      bias_dropout_add_forward(out.data(), res.data(), y.data(), b.data(), kN, kC, p, stream, 3, r);
      EXPECT_TRUE(same_bits(out, ref)) << name(r) << " p=" << p << ", " << threads << " threads";
      std::vector<float> in_place = res;  // out aliases the residual
      bias_dropout_add_forward(in_place.data(), in_place.data(), y.data(), nullptr, kN, kC, p, stream, 3, r);
      bias_dropout_add_forward(ref.data(), res.data(), yr.data(), nullptr, kN, kC, p, stream, 3);
      EXPECT_TRUE(same_bits(in_place, ref)) << name(r) << " p=" << p << " (no bias, in place)";
      bias_dropout_add_forward(ref.data(), res.data(), y.data(), b.data(), kN, kC, p, stream, 3);
      EXPECT_EQ(r == Rounding::none, same_bits(out, ref)) << name(r);
    });
}

// The GEMM result as bf16 patterns (gemm_bf16_packed_out, no tensor parallelism): the bits of
// the fp32 result rounded to bf16 by the kernel, with and without bias, and in place.
TEST(KernelFusedRounding, BiasDropoutAddReadsTheBf16GemmResult) {
  const auto y = random_floats(size_t(kN * kC), 7, -4.0f, 4.0f), res = random_floats(size_t(kN * kC), 8);
  const auto b = random_floats(size_t(kC), 9, -0.5f, 0.5f);
  std::vector<uint16_t> y16(y.size());
  cast_fp32_to_bf16(y16.data(), y.data(), int64_t(y.size()));
  const PhiloxStream stream{7, 11, 2, 1};
  for (float p : {0.0f, 0.1f})
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> ref(y.size()), out(y.size(), NAN), in_place = res;
        bias_dropout_add_forward(ref.data(), res.data(), y.data(), bias, kN, kC, p, stream, 3, Rounding::bf16);
        bias_dropout_add_forward(out.data(), res.data(), y16.data(), bias, kN, kC, p, stream, 3);
        const std::string what = std::string(bias ? "bias" : "no bias") + " p=" + std::to_string(p) + ", " +
                                 std::to_string(threads) + " threads";
        EXPECT_TRUE(same_bits(out, ref)) << what;
        bias_dropout_add_forward(in_place.data(), in_place.data(), y16.data(), bias, kN, kC, p, stream, 3);
        EXPECT_TRUE(same_bits(in_place, ref)) << what << " (in place)";
      }
    }
  omp_set_num_threads(2);
}

// The input gradient a column-parallel layer hands to the LayerNorm before it (all three
// outputs accumulate, from non-zero starts).
TEST(KernelFusedRounding, LayerNormBackwardRoundsTheOutputGradient) {
  const auto x = random_floats(size_t(kN * kC), 11, -2.0f, 3.0f), w = random_floats(size_t(kC), 12);
  const auto b = random_floats(size_t(kC), 13), dout = random_floats(size_t(kN * kC), 14, -3.0f, 3.0f);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(kN)), rstd(mean);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, 1e-5f);
  const auto dx0 = random_floats(x.size(), 15), dw0 = random_floats(w.size(), 16), db0 = random_floats(w.size(), 17);
  for_each_case([&](Rounding r, int threads) {
    const std::vector<float> dr = rounded(dout, r);
    std::vector<float> dx_ref = dx0, dw_ref = dw0, db_ref = db0, dx = dx0, dw = dw0, db = db0;
    layernorm_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dr.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), kN, kC);
    layernorm_backward(dx.data(), dw.data(), db.data(), LayerNormDout(dout.data(), r), x.data(), w.data(),
                       mean.data(), rstd.data(), kN, kC);
    const std::string what = name(r) + ", " + std::to_string(threads) + " threads";
    EXPECT_TRUE(same_bits(dx, dx_ref)) << what;
    EXPECT_TRUE(same_bits(dw, dw_ref)) << what;
    EXPECT_TRUE(same_bits(db, db_ref)) << what;
    std::vector<float> dx_u = dx0, dw_u = dw0, db_u = db0;
    layernorm_backward(dx_u.data(), dw_u.data(), db_u.data(), dout.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), kN, kC);
    EXPECT_EQ(r == Rounding::none, same_bits(dx, dx_u)) << what;
    EXPECT_EQ(r == Rounding::none, same_bits(db, db_u)) << what;
  });
}

// The same with the gradient already rounded, in bf16 (a GEMM that wrote it so), and with
// the residual gradient's outputs for the row-parallel layer before (ResidualGradOut): the
// bits of the fp32 form rounded to bf16, then bias_backward_cast_bf16 on the new dx.
TEST(KernelFusedRounding, LayerNormBackwardReadsBf16AndMakesTheNextLayersGradient) {
  const auto x = random_floats(size_t(kN * kC), 21, -2.0f, 3.0f), w = random_floats(size_t(kC), 22);
  const auto b = random_floats(size_t(kC), 23), dout = random_floats(size_t(kN * kC), 24, -3.0f, 3.0f);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(kN)), rstd(mean);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, 1e-5f);
  std::vector<uint16_t> dout16(dout.size());
  cast_fp32_to_bf16(dout16.data(), dout.data(), int64_t(dout.size()));
  const auto dx0 = random_floats(x.size(), 25), dw0 = random_floats(w.size(), 26), db0 = random_floats(w.size(), 27);
  const auto dnext0 = random_floats(w.size(), 28);
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const std::string what = std::to_string(threads) + " threads";
    std::vector<float> dx_ref = dx0, dw_ref = dw0, db_ref = db0, dnext_ref = dnext0;
    layernorm_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), LayerNormDout(dout.data(), Rounding::bf16),
                       x.data(), w.data(), mean.data(), rstd.data(), kN, kC);
    std::vector<uint16_t> next16_ref(x.size());
    bias_backward_cast_bf16(dnext_ref.data(), next16_ref.data(), dx_ref.data(), kN, kC);
    for (bool next : {false, true}) {
      std::vector<float> dx = dx0, dw = dw0, db = db0, dnext = dnext0;
      std::vector<uint16_t> next16(x.size());
      layernorm_backward(dx.data(), dw.data(), db.data(), LayerNormDout::in_bf16(dout16.data()), x.data(), w.data(),
                         mean.data(), rstd.data(), kN, kC,
                         next ? ResidualGradOut{next16.data(), dnext.data()} : ResidualGradOut{});
      EXPECT_TRUE(same_bits(dx, dx_ref)) << what;
      EXPECT_TRUE(same_bits(dw, dw_ref)) << what;
      EXPECT_TRUE(same_bits(db, db_ref)) << what;
      if (!next) continue;
      EXPECT_TRUE(same_bits(dnext, dnext_ref)) << what;
      EXPECT_EQ(next16, next16_ref) << what;
    }
  }
  omp_set_num_threads(2);
}

// Two vocabulary slices with padding in the last, one target outside this rank's slice.
TEST(KernelFusedRounding, VocabParallelCrossEntropyReadsRoundedLogits) {
  const int64_t N = 13, Vl = 1100, valid = 1037, begin = 1100;
  const auto logits = random_floats(size_t(N * Vl), 10, -9.0f, 9.0f);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) targets[size_t(n)] = int32_t(n == 5 ? 17 : begin + (n * 97) % valid);
  for_each_case([&](Rounding r, int threads) {
    const std::string what = name(r) + ", " + std::to_string(threads) + " threads";
    std::vector<float> ref_x = rounded(logits, r), x = logits;
    std::vector<float> ref_max(static_cast<size_t>(N)), mx(static_cast<size_t>(N));
    vocab_parallel_ce_max(ref_max.data(), ref_x.data(), N, valid, Vl);
    vocab_parallel_ce_max(mx.data(), x.data(), N, valid, Vl, r);
    EXPECT_TRUE(same_bits(mx, ref_max)) << what;
    // Forward only (evaluation): the logits stay as they were.
    std::vector<double> ref_stats(static_cast<size_t>(2 * N)), stats(static_cast<size_t>(2 * N));
    vocab_parallel_ce_partials(ref_stats.data(), ref_x.data(), ref_max.data(), targets.data(), begin, N, valid, Vl,
                               false);
    vocab_parallel_ce_partials(stats.data(), x.data(), mx.data(), targets.data(), begin, N, valid, Vl, false, r);
    EXPECT_TRUE(same_bits(stats, ref_stats)) << what;
    EXPECT_TRUE(same_bits(x, logits)) << what << ": the forward-only pass wrote the logits";
    // With the exponentials stored for backward.
    vocab_parallel_ce_partials(ref_stats.data(), ref_x.data(), ref_max.data(), targets.data(), begin, N, valid, Vl,
                               true);
    vocab_parallel_ce_partials(stats.data(), x.data(), mx.data(), targets.data(), begin, N, valid, Vl, true, r);
    EXPECT_TRUE(same_bits(stats, ref_stats)) << what;
    for (int64_t n = 0; n < N; ++n)  // (the padding columns are not read, and not written)
      EXPECT_EQ(0, std::memcmp(x.data() + n * Vl, ref_x.data() + n * Vl, size_t(valid) * sizeof(float)))
          << what << ": stored exponentials of row " << n;
    if (r != Rounding::none) {
      std::vector<float> plain_max(static_cast<size_t>(N));
      vocab_parallel_ce_max(plain_max.data(), logits.data(), N, valid, Vl);
      std::vector<double> plain_stats(static_cast<size_t>(2 * N));
      std::vector<float> plain_x = logits;
      vocab_parallel_ce_partials(plain_stats.data(), plain_x.data(), plain_max.data(), targets.data(), begin, N,
                                 valid, Vl, false);
      EXPECT_FALSE(same_bits(stats, plain_stats)) << what << ": rounding changed nothing";
    }
  });
}

// The whole vocabulary on one rank, row by row in one call: the bits of the four calls, for
// every rounding, with and without the backward (a target outside the vocabulary, padding).
TEST(KernelFusedRounding, VocabParallelCrossEntropyFusedIsTheFourSteps) {
  const int64_t N = 13, Vl = 1100, valid = 1037;
  const auto logits = random_floats(size_t(N * Vl), 20, -9.0f, 9.0f);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) targets[size_t(n)] = int32_t(n == 5 ? valid + 3 : (n * 97) % valid);
  std::vector<float> mask(static_cast<size_t>(N), 1.0f);
  mask[2] = 0.0f;
  for_each_case([&](Rounding r, int threads) {
    for (bool backward : {false, true}) {
      const std::string what = name(r) + ", " + std::to_string(threads) + " threads, backward " + std::to_string(backward);
      std::vector<float> ref_x = logits, ref_max(static_cast<size_t>(N)), ref_loss(static_cast<size_t>(N));
      std::vector<double> ref_stats(static_cast<size_t>(2 * N));
      vocab_parallel_ce_max(ref_max.data(), ref_x.data(), N, valid, Vl, r);
      vocab_parallel_ce_partials(ref_stats.data(), ref_x.data(), ref_max.data(), targets.data(), 0, N, valid, Vl,
                                 backward, r);
      vocab_parallel_ce_loss(ref_loss.data(), ref_stats.data(), ref_max.data(), N);
      if (backward)
        vocab_parallel_ce_backward(ref_x.data(), ref_stats.data(), targets.data(), mask.data(), 0.25f, 0, N, valid,
                                   Vl);
      std::vector<float> x = logits, mx(static_cast<size_t>(N)), loss(static_cast<size_t>(N));
      std::vector<double> stats(static_cast<size_t>(2 * N));
      vocab_parallel_ce_fused(loss.data(), x.data(), mx.data(), stats.data(), targets.data(), backward, mask.data(),
                              0.25f, N, valid, Vl, r);
      EXPECT_TRUE(same_bits(mx, ref_max)) << what;
      EXPECT_TRUE(same_bits(stats, ref_stats)) << what;
      EXPECT_TRUE(same_bits(loss, ref_loss)) << what;
      EXPECT_TRUE(same_bits(x, ref_x)) << what << ": the logits or their gradient";
    }
  });
}

}  // namespace
}  // namespace lattice
