// The bf16 storage of the bf16 policy (GemmPolicy::bf16_results) gives, bit for bit, what
// the fp32 path gives after its conversions:
// - the output layer: the GEMM's result packed as bf16 (gemm_bf16_packed_out) is gemm_bf16
//   then cast_fp32_to_bf16; the vocab-parallel cross entropy on bf16 logits is the fp32
//   kernels' on the widened logits, and its bf16 dlogits are theirs cast to bf16;
// - the linear layers' inputs: layernorm_forward_bf16 and bias_gelu_forward_packed (on fc1's
//   bf16 GEMM result) write the bf16 casts of layernorm_forward's and bias_gelu_forward's
//   outputs, and bias_gelu_backward_packed gives gelu_backward's gradient on bias_gelu_forward's
//   pre-activation;
// - the core attention's operands: on the QKV layer's bf16 GEMM result and its bias
//   (AttentionOperand::packed) and a bf16 output gradient, it is the attention on bias_add's
//   fp32 qkv and the fp32 gradient.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "blas/gemm.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "kernels_test_util.h"
#include "../attention_test_data.h"

namespace lattice {
namespace {

using kernel_test::random_floats;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  cast_fp32_to_bf16(o.data(), v.data(), int64_t(v.size()));
  return o;
}

std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  cast_bf16_to_fp32(o.data(), v.data(), int64_t(v.size()));
  return o;
}

template <class T>
bool same_bits(const T* a, const T* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// Sizes below and above the in-place packing's chunk (2^18 values), ragged K, both
// transposes of A; the oneDNN bf16 path where the CPU has it and the fp32 fallback.
TEST(Bf16Logits, PackedGemmIsTheRoundedFp32Result) {
  struct Shape {
    int64_t M, N, K;
    Trans ta;
  };
  kernel_test::for_each_bf16_gemm_path([&](Bf16GemmPath path) {
    const bool fallback = path == Bf16GemmPath::fp32_widened;
    for (Shape s : {Shape{7, 13, 5, Trans::N}, Shape{300, 1001, 67, Trans::N}, Shape{611, 1100, 33, Trans::T}}) {
      const auto A = to_bf16(random_floats(size_t(s.M * s.K), 1, -2, 2));
      const auto B = to_bf16(random_floats(size_t(s.N * s.K), 2, -2, 2));
      const int64_t lda = s.ta == Trans::N ? s.K : s.M;
      std::vector<float> ref(size_t(s.M * s.N));
      gemm_bf16(s.ta, Trans::T, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), s.K, 0.0f, ref.data(), s.N);
      const auto ref16 = to_bf16(ref);
      std::vector<float> buffer(ref.size(), NAN);
      const uint16_t* out =
          gemm_bf16_packed_out(s.ta, Trans::T, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(), s.K, buffer.data());
      EXPECT_EQ(static_cast<const void*>(out), static_cast<const void*>(buffer.data()));
      EXPECT_TRUE(same_bits(out, ref16.data(), ref16.size()))
          << s.M << "x" << s.N << "x" << s.K << (fallback ? " (fallback)" : "");
    }
  });
}

// Two vocabulary slices of rows with padding in the second; a target outside the slice;
// a masked row; 1 and 3 threads.
TEST(Bf16Logits, CrossEntropyMatchesTheFp32KernelsOnTheWidenedLogits) {
  const int64_t N = 11, Vl = 1500;
  const auto targets = [&] {
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) t[size_t(n)] = int32_t(n == 4 ? 3 : 1500 + (n * 131) % 1400);
    return t;
  }();
  std::vector<float> mask(static_cast<size_t>(N), 1.0f);
  mask[2] = 0.0f;
  const int before = omp_get_max_threads();
  for (int threads : {1, 3})
    for (const auto [begin, valid] : {std::pair<int64_t, int64_t>{0, Vl}, {1500, 1400}}) {
      omp_set_num_threads(threads);
      const std::string what = "slice at " + std::to_string(begin) + ", " + std::to_string(threads) + " threads";
      const auto logits16 = to_bf16(random_floats(size_t(N * Vl), 3, -12, 12));
      std::vector<float> x = widen(logits16);
      std::vector<float> max32(static_cast<size_t>(N)), max16(static_cast<size_t>(N));
      vocab_parallel_ce_max(max32.data(), x.data(), N, valid, Vl);
      vocab_parallel_ce_max_bf16(max16.data(), logits16.data(), N, valid, Vl);
      EXPECT_TRUE(same_bits(max16.data(), max32.data(), max32.size())) << what;
      std::vector<double> st32(static_cast<size_t>(2 * N)), st16(st32.size());
      vocab_parallel_ce_partials(st32.data(), x.data(), max32.data(), targets.data(), begin, N, valid, Vl, true);
      vocab_parallel_ce_partials_bf16(st16.data(), logits16.data(), max16.data(), targets.data(), begin, N, valid, Vl);
      EXPECT_TRUE(same_bits(st16.data(), st32.data(), st32.size())) << what;
      vocab_parallel_ce_backward(x.data(), st32.data(), targets.data(), mask.data(), 0.37f, begin, N, valid, Vl);
      std::vector<uint16_t> d16 = logits16;
      vocab_parallel_ce_backward_bf16(d16.data(), max16.data(), st16.data(), targets.data(), mask.data(), 0.37f, begin,
                                      N, valid, Vl);
      const auto ref = to_bf16(x);
      EXPECT_TRUE(same_bits(d16.data(), ref.data(), ref.size())) << what;
      int64_t nonzero = 0;  // the case tests something: most gradients are not zero
      for (uint16_t v : d16) nonzero += (v & 0x7fff) != 0;
      EXPECT_GT(nonzero, N * valid / 2) << what;
    }
  omp_set_num_threads(before);
}

// Rows above the kernels' parallel thresholds, C not a multiple of the vector width, and
// rows longer than bias_gelu's column chunk (2048).
TEST(Bf16Inputs, LayerNormAndBiasGeluGiveTheBitsOfTheFp32Path) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{131, 389}, {19, 4501}}) {
    const auto x = random_floats(size_t(N * C), 5, -3, 3), w = random_floats(size_t(C), 6, 0.5f, 1.5f);
    const auto b = random_floats(size_t(C), 7, -0.2f, 0.2f);
    const int before = omp_get_max_threads();
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> out(x.size()), mean(static_cast<size_t>(N)), rstd(mean), mean16(mean), rstd16(mean);
      std::vector<uint16_t> out16(x.size());
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      layernorm_forward_bf16(out16.data(), mean16.data(), rstd16.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      const auto ref = to_bf16(out);
      EXPECT_TRUE(same_bits(out16.data(), ref.data(), ref.size())) << threads << " threads";
      EXPECT_TRUE(same_bits(mean16.data(), mean.data(), mean.size()));
      EXPECT_TRUE(same_bits(rstd16.data(), rstd.data(), rstd.size()));
      // fc1: y is the GEMM's fp32 result, y16 the same result packed as bf16.
      const auto y16 = to_bf16(x);
      const auto dout = random_floats(x.size(), 8, -2, 2);
      for (GeluKind kind : {GeluKind::erf, GeluKind::tanh})
        for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
          const std::string what = std::string(kind == GeluKind::erf ? "erf" : "tanh") + (bias ? "" : " no bias") +
                                   ", " + std::to_string(threads) + " threads";
          std::vector<float> pre(x.size()), g(x.size());
          std::vector<uint16_t> g16(x.size(), 0x7fc1);
          bias_gelu_forward(pre.data(), g.data(), x.data(), bias, N, C, kind, Rounding::bf16);
          bias_gelu_forward_packed(g16.data(), y16.data(), bias, N, C, kind);
          const auto gref = to_bf16(g);
          EXPECT_TRUE(same_bits(g16.data(), gref.data(), gref.size())) << what;
          for (Rounding r : {Rounding::none, Rounding::bf16}) {
            std::vector<float> dx(x.size(), 5.0f), dx16(x.size(), -5.0f), in_place = dout;
            gelu_backward(dx.data(), pre.data(), dout.data(), N * C, kind, r);
            bias_gelu_backward_packed(dx16.data(), y16.data(), bias, dout.data(), N, C, kind, r);
            EXPECT_TRUE(same_bits(dx16.data(), dx.data(), dx.size())) << what;
            bias_gelu_backward_packed(in_place.data(), y16.data(), bias, in_place.data(), N, C, kind, r);
            EXPECT_TRUE(same_bits(in_place.data(), dx.data(), dx.size())) << what << " (dx aliases dout)";
            // fc1's bf16 output gradient too, in the place of its bf16 result (as the model has it).
            std::vector<uint16_t> y_then_dx16 = y16;
            std::vector<float> dx_b(x.size(), 5.0f);
            bias_gelu_backward_packed(dx_b.data(), y_then_dx16.data(), bias, dout.data(), N, C, kind, r,
                                      y_then_dx16.data());
            const auto dx16_ref = to_bf16(dx);
            EXPECT_TRUE(same_bits(dx_b.data(), dx.data(), dx.size())) << what << " (with the bf16 gradient)";
            EXPECT_TRUE(same_bits(y_then_dx16.data(), dx16_ref.data(), dx16_ref.size())) << what << " (bf16 gradient)";
            if (r == Rounding::bf16) {
              // dout itself in bf16 (fc2's input gradient as its GEMM wrote it rounded).
              const auto dout16 = to_bf16(dout);
              std::vector<uint16_t> y2 = y16;
              std::vector<float> dx_c(x.size(), 5.0f);
              bias_gelu_backward_packed(dx_c.data(), y2.data(), bias, dout16.data(), N, C, kind, y2.data());
              EXPECT_TRUE(same_bits(dx_c.data(), dx.data(), dx.size())) << what << " (bf16 dout)";
              EXPECT_TRUE(same_bits(y2.data(), dx16_ref.data(), dx16_ref.size())) << what << " (bf16 dout, bf16 gradient)";
              // And with the bias gradient summed as it goes, no fp32 gradient stored: the
              // bits of bias_backward on the fp32 one, accumulated onto what dbias held.
              if (bias) {
                const auto db0 = random_floats(size_t(C), 9, -1, 1);
                std::vector<float> db_ref = db0, db = db0;
                bias_backward(db_ref.data(), dx.data(), N, C);
                std::vector<uint16_t> y3 = y16;
                bias_gelu_backward_packed_dbias(y3.data(), db.data(), y3.data(), bias, dout16.data(), N, C, kind);
                EXPECT_TRUE(same_bits(y3.data(), dx16_ref.data(), dx16_ref.size())) << what << " (dbias form)";
                EXPECT_TRUE(same_bits(db.data(), db_ref.data(), db.size())) << what << " (dbias)";
              }
            }
          }
        }
      // The pre-activation matters: a backward without the bias differs.
      std::vector<float> with(x.size()), without(x.size());
      bias_gelu_backward_packed(with.data(), y16.data(), b.data(), dout.data(), N, C, GeluKind::erf);
      bias_gelu_backward_packed(without.data(), y16.data(), nullptr, dout.data(), N, C, GeluKind::erf);
      EXPECT_FALSE(same_bits(with.data(), without.data(), with.size()));
    }
    omp_set_num_threads(before);
  }
}

// With dropout and documents (the whole kernel), with and without the bias.
TEST(Bf16Qkv, AttentionOnBf16OperandsIsTheAttentionOnTheirFp32Values) {
  const AttentionShape s{2, 70, 3, 16};
  const auto drop = attention_test::tensor_parallel_rank1_dropout(s.H);
  const auto docs = attention_test::document_ids(s.B, s.T, 5);
  const int64_t rows = s.B * s.T, row = s.H * 3 * s.D, n_out = rows * s.H * s.D;
  const auto y16 = to_bf16(random_floats(size_t(rows * row), 9, -1.5f, 1.5f));
  const auto bias = random_floats(size_t(row), 10, -0.5f, 0.5f);
  // The output gradient as the projection's GEMM writes it rounded: bf16, or its fp32 values.
  const auto dout16 = to_bf16(random_floats(size_t(n_out), 11, -1, 1));
  const auto dout = widen(dout16);
  for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
    // The fp32 path: the GEMM's fp32 result, rounded, plus the bias (linear_forward).
    auto qkv = widen(y16);
    if (b) bias_add(qkv.data(), b, rows, row, Rounding::bf16);
    else round_to(qkv.data(), qkv.data(), rows * row, Rounding::bf16);
    std::vector<float> out[2], lse[2], dqkv[2];
    std::vector<uint16_t> dqkv16(size_t(rows * row), 0x7fc1), out16(size_t(n_out), 0x7fc1);
    for (int k = 0; k < 2; ++k) {
      const AttentionOperand in = k == 0 ? AttentionOperand(qkv.data()) : AttentionOperand::packed(y16.data(), b);
      const AttentionOperand d = k == 0 ? AttentionOperand(dout.data()) : AttentionOperand::in_bf16(dout16.data());
      out[k].assign(size_t(n_out), NAN);
      lse[k].assign(size_t(s.B * s.H * s.T), NAN);
      dqkv[k].assign(size_t(rows * row), NAN);
      attention_forward(out[k].data(), lse[k].data(), in, s, drop, docs.data(), AttentionMath::fp32,
                        k == 1 ? out16.data() : nullptr);
      attention_backward(dqkv[k].data(), d, in, out[k].data(), lse[k].data(), s, drop, docs.data(),
                         AttentionMath::fp32, k == 1 ? dqkv16.data() : nullptr);
    }
    // The projection's input in bf16 too: the cast of the fp32 output.
    const auto out16_ref = to_bf16(out[0]);
    EXPECT_TRUE(same_bits(out16.data(), out16_ref.data(), out16_ref.size())) << (b ? "with bias" : "without bias");
    // The QKV layer's output gradient in bf16 too: the cast of the fp32 one.
    const auto dqkv16_ref = to_bf16(dqkv[0]);
    EXPECT_TRUE(same_bits(dqkv16.data(), dqkv16_ref.data(), dqkv16_ref.size())) << (b ? "with bias" : "without bias");
    // And the bias gradient summed by the backward: bias_backward's bits on the fp32 dqkv.
    const auto db0 = random_floats(size_t(row), 12);
    std::vector<float> db = db0, db_ref = db0, dqkv_c(size_t(rows * row));
    bias_backward(db_ref.data(), dqkv[0].data(), rows, row);
    attention_backward(dqkv_c.data(), AttentionOperand::in_bf16(dout16.data()), AttentionOperand::packed(y16.data(), b),
                       out[1].data(), lse[1].data(), s, drop, docs.data(), AttentionMath::fp32, nullptr, db.data());
    EXPECT_TRUE(same_bits(db.data(), db_ref.data(), db.size())) << (b ? "with bias" : "without bias") << ": dbias";
    const std::string what = b ? "with bias" : "without bias";
    EXPECT_TRUE(same_bits(out[1].data(), out[0].data(), out[0].size())) << what;
    EXPECT_TRUE(same_bits(lse[1].data(), lse[0].data(), lse[0].size())) << what;
    EXPECT_TRUE(same_bits(dqkv[1].data(), dqkv[0].data(), dqkv[0].size())) << what;
  }
  // The bias is used: without it the result differs.
  std::vector<float> with(static_cast<size_t>(n_out)), without(with), l(static_cast<size_t>(s.B * s.H * s.T));
  attention_forward(with.data(), l.data(), AttentionOperand::packed(y16.data(), bias.data()), s, drop, docs.data());
  attention_forward(without.data(), l.data(), AttentionOperand::packed(y16.data(), nullptr), s, drop, docs.data());
  EXPECT_FALSE(same_bits(with.data(), without.data(), with.size()));
}

}  // namespace
}  // namespace lattice
