// The cuBLASLt GEMM facade against the CPU gemm_f32 on host copies of the same random
// inputs: every Trans combination, odd shapes, leading dimensions wider than the rows,
// non-trivial alpha/beta, and the fused bias / bias+GELU / bf16-output variants.
//
// Tolerance (every fp32-accumulating variant): |gpu - cpu| <= 1e-5 * S, where
// S = |alpha| sum_k |a_ik b_kj| + |beta c_ij| (+ |bias_j|). Both sides sum the same
// products in fp32 in different orders; each sum's rounding error is at most ~K u S
// (u = 2^-24; K = 129: 7.7e-6 S) and in practice ~sqrt(K) u S (7e-7 S), so 1e-5 S holds
// with margin while any indexing or transpose mistake (an O(S) error) fails. bf16
// inputs: the product of two bf16 values is exact in fp32, so the CPU reference on the
// widened values sees the same products and the same bound applies. TF32 (10-bit
// mantissa inputs) would miss it by ~100x, which is the check that fp32 stays fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "blas/gemm.h"
#include "blas/gemm_cuda.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/activation.h"
#include "kernels/cast.h"
#if LATTICE_SIMT_TESTS
#include "../simt/simt_state.h"  // set_cublaslt_refuses_epilogues
#endif

namespace lattice {
namespace {

using cuda_test::download;
using cuda_test::upload;

constexpr double kRel = 1e-5;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Rounds every value to bf16 (so bf16 and fp32 copies hold the same numbers).
std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    b[i] = fp32_to_bf16(v[i]);
    v[i] = bf16_to_fp32(b[i]);
  }
  return b;
}

struct Case {
  Trans ta, tb;
  int64_t M, N, K;
  int64_t pad_a, pad_b, pad_c;  // leading dimension = row width + pad
  float alpha, beta;
  std::string name() const {
    std::ostringstream o;
    o << "ta=" << (ta == Trans::T ? 'T' : 'N') << " tb=" << (tb == Trans::T ? 'T' : 'N') << " M=" << M << " N=" << N
      << " K=" << K << " pads=" << pad_a << "," << pad_b << "," << pad_c << " alpha=" << alpha << " beta=" << beta;
    return o.str();
  }
};

// Host operands of a case, with their leading dimensions.
struct Operands {
  int64_t lda, ldb, ldc, rows_a, rows_b;
  std::vector<float> A, B, C;
  Operands(const Case& c, uint32_t seed) {
    const int64_t wa = c.ta == Trans::T ? c.M : c.K, wb = c.tb == Trans::T ? c.K : c.N;
    rows_a = c.ta == Trans::T ? c.K : c.M;
    rows_b = c.tb == Trans::T ? c.N : c.K;
    lda = wa + c.pad_a;
    ldb = wb + c.pad_b;
    ldc = c.N + c.pad_c;
    A = random_vec(size_t(rows_a * lda), seed);
    B = random_vec(size_t(rows_b * ldb), seed + 1);
    C = random_vec(size_t(c.M * ldc), seed + 2);
  }
};

// S[i,j] = |alpha| sum_k |op(A)_ik op(B)_kj| + |beta C_ij|: the scale of the rounding error.
std::vector<double> error_scale(const Case& c, const Operands& o) {
  std::vector<double> s(size_t(c.M * c.N), 0.0);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const float a = c.ta == Trans::T ? o.A[size_t(k * o.lda + i)] : o.A[size_t(i * o.lda + k)];
        const float b = c.tb == Trans::T ? o.B[size_t(j * o.ldb + k)] : o.B[size_t(k * o.ldb + j)];
        acc += std::fabs(double(a) * double(b));
      }
      s[size_t(i * c.N + j)] = std::fabs(double(c.alpha)) * acc + std::fabs(double(c.beta) * o.C[size_t(i * o.ldc + j)]);
    }
  return s;
}

// Compares got[i*ld + j] with want[i*ld + j] for the [M,N] block (tol(i,j) each) and the
// padding columns j >= N, which must be untouched (equal to `orig`).
template <typename Tol>
::testing::AssertionResult compare(const std::string& what, int64_t M, int64_t N, int64_t ld,
                                   const std::vector<float>& got, const std::vector<float>& want,
                                   const std::vector<float>& orig, Tol tol) {
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < ld; ++j) {
      const size_t at = size_t(i * ld + j);
      const bool in_block = j < N;
      const double err = in_block ? std::fabs(double(got[at]) - double(want[at])) : 0.0;
      const bool ok = in_block ? (err <= tol(i, j)) : (std::memcmp(&got[at], &orig[at], sizeof(float)) == 0);
      if (!ok && bad++ == 0) {
        first << " first at [" << i << "," << j << "]" << (in_block ? "" : " (padding, must be untouched)")
              << ": gpu " << got[at] << " cpu " << (in_block ? want[at] : orig[at]);
        if (in_block) first << " |diff| " << err << " > tol " << tol(i, j);
      }
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " wrong elements of " << M << "x" << ld << ";"
                                       << first.str();
}

std::vector<Case> trans_cases(float alpha, float beta) {
  std::vector<Case> cs;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) cs.push_back({ta, tb, 37, 65, 129, 3, 5, 7, alpha, beta});
  return cs;
}

std::vector<Case> all_cases() {
  std::vector<Case> cs = trans_cases(0.75f, -1.25f);
  cs.push_back({Trans::N, Trans::N, 128, 256, 512, 0, 0, 0, 1.0f, 0.0f});  // aligned, tensor-core sized
  cs.push_back({Trans::T, Trans::N, 1, 65, 129, 0, 0, 0, 2.0f, 1.0f});     // one row
  cs.push_back({Trans::N, Trans::T, 37, 1, 3, 1, 1, 1, 1.0f, 0.5f});       // one column
  return cs;
}

// CPU reference on fp32 host copies.
std::vector<float> cpu_gemm(const Case& c, const Operands& o) {
  std::vector<float> want = o.C;
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, want.data(), o.ldc);
  return want;
}

TEST(CudaGemm, F32MatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  uint32_t seed = 100;
  for (const Case& c : all_cases()) {
    Operands o(c, seed += 10);
    const std::vector<float> want = cpu_gemm(c, o);
    const std::vector<double> s = error_scale(c, o);
    auto dA = upload(o.A), dB = upload(o.B), dC = upload(o.C);
    cuda::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<float>(), o.lda, dB.as<float>(), o.ldb, c.beta,
                   dC.as<float>(), o.ldc);
    const std::vector<float> got = download<float>(dC, o.C.size());
    EXPECT_TRUE(compare("gemm_f32 " + c.name(), c.M, c.N, o.ldc, got, want, o.C,
                        [&](int64_t i, int64_t j) { return kRel * s[size_t(i * c.N + j)]; }));
  }
}

TEST(CudaGemm, Bf16MatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  uint32_t seed = 200;
  for (const Case& c : all_cases()) {
    Operands o(c, seed += 10);
    const std::vector<uint16_t> A16 = to_bf16(o.A), B16 = to_bf16(o.B);  // o.A/o.B now hold the bf16 values
    const std::vector<float> want = cpu_gemm(c, o);
    const std::vector<double> s = error_scale(c, o);
    auto dA = upload(A16), dB = upload(B16), dC = upload(o.C);
    cuda::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<uint16_t>(), o.lda, dB.as<uint16_t>(), o.ldb, c.beta,
                    dC.as<float>(), o.ldc);
    const std::vector<float> got = download<float>(dC, o.C.size());
    EXPECT_TRUE(compare("gemm_bf16 " + c.name(), c.M, c.N, o.ldc, got, want, o.C,
                        [&](int64_t i, int64_t j) { return kRel * s[size_t(i * c.N + j)]; }));
  }
}

// C in bf16: the fp32 result r (error e = 1e-5 S against the CPU) rounded once to bf16
// (relative error at most 2^-8), so |got - r_cpu| <= 2^-8 (|r_cpu| + e) + e.
TEST(CudaGemm, Bf16OutputMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  uint32_t seed = 300;
  for (const Case& c : all_cases()) {
    Operands o(c, seed += 10);
    const std::vector<uint16_t> A16 = to_bf16(o.A), B16 = to_bf16(o.B), C16 = to_bf16(o.C);
    const std::vector<float> want = cpu_gemm(c, o);
    const std::vector<double> s = error_scale(c, o);
    auto dA = upload(A16), dB = upload(B16), dC = upload(C16);
    cuda::gemm_bf16_out(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<uint16_t>(), o.lda, dB.as<uint16_t>(), o.ldb,
                        c.beta, dC.as<uint16_t>(), o.ldc);
    const std::vector<uint16_t> got16 = download<uint16_t>(dC, C16.size());
    std::vector<float> got(got16.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_fp32(got16[i]);
    EXPECT_TRUE(compare("gemm_bf16_out " + c.name(), c.M, c.N, o.ldc, got, want, o.C, [&](int64_t i, int64_t j) {
      const double e = kRel * s[size_t(i * c.N + j)];
      return std::ldexp(1.0, -8) * (std::fabs(double(want[size_t(i * o.ldc + j)])) + e) + e;
    }));
  }
}

// beta = 0 never reads C (NaN there must not leak), as the CPU BLAS convention.
TEST(CudaGemm, BetaZeroIgnoresC) {
  LATTICE_REQUIRE_CUDA();
  const Case c{Trans::N, Trans::T, 37, 65, 129, 3, 5, 7, 1.5f, 0.0f};
  Operands o(c, 400);
  std::vector<float> filled = o.C;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) filled[size_t(i * o.ldc + j)] = std::nanf("");
  std::vector<float> want = filled;
  gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f, want.data(), o.ldc);
  o.C.assign(o.C.size(), 0.0f);  // the error scale of beta * C is 0
  const std::vector<double> s = error_scale(c, o);
  auto dA = upload(o.A), dB = upload(o.B), dC = upload(filled);
  cuda::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<float>(), o.lda, dB.as<float>(), o.ldb, 0.0f,
                 dC.as<float>(), o.ldc);
  const std::vector<float> got = download<float>(dC, filled.size());
  EXPECT_TRUE(compare("gemm_f32 beta=0 over NaN " + c.name(), c.M, c.N, o.ldc, got, want, filled,
                      [&](int64_t i, int64_t j) { return kRel * s[size_t(i * c.N + j)]; }));
}

// K = 0: the product is empty, C = beta C.
TEST(CudaGemm, EmptyInnerDimensionScalesC) {
  LATTICE_REQUIRE_CUDA();
  const int64_t M = 5, N = 7, ldc = 9;
  std::vector<float> C = random_vec(size_t(M * ldc), 500), want = C;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) want[size_t(i * ldc + j)] *= 0.5f;
  auto dA = upload(std::vector<float>(1)), dB = upload(std::vector<float>(1)), dC = upload(C);
  cuda::gemm_f32(Trans::N, Trans::N, M, N, 0, 1.0f, dA.as<float>(), 1, dB.as<float>(), N, 0.5f, dC.as<float>(), ldc);
  const std::vector<float> got = download<float>(dC, C.size());
  EXPECT_TRUE(compare("gemm_f32 K=0", M, N, ldc, got, want, C, [](int64_t, int64_t) { return 0.0; }));

  // A bf16 C: halving is exact in bf16 (the values are normal), a NaN stays a NaN, and
  // beta = 0 clears C, NaNs included (as cuBLASLt does not read C when beta is 0).
  std::vector<float> Cf = random_vec(size_t(M * ldc), 501), want16 = Cf;
  std::vector<uint16_t> C16 = to_bf16(Cf);
  C16[3] = 0x7fc1;  // a NaN in the product's block (row 0, column 3)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) want16[size_t(i * ldc + j)] = 0.5f * Cf[size_t(i * ldc + j)];
  auto d16 = upload(C16);
  cuda::gemm_bf16_out(Trans::N, Trans::N, M, N, 0, 1.0f, nullptr, 1, nullptr, N, 0.5f, d16.as<uint16_t>(), ldc);
  std::vector<uint16_t> got16 = download<uint16_t>(d16, C16.size());
  EXPECT_TRUE(std::isnan(bf16_to_fp32(got16[3]))) << "bf16 K=0: the NaN became " << bf16_to_fp32(got16[3]);
  got16[3] = fp32_to_bf16(want16[3]);
  std::vector<float> got16f(got16.size());
  for (size_t i = 0; i < got16.size(); ++i) got16f[i] = bf16_to_fp32(got16[i]);
  EXPECT_TRUE(compare("gemm_bf16_out K=0 beta=0.5", M, N, ldc, got16f, want16, Cf, [](int64_t, int64_t) { return 0.0; }));
  cuda::gemm_bf16_out(Trans::N, Trans::N, M, N, 0, 1.0f, nullptr, 1, nullptr, N, 0.0f, d16.as<uint16_t>(), ldc);
  got16 = download<uint16_t>(d16, C16.size());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) EXPECT_EQ(got16[size_t(i * ldc + j)], 0) << "bf16 K=0 beta=0 at " << i << "," << j;
}

// Misaligned pointers (one element in) must still be handled (the plan is keyed by alignment).
TEST(CudaGemm, MisalignedPointers) {
  LATTICE_REQUIRE_CUDA();
  const Case c{Trans::T, Trans::N, 37, 65, 129, 3, 5, 7, -0.5f, 2.0f};
  Operands o(c, 600);
  const std::vector<float> want = cpu_gemm(c, o);
  const std::vector<double> s = error_scale(c, o);
  std::vector<float> A1(o.A.size() + 1), B1(o.B.size() + 1), C1(o.C.size() + 1);
  std::copy(o.A.begin(), o.A.end(), A1.begin() + 1);
  std::copy(o.B.begin(), o.B.end(), B1.begin() + 1);
  std::copy(o.C.begin(), o.C.end(), C1.begin() + 1);
  auto dA = upload(A1), dB = upload(B1), dC = upload(C1);
  cuda::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<float>() + 1, o.lda, dB.as<float>() + 1, o.ldb, c.beta,
                 dC.as<float>() + 1, o.ldc);
  const std::vector<float> got1 = download<float>(dC, C1.size());
  const std::vector<float> got(got1.begin() + 1, got1.end());
  EXPECT_TRUE(compare("gemm_f32 misaligned " + c.name(), c.M, c.N, o.ldc, got, want, o.C,
                      [&](int64_t i, int64_t j) { return kRel * s[size_t(i * c.N + j)]; }));
}

// bf16 operands one element in (2-byte alignment: a bf16 slice at an odd offset of a flat
// buffer), for every Trans combination.
TEST(CudaGemm, MisalignedBf16Pointers) {
  LATTICE_REQUIRE_CUDA();
  uint32_t seed = 650;
  for (const Case& c : trans_cases(0.75f, 0.5f)) {
    Operands o(c, seed += 10);
    const std::vector<uint16_t> A16 = to_bf16(o.A), B16 = to_bf16(o.B);
    const std::vector<float> want = cpu_gemm(c, o);
    const std::vector<double> s = error_scale(c, o);
    std::vector<uint16_t> A1(A16.size() + 1), B1(B16.size() + 1);
    std::vector<float> C1(o.C.size() + 1);
    std::copy(A16.begin(), A16.end(), A1.begin() + 1);
    std::copy(B16.begin(), B16.end(), B1.begin() + 1);
    std::copy(o.C.begin(), o.C.end(), C1.begin() + 1);
    auto dA = upload(A1), dB = upload(B1), dC = upload(C1);
    cuda::gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA.as<uint16_t>() + 1, o.lda, dB.as<uint16_t>() + 1, o.ldb,
                    c.beta, dC.as<float>() + 1, o.ldc);
    const std::vector<float> got1 = download<float>(dC, C1.size());
    const std::vector<float> got(got1.begin() + 1, got1.end());
    EXPECT_TRUE(compare("gemm_bf16 misaligned " + c.name(), c.M, c.N, o.ldc, got, want, o.C,
                        [&](int64_t i, int64_t j) { return kRel * s[size_t(i * c.N + j)]; }));
  }
}

// The hot loop: a repeated shape reuses its plan (no new heuristic query).
TEST(CudaGemm, PlansAreCachedPerShape) {
  LATTICE_REQUIRE_CUDA();
  const Case c{Trans::N, Trans::N, 37, 65, 129, 0, 0, 0, 1.0f, 0.0f};
  Operands o(c, 700);
  auto dA = upload(o.A), dB = upload(o.B), dC = upload(o.C);
  auto call = [&] {
    cuda::gemm_f32(c.ta, c.tb, c.M, c.N, c.K, 1.0f, dA.as<float>(), o.lda, dB.as<float>(), o.ldb, 0.0f,
                   dC.as<float>(), o.ldc);
  };
  call();
  const int64_t plans = cuda::gemm_plan_cache_size();
  for (int i = 0; i < 5; ++i) call();
  cuda::synchronize();
  EXPECT_EQ(cuda::gemm_plan_cache_size(), plans) << "a repeated GEMM shape made a new plan";
}

// Bias per output feature (bias[N]) added to every row: S gains |bias_j|. Returns whether
// the unfused epilogue ran.
bool check_bias(const Case& c, uint32_t seed) {
  Operands o(c, seed);
  const std::vector<uint16_t> A16 = to_bf16(o.A), B16 = to_bf16(o.B);
  const std::vector<float> bias = random_vec(size_t(c.N), seed + 5);
  std::vector<float> want = cpu_gemm(c, o);  // beta = 0
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) want[size_t(i * o.ldc + j)] += bias[size_t(j)];
  o.C.assign(o.C.size(), 0.0f);
  const std::vector<double> s = error_scale(c, o);
  std::vector<float> init = random_vec(o.C.size(), seed + 6);  // overwritten (padding kept)
  auto dA = upload(A16), dB = upload(B16), dC = upload(init), dbias = upload(bias);
  const int64_t fallbacks = cuda::gemm_epilogue_fallbacks();
  cuda::gemm_bf16_bias(c.ta, c.tb, c.M, c.N, c.K, dA.as<uint16_t>(), o.lda, dB.as<uint16_t>(), o.ldb,
                       dbias.as<float>(), dC.as<float>(), o.ldc);
  const std::vector<float> got = download<float>(dC, init.size());
  const bool fell_back = cuda::gemm_epilogue_fallbacks() != fallbacks;
  EXPECT_TRUE(compare("gemm_bf16_bias " + c.name() + (fell_back ? " (unfused)" : " (fused)"), c.M, c.N, o.ldc, got,
                      want, init, [&](int64_t i, int64_t j) {
                        return kRel * (s[size_t(i * c.N + j)] + std::fabs(double(bias[size_t(j)])));
                      }));
  return fell_back;
}

TEST(CudaGemm, Bf16BiasMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  std::vector<Case> cs = trans_cases(1.0f, 0.0f);
  cs.push_back({Trans::N, Trans::T, 64, 128, 256, 0, 0, 0, 1.0f, 0.0f});  // the Linear layer's layout, aligned
  uint32_t seed = 800;
  for (const Case& c : cs)
    if (check_bias(c, seed += 10)) std::printf("  gemm_bf16_bias %s: unfused epilogue\n", c.name().c_str());
}

// pre = op(A) op(B) + bias (checked as gemm_bf16_bias), C = gelu_tanh(pre). The GELU
// is checked against the CPU tanh GELU of the GPU's own pre values, so it is isolated
// from the GEMM's rounding: the fused epilogue may evaluate tanh with the hardware
// approximation (relative error <= 2^-11), giving |dC| <= 0.5 |x| 2^-11; we allow
// 0.5 |x| 2^-10 + 1e-6 (fp32 rounding of the surrounding products).
void check_bias_gelu(const Case& c, int64_t ld_pre, uint32_t seed, bool expect_fallback) {
  Operands o(c, seed);
  const std::vector<uint16_t> A16 = to_bf16(o.A), B16 = to_bf16(o.B);
  const std::vector<float> bias = random_vec(size_t(c.N), seed + 5);
  std::vector<float> prod = cpu_gemm(c, o);  // beta = 0; ldc layout
  std::vector<float> want_pre(size_t(c.M * ld_pre), 0.0f);
  o.C.assign(o.C.size(), 0.0f);
  const std::vector<double> s = error_scale(c, o);
  std::vector<float> init_c = random_vec(o.C.size(), seed + 6), init_pre = random_vec(want_pre.size(), seed + 7);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < ld_pre; ++j)
      want_pre[size_t(i * ld_pre + j)] =
          j < c.N ? prod[size_t(i * o.ldc + j)] + bias[size_t(j)] : init_pre[size_t(i * ld_pre + j)];
  auto dA = upload(A16), dB = upload(B16), dC = upload(init_c), dpre = upload(init_pre), dbias = upload(bias);
  const int64_t fallbacks = cuda::gemm_epilogue_fallbacks();
  cuda::gemm_bf16_bias_gelu(c.ta, c.tb, c.M, c.N, c.K, dA.as<uint16_t>(), o.lda, dB.as<uint16_t>(), o.ldb,
                            dbias.as<float>(), dC.as<float>(), o.ldc, dpre.as<float>(), ld_pre);
  const std::vector<float> got_c = download<float>(dC, init_c.size());
  const std::vector<float> got_pre = download<float>(dpre, init_pre.size());
  const bool fell_back = cuda::gemm_epilogue_fallbacks() != fallbacks;
  const std::string what = c.name() + " ld_pre=" + std::to_string(ld_pre) + (fell_back ? " (unfused)" : " (fused)");
  if (expect_fallback) EXPECT_TRUE(fell_back) << what << ": ld_pre not divisible by 8 must use the unfused kernel";
  EXPECT_TRUE(compare("gemm_bf16_bias_gelu pre " + what, c.M, c.N, ld_pre, got_pre, want_pre, init_pre,
                      [&](int64_t i, int64_t j) {
                        return kRel * (s[size_t(i * c.N + j)] + std::fabs(double(bias[size_t(j)])));
                      }));
  // CPU tanh GELU of the GPU's pre values, in C's layout.
  std::vector<float> x(size_t(c.M * c.N)), g(size_t(c.M * c.N));
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) x[size_t(i * c.N + j)] = got_pre[size_t(i * ld_pre + j)];
  gelu_forward(g.data(), x.data(), int64_t(x.size()), GeluKind::tanh);
  std::vector<float> want_c = init_c;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) want_c[size_t(i * o.ldc + j)] = g[size_t(i * c.N + j)];
  EXPECT_TRUE(compare("gemm_bf16_bias_gelu out " + what, c.M, c.N, o.ldc, got_c, want_c, init_c,
                      [&](int64_t i, int64_t j) {
                        return 0.5 * std::fabs(double(x[size_t(i * c.N + j)])) * std::ldexp(1.0, -10) + 1e-6;
                      }));
}

TEST(CudaGemm, Bf16BiasGeluMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  uint32_t seed = 900;
  for (const Case& c : trans_cases(1.0f, 0.0f)) {
    check_bias_gelu(c, 72, seed += 10, false);  // 72 >= N = 65, divisible by 8: fused when supported
    check_bias_gelu(c, 65, seed += 10, true);   // not divisible by 8: the unfused kernel
  }
  check_bias_gelu({Trans::N, Trans::T, 64, 128, 256, 0, 0, 0, 1.0f, 0.0f}, 128, seed + 10, false);
}

#if LATTICE_SIMT_TESTS
// A cuBLASLt whose heuristic has no fused kernel for an epilogue (the emulation refuses
// them on request): both epilogue GEMMs run the plain GEMM and lattice's own epilogue
// kernel, with the fused path's results. Shapes of their own, so no cached plan answers.
TEST(CudaGemm, UnfusedEpiloguesWhenCublasLtHasNoKernel) {
  LATTICE_REQUIRE_CUDA();
  simt::set_cublaslt_refuses_epilogues(true);
  uint32_t seed = 950;
  for (Case c : trans_cases(1.0f, 0.0f)) {
    c.M += 2;  // 39 rows: shapes no other test plans
    EXPECT_TRUE(check_bias(c, seed += 10)) << c.name() << ": the fused epilogue ran";
    check_bias_gelu(c, 72, seed += 10, true);
  }
  simt::set_cublaslt_refuses_epilogues(false);
}
#endif

TEST(CudaGemm, BadLeadingDimensionNamesTheShape) {
  LATTICE_REQUIRE_CUDA();
  cuda::DeviceBuffer d(64 * sizeof(float));
  try {
    cuda::gemm_f32(Trans::N, Trans::N, 4, 4, 4, 1.0f, d.as<float>(), 3, d.as<float>(), 4, 0.0f, d.as<float>(), 4);
    FAIL() << "lda < K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("M=4 N=4 K=4 lda=3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lattice
