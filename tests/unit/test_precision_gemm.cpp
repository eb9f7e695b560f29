// The bf16 GEMM against the fp32 GEMM on the same (bf16) numbers, and the mixed-precision
// GEMM policies against the arithmetic they state.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "blas/gemm.h"
#include "core/error.h"
#include "kernels/cast.h"
#include "kernels_test_util.h"
#include "model/mixed_precision.h"

namespace lattice {
namespace {

using kernel_test::for_each_bf16_gemm_path;
using kernel_test::random_floats;
using kernel_test::same_bits;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  cast_fp32_to_bf16(b.data(), v.data(), int64_t(v.size()));
  return b;
}
std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  cast_bf16_to_fp32(v.data(), b.data(), int64_t(b.size()));
  return v;
}
// v * scale on the fp8 grid (the fp8 numbers, not divided by the scale).
std::vector<float> fp8_values(const std::vector<float>& v, float scale, Fp8Format f) {
  std::vector<float> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = fp8_quantize(v[i], scale, f);
  return q;
}

struct Case {
  Trans ta, tb;
  int64_t M, N, K, pad;
  float alpha, beta;
};

// Both GEMMs sum the same exact products in fp32, in different orders: the difference is
// bounded by the fp32 accumulation error, K * 2^-24 * sum_k |a_k b_k| per element (x2 for
// the two sums).
void check_case(const Case& c, Bf16GemmPath path) {
  gemm_bf16_force_path(path);
  const bool fallback = path == Bf16GemmPath::fp32_widened;
  const int64_t ar = c.ta == Trans::N ? c.M : c.K, ac = c.ta == Trans::N ? c.K : c.M;
  const int64_t br = c.tb == Trans::N ? c.K : c.N, bc = c.tb == Trans::N ? c.N : c.K;
  const int64_t lda = ac + c.pad, ldb = bc + c.pad, ldc = c.N + c.pad;
  const auto A = to_bf16(random_floats(size_t(ar * lda), 1, -2, 2));
  const auto B = to_bf16(random_floats(size_t(br * ldb), 2, -2, 2));
  const auto C0 = random_floats(size_t(c.M * ldc), 3);
  const auto Af = widen(A), Bf = widen(B);
  std::vector<float> C = C0, R = C0, absprod(size_t(c.M * ldc), 0.0f), ones(size_t(c.M * ldc), 0.0f);
  gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, Af.data(), lda, Bf.data(), ldb, c.beta, R.data(), ldc);
  std::vector<float> Aa(Af.size()), Ba(Bf.size());
  for (size_t i = 0; i < Af.size(); ++i) Aa[i] = std::fabs(Af[i]);
  for (size_t i = 0; i < Bf.size(); ++i) Ba[i] = std::fabs(Bf[i]);
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, std::fabs(c.alpha), Aa.data(), lda, Ba.data(), ldb, 0.0f, absprod.data(), ldc);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      const size_t k = size_t(i * ldc + j);
      const double bound = 2.0 * double(c.K + 2) * std::ldexp(1.0, -24) * (absprod[k] + std::fabs(c.beta * C0[k]));
      ASSERT_LE(std::fabs(double(C[k]) - double(R[k])), bound)
          << "M=" << c.M << " N=" << c.N << " K=" << c.K << " at " << i << "," << j << " fallback=" << fallback;
    }
  // The padding columns of C are untouched.
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[size_t(i * ldc + j)], C0[size_t(i * ldc + j)]);
  gemm_bf16_use_default_path();
}

const std::vector<Case> kCases = {
    {Trans::N, Trans::T, 7, 5, 3, 0, 1.0f, 0.0f},     {Trans::N, Trans::N, 33, 17, 65, 3, 1.0f, 1.0f},
    {Trans::T, Trans::N, 16, 40, 24, 1, 0.5f, 1.0f},  {Trans::T, Trans::T, 9, 31, 12, 2, 1.0f, 0.25f},
    {Trans::N, Trans::T, 256, 600, 96, 0, 1.0f, 0.0f},  // blocked over threads
    {Trans::T, Trans::N, 768, 200, 64, 5, 1.0f, 1.0f},  // blocked over threads, split along M
};

TEST(PrecisionGemm, OnednnBf16MatchesFp32OnBf16Numbers) {
  if (!gemm_bf16_path_supported(Bf16GemmPath::onednn_bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const Case& c : kCases) check_case(c, Bf16GemmPath::onednn_bf16);
}

TEST(PrecisionGemm, FallbackMatchesFp32OnBf16Numbers) {
  for (const Case& c : kCases) check_case(c, Bf16GemmPath::fp32_widened);
}

// The default against the kernel's own list of the CPU's features: oneDNN's bf16 matmul where
// /proc/cpuinfo lists amx_bf16, the widened fp32 GEMM elsewhere.
TEST(PrecisionGemm, DefaultPathIsOnednnWithAmxOnly) {
  std::printf("gemm_bf16 path: %s\n", gemm_bf16_path_name());
  if (std::getenv("LATTICE_BF16_GEMM") || std::getenv("ONEDNN_MAX_CPU_ISA"))
    GTEST_SKIP() << "LATTICE_BF16_GEMM or ONEDNN_MAX_CPU_ISA set: the default is not the CPU's";
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line;
  bool amx = false;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      amx = (line + " ").find(" amx_bf16 ") != std::string::npos;
      break;
    }
  EXPECT_EQ(gemm_bf16_path() == Bf16GemmPath::onednn_bf16, amx) << "amx_bf16 in /proc/cpuinfo: " << amx;
}

// Products above and below blocking.h's parallel threshold, including the weight-gradient
// shape (A transposed, small M x N, long K) that oneDNN's AVX2 sgemm splits along K when it
// is given two threads.
struct ThreadShape {
  Trans ta, tb;
  int64_t M, N, K;
};
const ThreadShape kThreadShapes[] = {{Trans::N, Trans::T, 512, 384, 128}, {Trans::N, Trans::N, 32, 96, 32},
                                     {Trans::T, Trans::N, 32, 96, 64},    {Trans::T, Trans::N, 16, 16, 4096},
                                     {Trans::T, Trans::N, 64, 48, 600},   {Trans::N, Trans::T, 8, 8, 30000}};

// Runs gemm (a gemm_f32 or gemm_bf16) on every shape with 1 and then 2 threads: the same bits,
// and the caller's thread count as it was.
template <class Elem, class Gemm, class Make>
void expect_thread_count_invariant(const Gemm& gemm, const Make& make) {
  for (const ThreadShape& t : kThreadShapes) {
    const int64_t lda = t.ta == Trans::N ? t.K : t.M, ldb = t.tb == Trans::N ? t.N : t.K;
    const std::vector<Elem> A = make(random_floats(size_t(t.M * t.K), 6)), B = make(random_floats(size_t(t.N * t.K), 7));
    std::vector<float> c1(size_t(t.M * t.N)), c2(size_t(t.M * t.N));
    omp_set_num_threads(1);
    gemm(t.ta, t.tb, t.M, t.N, t.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, c1.data(), t.N);
    omp_set_num_threads(2);
    gemm(t.ta, t.tb, t.M, t.N, t.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, c2.data(), t.N);
    EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)))
        << "M=" << t.M << " N=" << t.N << " K=" << t.K;
    EXPECT_EQ(2, omp_get_max_threads()) << "the thread count is restored after the call";
  }
}

TEST(PrecisionGemm, Fp32ThreadCountInvariant) {
  expect_thread_count_invariant<float>(gemm_f32, [](std::vector<float> v) { return v; });
}

TEST(PrecisionGemm, Bf16ThreadCountInvariant) {
  for_each_bf16_gemm_path([](Bf16GemmPath) {
    expect_thread_count_invariant<uint16_t>(
        [](Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
           const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
          gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        },
        to_bf16);
  });
}

// A weight given widened (bf16 numbers in fp32, Bf16Operand::widened) is the same product as its
// bf16 patterns on the widened-fp32 path, bit for bit, through gemm_bf16 and gemm_bf16_packed_out,
// transposed or not; the oneDNN path, which multiplies bf16 patterns, refuses it.
TEST(PrecisionGemm, WidenedOperandIsTheSameProduct) {
  const int64_t M = 37, N = 300, K = 129;
  const auto A = to_bf16(random_floats(size_t(M * K), 21, -2, 2));
  const auto B = to_bf16(random_floats(size_t(K * N), 22, -2, 2));
  const auto Bw = widen(B);
  for_each_bf16_gemm_path([&](Bf16GemmPath path) {
    for (Trans tb : {Trans::N, Trans::T}) {
      const int64_t ldb = tb == Trans::N ? N : K;
      const auto C0 = random_floats(size_t(M * N), 23);
      std::vector<float> C = C0, Cw = C0, buffer(C0.size()), buffer_w(C0.size());
      gemm_bf16(Trans::N, tb, M, N, K, 0.5f, A.data(), K, B.data(), ldb, 1.0f, C.data(), N);
      if (path == Bf16GemmPath::onednn_bf16) {
        EXPECT_THROW(gemm_bf16(Trans::N, tb, M, N, K, 0.5f, A.data(), K, Bf16Operand::widened(Bw.data()), ldb, 1.0f,
                               Cw.data(), N),
                     Error);
        EXPECT_THROW(gemm_bf16_packed_out(Trans::N, tb, M, N, K, 1.0f, A.data(), K, Bf16Operand::widened(Bw.data()),
                                          ldb, buffer_w.data()),
                     Error);
        continue;
      }
      gemm_bf16(Trans::N, tb, M, N, K, 0.5f, A.data(), K, Bf16Operand::widened(Bw.data()), ldb, 1.0f, Cw.data(), N);
      EXPECT_TRUE(same_bits(C, Cw)) << "trans B " << (tb == Trans::T);
      const uint16_t* p = gemm_bf16_packed_out(Trans::N, tb, M, N, K, 1.0f, A.data(), K, B.data(), ldb, buffer.data());
      const uint16_t* pw = gemm_bf16_packed_out(Trans::N, tb, M, N, K, 1.0f, A.data(), K,
                                                Bf16Operand::widened(Bw.data()), ldb, buffer_w.data());
      EXPECT_EQ(0, std::memcmp(p, pw, size_t(M * N) * sizeof(uint16_t))) << "trans B " << (tb == Trans::T);
    }
  });
}

// Forward, weight gradient and input gradient of a policy, and the same computed with
// gemm_f32 on operands prepared by `round` (values in the policy's format), results rounded
// by `round_out` where the policy rounds them.
struct LinearCase {
  int64_t N = 24, in = 40, out = 56;
  std::vector<float> x = random_floats(size_t(24 * 40), 11, -3, 3);
  std::vector<float> W = random_floats(size_t(56 * 40), 12, -0.5, 0.5);
  std::vector<float> dy = random_floats(size_t(24 * 56), 13, -1, 1);
};

template <class Round>
std::vector<float> rounded(const std::vector<float>& v, Round r) {
  std::vector<float> o(v.size());
  r(o.data(), v.data(), int64_t(v.size()));
  return o;
}

void expect_close_to_fp32(const std::vector<float>& got, const std::vector<float>& want, int64_t K) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * double(K) * (1.0 + std::fabs(want[i]))) << i;
}

TEST(PrecisionPolicy, Fp16IsFp32ArithmeticOnFp16Values) {
  LinearCase c;
  auto p = make_half_precision_policy(HalfFormat::fp16);
  const auto xh = rounded(c.x, round_to_fp16), Wh = rounded(c.W, round_to_fp16), dyh = rounded(c.dy, round_to_fp16);
  std::vector<float> y(size_t(c.N * c.out)), ref(y.size());
  p->forward(0, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f, xh.data(), c.in, Wh.data(), c.in, 0.0f, ref.data(), c.out);
  EXPECT_EQ(y, ref);  // the fp32 sum: rounding is round_result's (after any TP reduction)
  p->round_result(y.data(), int64_t(y.size()));
  round_to_fp16(ref.data(), ref.data(), int64_t(ref.size()));
  EXPECT_EQ(y, ref);
  std::vector<float> dW(c.W.size(), 0.5f), dWref(c.W.size(), 0.5f);
  p->weight_grad(0, dW.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  gemm_f32(Trans::T, Trans::N, c.out, c.in, c.N, 1.0f, dyh.data(), c.out, xh.data(), c.in, 1.0f, dWref.data(), c.in);
  EXPECT_EQ(dW, dWref);  // fp32 main gradient, not rounded
  std::vector<float> dx(c.x.size()), dxref(c.x.size());
  p->input_grad(0, dx.data(), c.dy.data(), c.W.data(), c.N, c.in, c.out, false);
  p->round_result(dx.data(), int64_t(dx.size()));
  gemm_f32(Trans::N, Trans::N, c.N, c.in, c.out, 1.0f, dyh.data(), c.out, Wh.data(), c.in, 0.0f, dxref.data(), c.in);
  round_to_fp16(dxref.data(), dxref.data(), int64_t(dxref.size()));
  EXPECT_EQ(dx, dxref);
}

// linear_forward rounds the GEMM result, then adds the bias (one pass); a site whose caller
// rounds (GemmSite::caller_rounds) gets the fp32 sum and cannot take a bias; linear_backward
// rounds dx unless the caller does.
TEST(PrecisionPolicy, LinearRoundsBeforeTheBiasUnlessTheCallerRounds) {
  LinearCase c;
  const auto b = random_floats(size_t(c.out), 14, -0.5, 0.5);
  for (HalfFormat f : {HalfFormat::bf16, HalfFormat::fp16}) {
    auto p = make_half_precision_policy(f);
    const GemmSite site{p.get(), 0};
    std::vector<float> sum(size_t(c.N * c.out)), y(sum.size()), unrounded(sum.size());
    p->forward(0, sum.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
    std::vector<float> ref = sum;
    p->round_result(ref.data(), int64_t(ref.size()));
    EXPECT_NE(ref, sum);  // the rounding does something here
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t o = 0; o < c.out; ++o) ref[size_t(n * c.out + o)] += b[size_t(o)];
    linear_forward(y.data(), c.x.data(), c.W.data(), b.data(), c.N, c.in, c.out, site);
    EXPECT_EQ(y, ref);
    linear_forward(unrounded.data(), c.x.data(), c.W.data(), nullptr, c.N, c.in, c.out, site.rounded_by_caller());
    EXPECT_EQ(unrounded, sum);
    EXPECT_EQ(rounding(site), f == HalfFormat::bf16 ? Rounding::bf16 : Rounding::fp16);
    EXPECT_THROW(linear_forward(y.data(), c.x.data(), c.W.data(), b.data(), c.N, c.in, c.out,
                                site.rounded_by_caller()),
                 Error);
    std::vector<float> dW(c.W.size(), 0.0f), dx(c.x.size()), dx_sum(c.x.size());
    linear_backward(dx.data(), dW.data(), nullptr, c.dy.data(), c.x.data(), c.W.data(), c.N, c.in, c.out, false, site);
    linear_backward(dx_sum.data(), dW.data(), nullptr, c.dy.data(), c.x.data(), c.W.data(), c.N, c.in, c.out, false,
                    site.rounded_by_caller());
    p->round_result(dx_sum.data(), int64_t(dx_sum.size()));
    EXPECT_EQ(dx, dx_sum);
  }
  EXPECT_EQ(rounding(GemmSite{}), Rounding::none);
}

// The bf16 results of the bf16 policy (the output layer's logits): the forward's rounded
// result packed as bf16, and the backward GEMMs from a bf16 output gradient, the same bits as
// the fp32-result path. The other formats have none.
void expect_bf16_results_are_the_rounded_results() {
  LinearCase c;
  auto p = make_half_precision_policy(HalfFormat::bf16);
  ASSERT_TRUE(p->bf16_results());
  std::vector<float> y(size_t(c.N * c.out)), buffer(y.size());
  p->forward(2, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  std::vector<uint16_t> ref(y.size());
  cast_fp32_to_bf16(ref.data(), y.data(), int64_t(y.size()));
  const uint16_t* y16 = p->forward_bf16(2, buffer.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(0, std::memcmp(y16, ref.data(), ref.size() * sizeof(uint16_t)));
  std::vector<uint16_t> dy16(c.dy.size());
  cast_fp32_to_bf16(dy16.data(), c.dy.data(), int64_t(c.dy.size()));
  std::vector<float> dW(c.W.size(), 0.25f), dW16(dW), dx(c.x.size(), 1.0f), dx16(dx);
  p->weight_grad(2, dW.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  p->input_grad(2, dx.data(), c.dy.data(), c.W.data(), c.N, c.in, c.out, true);
  p->weight_grad_bf16(2, dW16.data(), dy16.data(), c.x.data(), c.N, c.in, c.out);
  p->input_grad_bf16(2, dx16.data(), dy16.data(), c.W.data(), c.N, c.in, c.out, true);
  EXPECT_EQ(dW16, dW);
  EXPECT_EQ(dx16, dx);
  // The input gradient written rounded in bf16 (input_grad_packed): input_grad, then cast;
  // alone and after weight_grad on the same dy (whose conversion it reuses).
  std::vector<float> dx_w(c.x.size()), dx_buffer(c.x.size()), dW_w(c.W.size(), 0.0f);
  p->input_grad(2, dx_w.data(), c.dy.data(), c.W.data(), c.N, c.in, c.out, false);
  std::vector<uint16_t> dx_ref(dx_w.size());
  cast_fp32_to_bf16(dx_ref.data(), dx_w.data(), int64_t(dx_w.size()));
  const uint16_t* dx_packed =
      p->input_grad_packed(2, dx_buffer.data(), c.dy.data(), nullptr, c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(static_cast<const void*>(dx_packed), static_cast<const void*>(dx_buffer.data()));
  EXPECT_EQ(0, std::memcmp(dx_packed, dx_ref.data(), dx_ref.size() * sizeof(uint16_t)));
  std::fill(dx_buffer.begin(), dx_buffer.end(), 7.0f);
  p->weight_grad(2, dW_w.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  dx_packed = p->input_grad_packed(2, dx_buffer.data(), c.dy.data(), nullptr, c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(0, std::memcmp(dx_packed, dx_ref.data(), dx_ref.size() * sizeof(uint16_t)));
  // And from dy's bf16 cast made by the caller (no fp32 dy read): the same bits.
  std::fill(dx_buffer.begin(), dx_buffer.end(), 7.0f);
  dx_packed = p->input_grad_packed(2, dx_buffer.data(), nullptr, dy16.data(), c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(0, std::memcmp(dx_packed, dx_ref.data(), dx_ref.size() * sizeof(uint16_t)));
  // Inputs already in bf16 (LinearInput::in_bf16): the same results as converting fp32 ones.
  std::vector<uint16_t> x16(c.x.size());
  cast_fp32_to_bf16(x16.data(), c.x.data(), int64_t(c.x.size()));
  const LinearInput xb = LinearInput::in_bf16(x16.data());
  std::vector<float> y_in(y.size()), dW_in(c.W.size(), 0.25f), dW_ref(c.W.size(), 0.25f);
  p->forward(2, y_in.data(), xb, c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(y_in, y);
  const uint16_t* y16_in = p->forward_bf16(2, buffer.data(), xb, c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(0, std::memcmp(y16_in, ref.data(), ref.size() * sizeof(uint16_t)));
  p->weight_grad(2, dW_in.data(), c.dy.data(), xb, c.N, c.in, c.out);
  p->weight_grad(2, dW_ref.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  EXPECT_EQ(dW_in, dW_ref);
  std::unique_ptr<MixedPrecisionPolicy> others[] = {make_half_precision_policy(HalfFormat::fp16),
                                                    make_fp8_policy(Fp8Recipe{}, nullptr)};
  for (auto& q : others) {
    EXPECT_FALSE(q->bf16_results()) << q->name();
    EXPECT_THROW(q->forward_bf16(0, buffer.data(), c.x.data(), c.W.data(), c.N, c.in, c.out), Error) << q->name();
    EXPECT_THROW(q->input_grad_packed(0, buffer.data(), c.dy.data(), nullptr, c.W.data(), c.N, c.in, c.out), Error)
        << q->name();
    EXPECT_THROW(q->forward(0, y.data(), xb, c.W.data(), c.N, c.in, c.out), Error) << q->name();
  }
  EXPECT_THROW(linear_forward(y.data(), xb, c.W.data(), nullptr, c.N, c.in, c.out), Error);  // fp32 GEMM
}

TEST(PrecisionPolicy, Bf16ResultsAreTheRoundedResults) {
  // On each of gemm_bf16's paths (the widened-fp32 path keeps its weight copy widened).
  for_each_bf16_gemm_path([](Bf16GemmPath) { expect_bf16_results_are_the_rounded_results(); });
}

TEST(PrecisionPolicy, Fp16OverflowBecomesInf) {
  LinearCase c;
  auto p = make_half_precision_policy(HalfFormat::fp16);
  c.dy[3] = 1e5f;  // beyond fp16's 65504
  std::vector<float> dW(c.W.size(), 0.0f);
  p->weight_grad(0, dW.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  bool inf = false;
  for (float v : dW) inf |= std::isinf(v);
  EXPECT_TRUE(inf);
}

TEST(PrecisionPolicy, Bf16MatchesFp32OnBf16ValuesAndRefreshes) {
  for_each_bf16_gemm_path([](Bf16GemmPath path) {
    LinearCase c;
    auto p = make_half_precision_policy(HalfFormat::bf16);
    const auto xb = rounded(c.x, round_to_bf16), Wb = rounded(c.W, round_to_bf16);
    std::vector<float> y(size_t(c.N * c.out)), ref(y.size());
    p->forward(3, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
    p->round_result(y.data(), int64_t(y.size()));
    gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f, xb.data(), c.in, Wb.data(), c.in, 0.0f, ref.data(), c.out);
    for (float& v : ref) v = bf16_to_fp32(fp32_to_bf16(v));
    if (path == Bf16GemmPath::fp32_widened) {
      EXPECT_TRUE(same_bits(y, ref));  // this very GEMM on the same (widened) numbers
    } else {
      // Up to accumulation order, then one bf16 rounding: at most one bf16 ulp apart.
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_LE(std::fabs(y[i] - ref[i]), std::ldexp(std::fabs(ref[i]), -7) + 1e-6) << i;
    }
    // The weight copy is kept until refresh_weights.
    std::vector<float> W2 = c.W;
    for (float& v : W2) v *= 2.0f;
    std::vector<float> y2(y.size()), y3(y.size());
    p->forward(3, y2.data(), c.x.data(), W2.data(), c.N, c.in, c.out);
    p->round_result(y2.data(), int64_t(y2.size()));
    EXPECT_EQ(y2, y);
    p->refresh_weights();
    p->forward(3, y3.data(), c.x.data(), W2.data(), c.N, c.in, c.out);
    p->round_result(y3.data(), int64_t(y3.size()));
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y3[i], 2.0f * y[i]) << i;  // scaling by 2 is exact
  });
}

TEST(PrecisionPolicy, Fp8DelayedScaling) {
  Fp8Recipe r;
  r.amax_history_len = 3;
  r.amax_max = true;
  DelayedScale s(r, Fp8Format::e4m3);
  EXPECT_EQ(s.scale(), 1.0f);  // no history yet
  s.record(2.0f);
  EXPECT_EQ(s.scale(), 224.0f);
  s.record(4.0f);
  EXPECT_EQ(s.scale(), 112.0f);
  s.record(1.0f);
  EXPECT_EQ(s.scale(), 112.0f);  // max over [1, 4, 2]
  s.record(1.0f);
  EXPECT_EQ(s.scale(), 112.0f);  // [1, 1, 4]
  s.record(1.0f);
  EXPECT_EQ(s.scale(), 448.0f);  // [1, 1, 1]
  s.record(0.0f);
  EXPECT_EQ(s.scale(), 448.0f);  // max still 1
  Fp8Recipe m;
  m.margin = 2;
  DelayedScale t(m, Fp8Format::e5m2);
  t.record(8.0f);
  EXPECT_EQ(t.scale(), 57344.0f / 8.0f / 4.0f);
  t.record(0.0f);  // amax 0: the scale is kept
  EXPECT_EQ(t.scale(), 57344.0f / 8.0f / 4.0f);
  t.record(std::numeric_limits<float>::infinity());
  EXPECT_EQ(t.scale(), 57344.0f / 8.0f / 4.0f);
  EXPECT_THROW(make_fp8_recipe("e5m2", 0, 1, "max"), std::exception);
  EXPECT_THROW(make_fp8_recipe("hybrid", 0, 0, "max"), std::exception);
  EXPECT_THROW(make_fp8_recipe("hybrid", 0, 1, "mean"), std::exception);
  EXPECT_EQ(make_fp8_recipe("hybrid", 0, 1, "max").backward, Fp8Format::e5m2);
}

// fp8 forward: the inputs on the e4m3 grid with the delayed scales, exact products summed
// in fp32, divided by both scales.
TEST(PrecisionPolicy, Fp8ForwardIsScaledFp8Arithmetic) {
  LinearCase c;
  auto p = make_fp8_policy(make_fp8_recipe("hybrid", 0, 1, "most_recent"), nullptr);
  std::vector<float> y(size_t(c.N * c.out));
  p->forward(0, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);  // scales 1; notes amaxes
  std::vector<float> y1 = y;
  // Within a step the scales stay: a second use computes the same.
  p->forward(0, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  EXPECT_EQ(y, y1);
  const float sx = 448.0f / abs_max(c.x.data(), int64_t(c.x.size()));
  const float sw = 448.0f / abs_max(c.W.data(), int64_t(c.W.size()));
  p->finish_step();      // the step's amaxes enter the histories
  p->refresh_weights();  // the weight is re-quantized with its delayed scale
  p->forward(0, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  const std::vector<float> xq = fp8_values(c.x, sx, Fp8Format::e4m3), Wq = fp8_values(c.W, sw, Fp8Format::e4m3);
  std::vector<float> ref(y.size());
  gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f, xq.data(), c.in, Wq.data(), c.in, 0.0f, ref.data(), c.out);
  for (float& v : ref) v /= (sx * sw);
  expect_close_to_fp32(y, ref, c.in);
  // And close to the fp32 product (e4m3 has 3 mantissa bits: a few % per element).
  std::vector<float> exact(y.size());
  gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f, c.x.data(), c.in, c.W.data(), c.in, 0.0f, exact.data(), c.out);
  double err = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) err += std::pow(y[i] - exact[i], 2), norm += std::pow(exact[i], 2);
  EXPECT_LT(std::sqrt(err / norm), 0.05);
}

// --no-fp8-wgrad: the weight gradient is the fp32 GEMM of the unquantized output gradient and input;
// the input gradient stays fp8 (and quantizes the output gradient itself).
TEST(PrecisionPolicy, Fp8WithoutFp8WeightGradients) {
  LinearCase c;
  Fp8Recipe r = make_fp8_recipe("hybrid", 0, 1, "most_recent");
  auto fp8 = make_fp8_policy(r, nullptr);
  r.fp8_wgrad = false;
  auto wgrad32 = make_fp8_policy(r, nullptr);
  const std::vector<float>& dy = c.dy;
  std::vector<float> dW(c.W.size(), 0.5f), ref = dW, quantized = dW;
  wgrad32->weight_grad(0, dW.data(), dy.data(), c.x.data(), c.N, c.in, c.out);
  gemm_f32(Trans::T, Trans::N, c.out, c.in, c.N, 1.0f, dy.data(), c.out, c.x.data(), c.in, 1.0f, ref.data(), c.in);
  EXPECT_EQ(dW, ref);  // accumulated onto dW, bit for bit the fp32 GEMM
  fp8->weight_grad(0, quantized.data(), dy.data(), c.x.data(), c.N, c.in, c.out);
  EXPECT_NE(quantized, ref);  // the default quantizes both operands
  std::vector<float> dx(c.x.size()), dx8(c.x.size());
  wgrad32->input_grad(0, dx.data(), dy.data(), c.W.data(), c.N, c.in, c.out, false);
  fp8->input_grad(0, dx8.data(), dy.data(), c.W.data(), c.N, c.in, c.out, false);
  EXPECT_EQ(dx, dx8);  // the input gradient is fp8 either way
}

// --fp8-recipe tensorwise: each operand scaled by its own amax at the GEMM that reads it (the
// first step included: no history), fp32 sums of the fp8 products divided by both scales.
TEST(PrecisionPolicy, Fp8TensorwiseScalesByTheCurrentAmax) {
  LinearCase c;
  Fp8Recipe r = make_fp8_recipe("hybrid", 0, 1, "most_recent");
  r.scaling = Fp8Scaling::tensorwise;
  auto p = make_fp8_policy(r, nullptr);
  EXPECT_STREQ(p->name(), "fp8 hybrid tensorwise");
  auto scaled = [](const std::vector<float>& v, Fp8Format f, float* scale) {
    *scale = fp8_max(f) / abs_max(v.data(), int64_t(v.size()));
    return fp8_values(v, *scale, f);
  };
  float sx, sw, sg;
  const auto xq = scaled(c.x, Fp8Format::e4m3, &sx), Wq = scaled(c.W, Fp8Format::e4m3, &sw),
             gq = scaled(c.dy, Fp8Format::e5m2, &sg);
  std::vector<float> y(size_t(c.N * c.out)), ref(y.size());
  p->forward(0, y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
  gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f / (sx * sw), xq.data(), c.in, Wq.data(), c.in, 0.0f, ref.data(),
           c.out);
  expect_close_to_fp32(y, ref, c.in);
  std::vector<float> dW(c.W.size(), 0.25f), dW_ref = dW, dx(c.x.size()), dx_ref(c.x.size());
  p->weight_grad(0, dW.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
  gemm_f32(Trans::T, Trans::N, c.out, c.in, c.N, 1.0f / (sg * sx), gq.data(), c.out, xq.data(), c.in, 1.0f,
           dW_ref.data(), c.in);
  expect_close_to_fp32(dW, dW_ref, c.N);
  p->input_grad(0, dx.data(), c.dy.data(), c.W.data(), c.N, c.in, c.out, false);
  gemm_f32(Trans::N, Trans::N, c.N, c.in, c.out, 1.0f / (sg * sw), gq.data(), c.out, Wq.data(), c.in, 0.0f,
           dx_ref.data(), c.in);
  expect_close_to_fp32(dx, dx_ref, c.out);
  // Nothing is carried: no scaling state, and other inputs are scaled by their own amax at once.
  p->finish_step();
  EXPECT_TRUE(p->scaling_state().empty());
  std::vector<float> x2 = c.x;
  for (float& v : x2) v *= 1000.0f;
  p->forward(0, y.data(), x2.data(), c.W.data(), c.N, c.in, c.out);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], 1000.0f * ref[i], 1e-2 * (1.0 + 1000.0 * std::fabs(ref[i])));
}

// The block recipes: each GEMM operand quantized in blocks along the GEMM's inner dimension
// (the forward's and input gradient's along the rows of x and dy, the weight gradient's down
// the tokens), weights in 128 x 128 blocks (blockwise) or 1 x 32 / 32 x 1 (mxfp8), then
// multiplied as the values they stand for. Shapes with partial blocks in every direction.
TEST(PrecisionPolicy, Fp8BlockRecipesQuantizeAlongTheInnerDimension) {
  const int64_t N = 150, in = 200, out = 136;
  const auto x = random_floats(size_t(N * in), 21, -3, 3), W = random_floats(size_t(out * in), 22, -0.5, 0.5),
             dy = random_floats(size_t(N * out), 23, -1, 1);
  auto blocked = [](const std::vector<float>& v, int64_t rows, int64_t cols, Fp8Blocks b, Fp8Format f) {
    std::vector<uint16_t> q(v.size());
    quantize_fp8_blocks(q.data(), v.data(), rows, cols, b, f);
    return widen(q);
  };
  for (Fp8Scaling s : {Fp8Scaling::blockwise, Fp8Scaling::mxfp8}) {
    SCOPED_TRACE(fp8_scaling_name(s));
    Fp8Recipe r = make_fp8_recipe("hybrid", 0, 1, "most_recent");
    r.scaling = s;
    auto p = make_fp8_policy(r, nullptr);
    const bool mx = s == Fp8Scaling::mxfp8;
    const int64_t B = mx ? 32 : 128;
    const Fp8BlockScale rule = mx ? Fp8BlockScale::e8m0 : Fp8BlockScale::pow2;
    const Fp8Blocks along_rows{1, B, rule}, down_columns{B, 1, rule};
    const Fp8Blocks w_fprop = mx ? along_rows : Fp8Blocks{128, 128, rule}, w_dgrad = mx ? down_columns : w_fprop;
    const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
    std::vector<float> y(size_t(N * out)), ref(y.size());
    p->forward(0, y.data(), x.data(), W.data(), N, in, out);
    gemm_f32(Trans::N, Trans::T, N, out, in, 1.0f, blocked(x, N, in, along_rows, e4).data(), in,
             blocked(W, out, in, w_fprop, e4).data(), in, 0.0f, ref.data(), out);
    expect_close_to_fp32(y, ref, in);
    std::vector<float> dW(W.size(), 0.25f), dW_ref = dW, dx(x.size()), dx_ref(x.size());
    p->weight_grad(0, dW.data(), dy.data(), x.data(), N, in, out);
    gemm_f32(Trans::T, Trans::N, out, in, N, 1.0f, blocked(dy, N, out, down_columns, e5).data(), out,
             blocked(x, N, in, down_columns, e4).data(), in, 1.0f, dW_ref.data(), in);
    expect_close_to_fp32(dW, dW_ref, N);
    p->input_grad(0, dx.data(), dy.data(), W.data(), N, in, out, false);
    gemm_f32(Trans::N, Trans::N, N, in, out, 1.0f, blocked(dy, N, out, along_rows, e5).data(), out,
             blocked(W, out, in, w_dgrad, e4).data(), in, 0.0f, dx_ref.data(), in);
    expect_close_to_fp32(dx, dx_ref, out);
    EXPECT_TRUE(p->scaling_state().empty());
  }
}

// The weights Fp8Params::unquantized names (the output layer; --first-last-layers-bf16's layers)
// take the other format's GEMMs bit for bit (bf16 or fp16, fp32 without one), the others fp8's.
TEST(PrecisionPolicy, Fp8LeavesTheUnquantizedWeightsToTheOtherFormat) {
  LinearCase c;
  Fp8Recipe r = make_fp8_recipe("hybrid", 0, 1, "most_recent");
  r.scaling = Fp8Scaling::tensorwise;
  struct Out {
    std::vector<float> y, dW, dx;
  };
  auto run = [&](GemmPolicy& p, int param) {
    Out o{std::vector<float>(size_t(c.N * c.out)), std::vector<float>(c.W.size(), 0.5f), std::vector<float>(c.x.size())};
    p.forward(param, o.y.data(), c.x.data(), c.W.data(), c.N, c.in, c.out);
    p.weight_grad(param, o.dW.data(), c.dy.data(), c.x.data(), c.N, c.in, c.out);
    p.input_grad(param, o.dx.data(), c.dy.data(), c.W.data(), c.N, c.in, c.out, false);
    return o;
  };
  auto expect_same = [](const Out& a, const Out& b, const char* what) {
    EXPECT_EQ(a.y, b.y) << what;
    EXPECT_EQ(a.dW, b.dW) << what;
    EXPECT_EQ(a.dx, b.dx) << what;
  };
  for (std::optional<HalfFormat> format : {std::optional<HalfFormat>{HalfFormat::bf16},
                                           std::optional<HalfFormat>{HalfFormat::fp16}, std::optional<HalfFormat>{}}) {
    Fp8Params params;
    params.unquantized = {false, true};
    params.unquantized_format = format;
    auto mixed = make_fp8_policy(r, nullptr, nullptr, params);
    EXPECT_TRUE(mixed->fp8());
    EXPECT_STREQ(mixed->name(), "fp8 hybrid tensorwise");
    auto fp8 = make_fp8_policy(r, nullptr);
    expect_same(run(*mixed, 0), run(*fp8, 0), "a quantized weight");
    std::unique_ptr<MixedPrecisionPolicy> other = format ? make_half_precision_policy(*format) : nullptr;
    Out want;
    if (other) {
      want = run(*other, 1);
    } else {
      want = Out{std::vector<float>(size_t(c.N * c.out)), std::vector<float>(c.W.size(), 0.5f), std::vector<float>(c.x.size())};
      gemm_f32(Trans::N, Trans::T, c.N, c.out, c.in, 1.0f, c.x.data(), c.in, c.W.data(), c.in, 0.0f, want.y.data(), c.out);
      gemm_f32(Trans::T, Trans::N, c.out, c.in, c.N, 1.0f, c.dy.data(), c.out, c.x.data(), c.in, 1.0f, want.dW.data(), c.in);
      gemm_f32(Trans::N, Trans::N, c.N, c.in, c.out, 1.0f, c.dy.data(), c.out, c.W.data(), c.in, 0.0f, want.dx.data(), c.in);
    }
    expect_same(run(*mixed, 1), want, "an unquantized weight");
    EXPECT_NE(run(*mixed, 1).y, run(*fp8, 1).y);
  }
}

// Why blocks: one outlier token costs a tensorwise GEMM the precision of every other token
// (their values fall among e4m3's subnormals), a block-scaled one only its own row's.
TEST(PrecisionPolicy, Fp8BlockScalesConfineAnOutlier) {
  const int64_t N = 64, in = 64, out = 32;
  auto x = random_floats(size_t(N * in), 31, -0.01f, 0.01f);
  x[5] = 1000.0f;  // token 0
  const auto W = random_floats(size_t(out * in), 32, -0.5, 0.5);
  std::vector<float> exact(size_t(N * out));
  gemm_f32(Trans::N, Trans::T, N, out, in, 1.0f, x.data(), in, W.data(), in, 0.0f, exact.data(), out);
  auto error_without_token_0 = [&](Fp8Scaling s) {
    Fp8Recipe r;
    r.scaling = s;
    auto p = make_fp8_policy(r, nullptr);
    std::vector<float> y(exact.size());
    p->forward(0, y.data(), x.data(), W.data(), N, in, out);
    double err = 0, norm = 0;
    for (size_t i = size_t(out); i < y.size(); ++i) err += std::pow(y[i] - exact[i], 2), norm += std::pow(exact[i], 2);
    return std::sqrt(err / norm);
  };
  EXPECT_GT(error_without_token_0(Fp8Scaling::tensorwise), 0.1);
  EXPECT_LT(error_without_token_0(Fp8Scaling::blockwise), 0.05);
  EXPECT_LT(error_without_token_0(Fp8Scaling::mxfp8), 0.05);
}

}  // namespace
}  // namespace lattice
