// The host emulation of cuBLASLt (tests/simt/simt_cublaslt.cpp) against a direct reference
// written here from the same documented definitions (cuBLAS Library User Guide, cuBLASLt
// sections; cublasLt.h):
//   x = fp32(alpha * fp32(sum_l op(A)(i,l) op(B)(l,j)) + beta * C(i,j) + bias[i])
//   D(i,j) = round_to_Dtype(act(x)),   aux(i,j) = round_to_Dtype(x)   (GELU_AUX variants)
// with bias one element per ROW of D, GELU the documented tanh approximation, RELU
// max(x, 0), round to nearest even. The format conversions here are independent of
// lattice's (frexp / nearbyint).
//
// Inputs are multiples of 1/8 in [-2, 2] (exact in bf16 and fp16), so every product and
// sum is exact: the emulation must match the reference bit for bit, except the GELU
// epilogues, where the two evaluations of tanh may differ by one unit in the last place
// of the output format.
#include <gtest/gtest.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "blas/cuda/cublaslt_api.h"

namespace lattice::cuda {
namespace {

// ---- Independent format conversions ------------------------------------------------------

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// x rounded to bf16's 8 significant bits, nearest even (normal range).
float round_bf16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e;
  std::frexp(x, &e);  // |x| = f * 2^e, f in [0.5, 1)
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(double(x), 8 - e)), e - 8));
}
// x rounded to fp16: 11 significant bits, spacing 2^-24 below 2^-14 (subnormals), values
// rounding past 65504 overflow to inf.
float round_fp16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e;
  std::frexp(x, &e);
  const int exponent = std::max(e, -13);
  const double r = std::ldexp(std::nearbyint(std::ldexp(double(x), 11 - exponent)), exponent - 11);
  return std::fabs(r) > 65504.0 ? std::copysign(std::numeric_limits<float>::infinity(), x) : static_cast<float>(r);
}

float fp16_bits_to_float(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return static_cast<float>(m ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL);
  return static_cast<float>(sign * (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25)));
}

// The bits of an fp16-representable value.
uint16_t float_to_fp16_bits(float r) {
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(double(r));
  if (std::isinf(r)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::ldexp(a, 24));
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) |
         static_cast<uint16_t>(std::ldexp(a, 11 - e) - 1024);
}

float round_to(cudaDataType type, float x) {
  switch (type) {
    case CUDA_R_16BF: return round_bf16(x);
    case CUDA_R_16F: return round_fp16(x);
    default: return x;
  }
}

size_t size_of(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

const char* type_name(cudaDataType type) {
  return type == CUDA_R_32F ? "fp32" : type == CUDA_R_16BF ? "bf16" : "fp16";
}

// ---- Host matrices (column-major, 256-byte-aligned storage, optional byte offset) ---------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

constexpr float kSentinel = 1000.0f;  // exact in bf16 and fp16: marks elements not to touch

class Matrix {
 public:
  Matrix(cudaDataType type, int64_t rows, int64_t cols, int64_t ld, size_t offset_bytes = 0)
      : type_(type), rows_(rows), cols_(cols), ld_(ld), offset_(offset_bytes) {
    const size_t bytes = static_cast<size_t>(ld * cols) * size_of(type) + offset_bytes + 512;
    storage_.reset(static_cast<std::byte*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256)));
    for (int64_t index = 0; index < ld * cols; ++index) set_raw(index, kSentinel);
  }

  cudaDataType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t ld() const { return ld_; }
  void* data() const { return storage_.get() + offset_; }

  float get(int64_t i, int64_t j) const { return get_raw(i + j * ld_); }
  void set(int64_t i, int64_t j, float v) { set_raw(i + j * ld_, v); }

  float get_raw(int64_t index) const {
    const std::byte* p = static_cast<const std::byte*>(data()) + index * size_of(type_);
    if (type_ == CUDA_R_32F) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return type_ == CUDA_R_16BF ? float_of(uint32_t(h) << 16) : fp16_bits_to_float(h);
  }
  void set_raw(int64_t index, float v) {
    std::byte* p = static_cast<std::byte*>(data()) + index * size_of(type_);
    const float r = round_to(type_, v);
    if (type_ == CUDA_R_32F) {
      std::memcpy(p, &r, 4);
    } else if (type_ == CUDA_R_16BF) {
      const uint16_t h = static_cast<uint16_t>(bits_of(r) >> 16);
      std::memcpy(p, &h, 2);
    } else {
      const uint16_t h = float_to_fp16_bits(r);
      std::memcpy(p, &h, 2);
    }
  }

  // Multiples of 1/8 in [-2, 2] in the matrix proper; the padding rows keep the sentinel.
  void fill_random(std::mt19937& rng) {
    std::uniform_int_distribution<int> eighths(-16, 16);
    for (int64_t j = 0; j < cols_; ++j) {
      for (int64_t i = 0; i < rows_; ++i) set(i, j, eighths(rng) / 8.0f);
    }
  }

  // Every element of the storage, padding included.
  std::vector<float> snapshot() const {
    std::vector<float> values(static_cast<size_t>(ld_ * cols_));
    for (int64_t index = 0; index < ld_ * cols_; ++index) values[index] = get_raw(index);
    return values;
  }

 private:
  cudaDataType type_;
  int64_t rows_, cols_, ld_;
  size_t offset_;
  std::unique_ptr<std::byte, FreeDeleter> storage_;
};

// ---- The reference -----------------------------------------------------------------------

struct Epilogue {
  uint32_t value;
  const char* name;
};
constexpr Epilogue kEpilogues[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT"},   {CUBLASLT_EPILOGUE_BIAS, "BIAS"},
    {CUBLASLT_EPILOGUE_RELU, "RELU"},         {CUBLASLT_EPILOGUE_RELU_BIAS, "RELU_BIAS"},
    {CUBLASLT_EPILOGUE_GELU, "GELU"},         {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"},
    {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"}, {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"},
};
bool has_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool has_gelu(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool has_relu(uint32_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }

// The cuBLAS guide's GELU: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * std::pow(x, 3))));
}
// GELU's exact definition x Phi(x), which the epilogue does NOT use.
double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

struct Reference {
  std::vector<float> x;  // the epilogue's input (fp32), m x n column-major, ld m
  std::vector<float> d;  // D's values (rounded to D's type)
};

Reference reference(int transa, int transb, float alpha, float beta, const Matrix& a, const Matrix& b,
                    const Matrix* c, const Matrix* bias, uint32_t epilogue, int64_t m, int64_t n, int64_t k,
                    cudaDataType d_type) {
  Reference r;
  r.x.resize(static_cast<size_t>(m * n));
  r.d.resize(static_cast<size_t>(m * n));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double dot = 0;
      for (int64_t l = 0; l < k; ++l) {
        const float av = transa == CUBLAS_OP_N ? a.get(i, l) : a.get(l, i);
        const float bv = transb == CUBLAS_OP_N ? b.get(l, j) : b.get(j, l);
        dot += double(av) * double(bv);
      }
      double x = double(alpha) * static_cast<float>(dot);
      if (beta != 0.0f) x += double(beta) * c->get(i, j);
      if (has_bias(epilogue)) x += bias->get(i, 0);  // one bias element per row of D
      const float xf = static_cast<float>(x);
      float y = xf;
      if (has_gelu(epilogue)) y = static_cast<float>(gelu_tanh(xf));
      if (has_relu(epilogue)) y = xf > 0.0f ? xf : 0.0f;
      r.x[i + j * m] = xf;
      r.d[i + j * m] = round_to(d_type, y);
    }
  }
  return r;
}

// One unit in the last place of `type` at `v`.
float ulp(cudaDataType type, float v) {
  const int mantissa_bits = type == CUDA_R_32F ? 24 : type == CUDA_R_16BF ? 8 : 11;
  int e;
  std::frexp(v == 0.0f ? 1e-30f : v, &e);
  return static_cast<float>(std::ldexp(1.0, e - mantissa_bits));
}

// ---- API helpers --------------------------------------------------------------------------

const CublasLtApi& lt() { return cublaslt(); }

cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t created = nullptr;
    EXPECT_EQ(lt().Create(&created), CUBLAS_STATUS_SUCCESS);
    return created;
  }();
  return h;
}

cublasLtMatrixLayout_t layout(const Matrix& m) {
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, m.type(), m.rows(), m.cols(), m.ld()), CUBLAS_STATUS_SUCCESS);
  return l;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, T value) {
  ASSERT_EQ(lt().MatmulDescSetAttribute(desc, attr, &value, sizeof value), CUBLAS_STATUS_SUCCESS);
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  ASSERT_EQ(lt().MatmulPreferenceSetAttribute(pref, attr, &value, sizeof value), CUBLAS_STATUS_SUCCESS);
}

cublasLtMatmulDesc_t make_desc(int transa, int transb, uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT) {
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  set_desc<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSA, transa);
  set_desc<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSB, transb);
  set_desc<uint32_t>(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  return desc;
}

// A preference that owns its descriptor.
class Pref {
 public:
  Pref() { EXPECT_EQ(lt().MatmulPreferenceCreate(&pref_), CUBLAS_STATUS_SUCCESS); }
  ~Pref() { EXPECT_EQ(lt().MatmulPreferenceDestroy(pref_), CUBLAS_STATUS_SUCCESS); }
  Pref(const Pref&) = delete;
  Pref& operator=(const Pref&) = delete;
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

struct Query {
  cublasStatus_t status;
  int count;
  cublasLtMatmulHeuristicResult_t result;
};

Query query(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
            cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested = 1) {
  Query q{};
  q.count = -1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(requested, 1)));
  q.status = lt().MatmulAlgoGetHeuristic(handle(), desc, a, b, c, d, pref, requested, results.data(), &q.count);
  q.result = results[0];
  return q;
}

// A whole GEMM problem: operands with ld > rows, a bias vector, an aux buffer.
struct Problem {
  int transa, transb;
  int64_t m, n, k;
  cudaDataType ab_type, cd_type;
  Matrix a, b, c, d, bias, aux;

  Problem(int ta, int tb, int64_t m_, int64_t n_, int64_t k_, cudaDataType ab, cudaDataType cd, uint32_t seed = 7)
      : transa(ta),
        transb(tb),
        m(m_),
        n(n_),
        k(k_),
        ab_type(ab),
        cd_type(cd),
        a(ab, ta == CUBLAS_OP_N ? m_ : k_, ta == CUBLAS_OP_N ? k_ : m_, (ta == CUBLAS_OP_N ? m_ : k_) + 2),
        b(ab, tb == CUBLAS_OP_N ? k_ : n_, tb == CUBLAS_OP_N ? n_ : k_, (tb == CUBLAS_OP_N ? k_ : n_) + 3),
        c(cd, m_, n_, m_ + 1),
        d(cd, m_, n_, m_ + 4),
        bias(cd, m_, 1, m_),
        aux(cd, m_, n_, (m_ + 7) / 8 * 8 + 8) {
    std::mt19937 rng(seed);
    a.fill_random(rng);
    b.fill_random(rng);
    c.fill_random(rng);
    bias.fill_random(rng);
  }

  // D's storage holding C's values (for C == D in place).
  void copy_c_into_d() {
    for (int64_t col = 0; col < n; ++col)
      for (int64_t row = 0; row < m; ++row) d.set(row, col, c.get(row, col));
  }

  Reference expected(float alpha, float beta, uint32_t epilogue) const {
    return reference(transa, transb, alpha, beta, a, b, &c, &bias, epilogue, m, n, k, cd_type);
  }
};

struct Call {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c, d;
};

Call prepare(const Problem& p, uint32_t epilogue) {
  Call call{make_desc(p.transa, p.transb, epilogue), layout(p.a), layout(p.b), layout(p.c), layout(p.d)};
  if (has_bias(epilogue)) set_desc<const void*>(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias.data());
  if (has_aux(epilogue)) {
    set_desc<void*>(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux.data());
    set_desc<int64_t>(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux.ld());
  }
  return call;
}

cublasStatus_t matmul(const Call& call, float alpha, float beta, const void* A, const void* B, const void* C, void* D,
                      const cublasLtMatmulAlgo_t* algo, void* workspace = nullptr, size_t workspace_size = 0) {
  const cublasStatus_t status = lt().Matmul(handle(), call.desc, &alpha, A, call.a, B, call.b, &beta, C, call.c, D,
                                            call.d, algo, workspace, workspace_size, nullptr);
  (void)cudaStreamSynchronize(nullptr);  // the matmul runs in stream order: wait for it
  return status;
}

// Queries the heuristic (default preference) and runs the problem with its algorithm.
cublasStatus_t run(const Problem& p, const Call& call, float alpha, float beta) {
  Pref pref;
  const Query q = query(call.desc, call.a, call.b, call.c, call.d, pref.get());
  if (q.status != CUBLAS_STATUS_SUCCESS) return q.status;
  return matmul(call, alpha, beta, p.a.data(), p.b.data(), p.c.data(), p.d.data(), &q.result.algo);
}

// D (and aux) against the reference; the padding rows (i >= m) keep the sentinel.
void expect_matches(const Problem& p, const Reference& ref, uint32_t epilogue, const std::string& what) {
  const float ulps = has_gelu(epilogue) ? 1.0f : 0.0f;
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.d.ld(); ++i) {
      const float got = p.d.get(i, j);
      if (i >= p.m) {
        ASSERT_EQ(got, kSentinel) << what << ": D padding (" << i << "," << j << ") written";
        continue;
      }
      const float want = ref.d[i + j * p.m];
      ASSERT_LE(std::fabs(got - want), ulps * ulp(p.cd_type, want))
          << what << ": D(" << i << "," << j << ") = " << got << ", reference " << want;
    }
  }
  const std::vector<float> aux = p.aux.snapshot();
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.aux.ld(); ++i) {
      const float got = aux[i + j * p.aux.ld()];
      if (has_aux(epilogue) && i < p.m) {
        // The aux matrix holds GELU's input x (after bias), in D's type.
        ASSERT_EQ(got, round_to(p.cd_type, ref.x[i + j * p.m])) << what << ": aux(" << i << "," << j << ")";
      } else {
        ASSERT_EQ(got, kSentinel) << what << ": aux element " << i << "," << j << " written";
      }
    }
  }
}

struct TypeCombination {
  cudaDataType ab, cd;
};
constexpr TypeCombination kTypeCombinations[] = {
    {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F},
    {CUDA_R_16F, CUDA_R_16F}, {CUDA_R_16F, CUDA_R_32F},
};

const char* op_name(int op) { return op == CUBLAS_OP_N ? "N" : "T"; }

// ---- Results -------------------------------------------------------------------------------

TEST(SimtCublasLt, EveryTransposeAndTypeMatchesTheReference) {
  for (int transa : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (int transb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      for (const TypeCombination& types : kTypeCombinations) {
        for (float beta : {0.0f, -0.5f}) {
          const std::string what = std::string(op_name(transa)) + op_name(transb) + " " + type_name(types.ab) +
                                   "->" + type_name(types.cd) + " beta " + std::to_string(beta);
          Problem p(transa, transb, 5, 3, 7, types.ab, types.cd);
          const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
          ASSERT_EQ(run(p, call, 0.75f, beta), CUBLAS_STATUS_SUCCESS) << what;
          expect_matches(p, p.expected(0.75f, beta, CUBLASLT_EPILOGUE_DEFAULT), CUBLASLT_EPILOGUE_DEFAULT, what);
        }
      }
    }
  }
}

TEST(SimtCublasLt, InexactAlphaRoundsOnceToTheOutputType) {
  // alpha = 0.7 is not a binary fraction: x is rounded to fp32, then to bf16 (nearest even).
  Problem p(CUBLAS_OP_T, CUBLAS_OP_N, 7, 5, 9, CUDA_R_16BF, CUDA_R_16BF, 11);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  ASSERT_EQ(run(p, call, 0.7f, 0.3f), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(0.7f, 0.3f, CUBLASLT_EPILOGUE_DEFAULT), CUBLASLT_EPILOGUE_DEFAULT, "alpha 0.7");
}

TEST(SimtCublasLt, EveryEpilogueMatchesTheReference) {
  for (const Epilogue& epilogue : kEpilogues) {
    for (const TypeCombination& types : {TypeCombination{CUDA_R_32F, CUDA_R_32F},
                                         TypeCombination{CUDA_R_16BF, CUDA_R_16BF},
                                         TypeCombination{CUDA_R_16BF, CUDA_R_32F}}) {
      for (float beta : {0.0f, 0.5f}) {
        const std::string what = std::string(epilogue.name) + " " + type_name(types.ab) + "->" +
                                 type_name(types.cd) + " beta " + std::to_string(beta);
        Problem p(CUBLAS_OP_T, CUBLAS_OP_N, 5, 3, 4, types.ab, types.cd, 3);
        const Call call = prepare(p, epilogue.value);
        ASSERT_EQ(run(p, call, 1.25f, beta), CUBLAS_STATUS_SUCCESS) << what;
        expect_matches(p, p.expected(1.25f, beta, epilogue.value), epilogue.value, what);
      }
    }
  }
}

TEST(SimtCublasLt, BiasIsOneElementPerRowOfD) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  for (int64_t i = 0; i < p.m; ++i) p.bias.set(i, 0, float(10 * (i + 1)));
  const Call plain = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  ASSERT_EQ(run(p, plain, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> without = p.d.snapshot();
  const Call biased = prepare(p, CUBLASLT_EPILOGUE_BIAS);
  ASSERT_EQ(run(p, biased, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.m; ++i) {
      EXPECT_EQ(p.d.get(i, j) - without[i + j * p.d.ld()], float(10 * (i + 1))) << i << "," << j;
    }
  }
}

TEST(SimtCublasLt, GeluIsTheDocumentedTanhApproximation) {
  // 1 x 1 x 1 products: D = GELU(a * b), far enough from 0 that tanh and erf forms differ.
  for (float value : {-2.0f, -0.75f, 0.5f, 1.0f, 1.5f}) {
    Matrix a(CUDA_R_32F, 1, 1, 1), b(CUDA_R_32F, 1, 1, 1), d(CUDA_R_32F, 1, 1, 1);
    a.set(0, 0, value);
    b.set(0, 0, 1.0f);
    Call call{make_desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_GELU), layout(a), layout(b), layout(d), layout(d)};
    ASSERT_EQ(matmul(call, 1.0f, 0.0f, a.data(), b.data(), nullptr, d.data(), nullptr), CUBLAS_STATUS_SUCCESS);
    const float got = d.get(0, 0);
    EXPECT_NEAR(got, gelu_tanh(value), 1e-6 * std::fabs(gelu_tanh(value))) << value;
    EXPECT_GT(std::fabs(got - gelu_erf(value)), 1e-5) << value << ": looks like the erf GELU";
  }
}

TEST(SimtCublasLt, AuxTypeMayBeSetToDType) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_T, 6, 4, 3, CUDA_R_16BF, CUDA_R_16BF);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  set_desc<int32_t>(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, CUDA_R_16BF);
  set_desc<int32_t>(call.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  ASSERT_EQ(run(p, call, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(1.0f, 0.0f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS), CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                 "explicit types");
}

TEST(SimtCublasLt, BetaZeroDoesNotReadC) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.m; ++i) p.c.set(i, j, std::numeric_limits<float>::quiet_NaN());
  }
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  ASSERT_EQ(run(p, call, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT), CUBLASLT_EPILOGUE_DEFAULT, "NaN C");
}

TEST(SimtCublasLt, InPlaceWithCEqualToD) {
  Problem p(CUBLAS_OP_T, CUBLAS_OP_T, 5, 3, 4, CUDA_R_16BF, CUDA_R_32F);
  p.copy_c_into_d();  // C := D's storage holding the values of p.c
  const Reference ref = p.expected(1.0f, 2.0f, CUBLASLT_EPILOGUE_RELU_BIAS);
  Call call = prepare(p, CUBLASLT_EPILOGUE_RELU_BIAS);
  call.c = call.d;
  Pref pref;
  const Query q = query(call.desc, call.a, call.b, call.d, call.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(matmul(call, 1.0f, 2.0f, p.a.data(), p.b.data(), p.d.data(), p.d.data(), &q.result.algo),
            CUBLAS_STATUS_SUCCESS);
  expect_matches(p, ref, CUBLASLT_EPILOGUE_RELU_BIAS, "in place");

  // C == D needs Cdesc == Ddesc: the same pointer under another leading dimension is not
  // in place.
  call.c = layout(p.c);
  const std::vector<float> before = p.d.snapshot();
  EXPECT_EQ(matmul(call, 1.0f, 2.0f, p.a.data(), p.b.data(), p.d.data(), p.d.data(), &q.result.algo),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(p.d.snapshot(), before);
}

TEST(SimtCublasLt, NullCdescMeansDdesc) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, CUDA_R_32F, CUDA_R_32F);
  p.copy_c_into_d();
  const Reference ref = p.expected(1.0f, 1.0f, CUBLASLT_EPILOGUE_DEFAULT);
  Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  call.c = nullptr;
  ASSERT_EQ(matmul(call, 1.0f, 1.0f, p.a.data(), p.b.data(), p.d.data(), p.d.data(), nullptr), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, ref, CUBLASLT_EPILOGUE_DEFAULT, "Cdesc NULL");
}

TEST(SimtCublasLt, LargeProductMatchesTheReference) {
  // Big enough for the emulation to split the columns over threads.
  Problem p(CUBLAS_OP_T, CUBLAS_OP_N, 161, 163, 160, CUDA_R_16BF, CUDA_R_16BF, 5);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  ASSERT_EQ(run(p, call, 0.5f, 0.25f), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(0.5f, 0.25f, CUBLASLT_EPILOGUE_GELU_AUX_BIAS), CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                 "161x163x160");
}

// ---- Descriptors ---------------------------------------------------------------------------

TEST(SimtCublasLt, StatusNames) {
  EXPECT_STREQ(lt().GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(lt().GetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(lt().GetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(lt().GetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(lt().Create(nullptr), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(SimtCublasLt, LayoutCreateValidates) {
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_32F, 5, 3, 5), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_16BF, 5, 3, 8), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_16F, 5, 3, 5), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_32F, 5, 3, 4), CUBLAS_STATUS_INVALID_VALUE);  // ld < rows
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_32F, 5, 3, -5), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(lt().MatrixLayoutCreate(&l, CUDA_R_64F, 5, 3, 5), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(lt().MatrixLayoutCreate(nullptr, CUDA_R_32F, 5, 3, 5), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(SimtCublasLt, DescCreateSupportsTrueFp32Only) {
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_16F, CUDA_R_16F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(lt().MatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_16F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(lt().MatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(SimtCublasLt, DescSetAttributeChecksTheDocumentedSizes) {
  cublasLtMatmulDesc_t desc = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size) {
    return lt().MatmulDescSetAttribute(desc, attr, buf, size);
  };
  const int32_t i32 = CUBLAS_OP_T;
  const int64_t i64 = 8;
  const uint32_t u32 = CUBLASLT_EPILOGUE_BIAS;
  const void* ptr = &i32;
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSA, &i32, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSA, &i64, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSB, &i32, 2), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE, &u32, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE, &i64, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof ptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &i32, 4), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &i32, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &i64, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ptr, sizeof ptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i64, 8), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i32, 4), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &i32, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &i32, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &i64, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_FILL_MODE, &i32, 4), CUBLAS_STATUS_INVALID_VALUE);  // not emulated
  EXPECT_EQ(lt().MatmulDescSetAttribute(nullptr, CUBLASLT_MATMUL_DESC_TRANSA, &i32, 4), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(SimtCublasLt, PreferenceSetAttributeChecksTheDocumentedSizes) {
  Pref pref;
  auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* buf, size_t size) {
    return lt().MatmulPreferenceSetAttribute(pref.get(), attr, buf, size);
  };
  const uint64_t u64 = 1 << 20;
  const uint32_t u32 = 16;
  EXPECT_EQ(set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u64, 8), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &u32, 4), CUBLAS_STATUS_INVALID_VALUE);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    EXPECT_EQ(set(attr, &u32, 4), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(set(attr, &u64, 8), CUBLAS_STATUS_INVALID_VALUE);
  }
  EXPECT_EQ(set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, nullptr, 8), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(CUBLASLT_MATMUL_PREF_SEARCH_MODE, &u32, 4), CUBLAS_STATUS_INVALID_VALUE);  // not emulated
}

// ---- The heuristic query -------------------------------------------------------------------

TEST(SimtCublasLt, HeuristicReturnsOneAlgorithm) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 7, CUDA_R_32F, CUDA_R_32F);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  Pref pref;
  Query q = query(call.desc, call.a, call.b, call.c, call.d, pref.get(), 4);
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(q.count, 1);
  EXPECT_EQ(q.result.state, CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(q.result.wavesCount, 1.0f);
  EXPECT_EQ(q.result.workspaceSize, 0u);  // the default preference allows no workspace

  set_pref<uint64_t>(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 4096);
  q = query(call.desc, call.a, call.b, call.c, call.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  EXPECT_LE(q.result.workspaceSize, 4096u);  // never more than the preference allows

  EXPECT_EQ(query(call.desc, call.a, call.b, call.c, call.d, pref.get(), 0).status, CUBLAS_STATUS_INVALID_VALUE);
  int count = -1;
  cublasLtMatmulHeuristicResult_t result;
  EXPECT_EQ(lt().MatmulAlgoGetHeuristic(nullptr, call.desc, call.a, call.b, call.c, call.d, pref.get(), 1, &result,
                                        &count),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST(SimtCublasLt, HeuristicRejectsInvalidAndUnsupportedProblems) {
  Pref pref;
  auto expect_status = [&](cublasLtMatmulDesc_t desc, const Matrix& a, const Matrix& b, const Matrix& c,
                           const Matrix& d, cublasStatus_t want, const char* what) {
    const Query q = query(desc, layout(a), layout(b), layout(c), layout(d), pref.get());
    EXPECT_EQ(q.status, want) << what;
    EXPECT_EQ(q.count, want == CUBLAS_STATUS_SUCCESS ? 1 : 0) << what;
  };
  const cublasLtMatmulDesc_t nn = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
  const cublasLtMatmulDesc_t tn = make_desc(CUBLAS_OP_T, CUBLAS_OP_N);
  const Matrix a(CUDA_R_32F, 5, 7, 5), b(CUDA_R_32F, 7, 3, 7), d(CUDA_R_32F, 5, 3, 5);
  const Matrix a_bf16(CUDA_R_16BF, 5, 7, 5), b_bf16(CUDA_R_16BF, 7, 3, 7), b_fp16(CUDA_R_16F, 7, 3, 7);
  const Matrix d_bf16(CUDA_R_16BF, 5, 3, 5), d_fp16(CUDA_R_16F, 5, 3, 5);

  expect_status(nn, a, b, d, d, CUBLAS_STATUS_SUCCESS, "valid");
  expect_status(tn, a, b, d, d, CUBLAS_STATUS_INVALID_VALUE, "op(A) is 7 x 5");
  expect_status(nn, a, Matrix(CUDA_R_32F, 6, 3, 6), d, d, CUBLAS_STATUS_INVALID_VALUE, "k differs");
  expect_status(nn, a, b, Matrix(CUDA_R_32F, 5, 4, 5), d, CUBLAS_STATUS_INVALID_VALUE, "C is not m x n");
  expect_status(nn, a, Matrix(CUDA_R_32F, 7, 4, 7), d, d, CUBLAS_STATUS_INVALID_VALUE, "n differs");
  expect_status(nn, a_bf16, b_bf16, d, d_bf16, CUBLAS_STATUS_INVALID_VALUE, "C and D types differ");
  expect_status(nn, a_bf16, b_fp16, d, d, CUBLAS_STATUS_NOT_SUPPORTED, "A and B types differ");
  expect_status(nn, a, b, d_bf16, d_bf16, CUBLAS_STATUS_NOT_SUPPORTED, "fp32 inputs, bf16 output");
  expect_status(nn, a_bf16, b_bf16, d_fp16, d_fp16, CUBLAS_STATUS_NOT_SUPPORTED, "bf16 inputs, fp16 output");
  expect_status(nn, a_bf16, b_bf16, d_bf16, d_bf16, CUBLAS_STATUS_SUCCESS, "bf16 -> bf16");

  for (uint32_t epilogue : {CUBLASLT_EPILOGUE_RELU_AUX, CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                            CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
    expect_status(make_desc(CUBLAS_OP_N, CUBLAS_OP_N, epilogue), a, b, d, d, CUBLAS_STATUS_NOT_SUPPORTED,
                  "epilogue not emulated");
  }
  const cublasLtMatmulDesc_t device_scalars = make_desc(CUBLAS_OP_N, CUBLAS_OP_N);
  set_desc<int32_t>(device_scalars, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
  expect_status(device_scalars, a, b, d, d, CUBLAS_STATUS_NOT_SUPPORTED, "device pointer mode");

  // Bias type: Dtype by default; another type is not in the documented table.
  const cublasLtMatmulDesc_t bf16_bias = make_desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_BIAS);
  set_desc<int32_t>(bf16_bias, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
  expect_status(bf16_bias, a_bf16, b_bf16, d, d, CUBLAS_STATUS_NOT_SUPPORTED, "bf16 bias with fp32 D");
  // Aux type: "should be left unset or set to -1" outside fp8 -> INVALID_VALUE.
  const cublasLtMatmulDesc_t bf16_aux = make_desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_GELU_AUX);
  set_desc<int32_t>(bf16_aux, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, CUDA_R_16BF);
  expect_status(bf16_aux, a_bf16, b_bf16, d, d, CUBLAS_STATUS_INVALID_VALUE, "bf16 aux with fp32 D");
}

// ---- cublasLtMatmul's checks -----------------------------------------------------------------

// Runs one failing call and checks that D was left alone.
void expect_rejected(Problem& p, cublasStatus_t got, cublasStatus_t want, const std::vector<float>& d_before,
                     const char* what) {
  EXPECT_EQ(got, want) << what;
  EXPECT_EQ(p.d.snapshot(), d_before) << what << ": D written by a failing call";
}

TEST(SimtCublasLt, MatmulRejectsMissingOperands) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  const std::vector<float> before = p.d.snapshot();
  Pref pref;

  const Call plain = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  const Query q = query(plain.desc, plain.a, plain.b, plain.c, plain.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  expect_rejected(p, matmul(plain, 1.0f, 0.5f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "beta != 0 with C NULL");
  ASSERT_EQ(matmul(plain, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
            CUBLAS_STATUS_SUCCESS)
      << "beta == 0 needs no C";
  const std::vector<float> after_plain = p.d.snapshot();
  expect_rejected(p,
                  lt().Matmul(nullptr, plain.desc, &q, p.a.data(), plain.a, p.b.data(), plain.b, &q, nullptr,
                              plain.c, p.d.data(), plain.d, &q.result.algo, nullptr, 0, nullptr),
                  CUBLAS_STATUS_NOT_INITIALIZED, after_plain, "no handle");

  Call bias = prepare(p, CUBLASLT_EPILOGUE_GELU_BIAS);
  set_desc<const void*>(bias.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr);
  expect_rejected(p, matmul(bias, 1.0f, 0.0f, p.a.data(), p.b.data(), p.c.data(), p.d.data(), nullptr),
                  CUBLAS_STATUS_INVALID_VALUE, after_plain, "bias epilogue, NULL bias");

  Call aux = prepare(p, CUBLASLT_EPILOGUE_GELU_AUX);
  set_desc<void*>(aux.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, nullptr);
  expect_rejected(p, matmul(aux, 1.0f, 0.0f, p.a.data(), p.b.data(), p.c.data(), p.d.data(), nullptr),
                  CUBLAS_STATUS_INVALID_VALUE, after_plain, "aux epilogue, NULL aux");

  Call short_ld = prepare(p, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  set_desc<int64_t>(short_ld.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 0);  // the default, < m
  expect_rejected(p, matmul(short_ld, 1.0f, 0.0f, p.a.data(), p.b.data(), p.c.data(), p.d.data(), nullptr),
                  CUBLAS_STATUS_INVALID_VALUE, after_plain, "aux ld unset");
  Matrix aux_odd(CUDA_R_32F, p.m, p.n, 12);  // >= m, not a multiple of 8
  Call odd_ld = prepare(p, CUBLASLT_EPILOGUE_GELU_AUX);
  set_desc<void*>(odd_ld.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_odd.data());
  set_desc<int64_t>(odd_ld.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, 12);
  expect_rejected(p, matmul(odd_ld, 1.0f, 0.0f, p.a.data(), p.b.data(), p.c.data(), p.d.data(), nullptr),
                  CUBLAS_STATUS_INVALID_VALUE, after_plain, "aux ld not divisible by 8");
}

TEST(SimtCublasLt, MatmulHoldsBuffersToTheAlgorithmsAlignment) {
  // A offset by 16 bytes: fine for an algorithm chosen with MIN_ALIGNMENT_A_BYTES = 16, not
  // for one chosen under the default preference (256 bytes).
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  Matrix a16(CUDA_R_32F, p.a.rows(), p.a.cols(), p.a.ld(), 16), a4(CUDA_R_32F, p.a.rows(), p.a.cols(), p.a.ld(), 4);
  Matrix a2(CUDA_R_32F, p.a.rows(), p.a.cols(), p.a.ld(), 2);
  for (int64_t j = 0; j < p.a.cols(); ++j) {
    for (int64_t i = 0; i < p.a.rows(); ++i) {
      a16.set(i, j, p.a.get(i, j));
      a4.set(i, j, p.a.get(i, j));
    }
  }
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  const std::vector<float> before = p.d.snapshot();

  Pref default_pref;
  const Query strict = query(call.desc, call.a, call.b, call.c, call.d, default_pref.get());
  expect_rejected(p, matmul(call, 1.0f, 0.0f, a16.data(), p.b.data(), nullptr, p.d.data(), &strict.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "A 16-byte aligned, algorithm assumes 256");
  expect_rejected(p, matmul(call, 1.0f, 0.0f, a16.data(), p.b.data(), nullptr, p.d.data(), nullptr),
                  CUBLAS_STATUS_INVALID_VALUE, before, "implicit heuristic: default 256-byte alignment");

  Pref pref16;
  set_pref<uint32_t>(pref16.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 16);
  const Query relaxed = query(call.desc, call.a, call.b, call.c, call.d, pref16.get());
  expect_rejected(p, matmul(call, 1.0f, 0.0f, a4.data(), p.b.data(), nullptr, p.d.data(), &relaxed.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "A 4-byte aligned, algorithm assumes 16");
  Pref pref1;
  set_pref<uint32_t>(pref1.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, 1);
  const Query any = query(call.desc, call.a, call.b, call.c, call.d, pref1.get());
  expect_rejected(p, matmul(call, 1.0f, 0.0f, a2.data(), p.b.data(), nullptr, p.d.data(), &any.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "fp32 A not 4-byte aligned");
  ASSERT_EQ(matmul(call, 1.0f, 0.0f, a16.data(), p.b.data(), nullptr, p.d.data(), &relaxed.result.algo),
            CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT), CUBLASLT_EPILOGUE_DEFAULT, "A at +16");
}

TEST(SimtCublasLt, MatmulHoldsBiasToTheAlignmentTheQuerySaw) {
  // The heuristic "depend[s] on [the bias pointer's] value to determine expected pointer
  // alignment": a bias less aligned at run time than at query time is refused.
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  Matrix bias_at_4(CUDA_R_32F, p.m, 1, p.m, 4), bias_at_256(CUDA_R_32F, p.m, 1, p.m, 0);
  for (int64_t i = 0; i < p.m; ++i) {
    bias_at_4.set(i, 0, p.bias.get(i, 0));
    bias_at_256.set(i, 0, p.bias.get(i, 0));
  }
  const Call call = prepare(p, CUBLASLT_EPILOGUE_BIAS);  // bias pointer: p.bias, 256-aligned
  Pref pref;
  const Query q = query(call.desc, call.a, call.b, call.c, call.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  const std::vector<float> before = p.d.snapshot();
  set_desc<const void*>(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_at_4.data());
  expect_rejected(p, matmul(call, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "bias less aligned than at query time");
  set_desc<const void*>(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_at_256.data());
  ASSERT_EQ(matmul(call, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
            CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(1.0f, 0.0f, CUBLASLT_EPILOGUE_BIAS), CUBLASLT_EPILOGUE_BIAS, "another bias");
}

TEST(SimtCublasLt, MatmulNeedsTheWorkspaceTheAlgorithmClaims) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 5, 3, 4, CUDA_R_32F, CUDA_R_32F);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  Pref pref;
  set_pref<uint64_t>(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, 4096);
  const Query q = query(call.desc, call.a, call.b, call.c, call.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  const size_t need = q.result.workspaceSize;
  ASSERT_GT(need, 0u) << "the emulation claims the workspace the preference allows";
  Matrix workspace(CUDA_R_32F, 4096 / 4 + 64, 1, 4096 / 4 + 64);  // 256-aligned
  const std::vector<float> before = p.d.snapshot();
  auto run_with = [&](void* ws, size_t size) {
    return matmul(call, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo, ws, size);
  };
  expect_rejected(p, run_with(workspace.data(), need - 1), CUBLAS_STATUS_INVALID_VALUE, before, "workspace too small");
  expect_rejected(p, run_with(nullptr, need), CUBLAS_STATUS_INVALID_VALUE, before, "workspace NULL");
  expect_rejected(p, run_with(static_cast<std::byte*>(workspace.data()) + 128, need), CUBLAS_STATUS_INVALID_VALUE,
                  before, "workspace not 256-byte aligned");
  ASSERT_EQ(run_with(workspace.data(), need), CUBLAS_STATUS_SUCCESS);
  expect_matches(p, p.expected(1.0f, 0.0f, CUBLASLT_EPILOGUE_DEFAULT), CUBLASLT_EPILOGUE_DEFAULT, "workspace");
}

TEST(SimtCublasLt, MatmulRunsOnlyTheOperationTheAlgorithmWasChosenFor) {
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, CUDA_R_32F, CUDA_R_32F);
  const Call chosen = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  Pref pref;
  const Query q = query(chosen.desc, chosen.a, chosen.b, chosen.c, chosen.d, pref.get());
  ASSERT_EQ(q.status, CUBLAS_STATUS_SUCCESS);
  const std::vector<float> before = p.d.snapshot();
  const Call gelu = prepare(p, CUBLASLT_EPILOGUE_GELU);
  expect_rejected(p, matmul(gelu, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "other epilogue");
  Call transposed = chosen;
  transposed.desc = make_desc(CUBLAS_OP_T, CUBLAS_OP_N);
  expect_rejected(p, matmul(transposed, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &q.result.algo),
                  CUBLAS_STATUS_INVALID_VALUE, before, "other transpose");
  cublasLtMatmulAlgo_t forged{};
  expect_rejected(p, matmul(chosen, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.d.data(), &forged),
                  CUBLAS_STATUS_INVALID_VALUE, before, "not a heuristic's algorithm");
}

TEST(SimtCublasLt, MatmulRefusesAnOutputOverlappingAnInput) {
  // D placed over A's storage (same type and shape: m = k).
  Problem p(CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, CUDA_R_32F, CUDA_R_32F);
  const Call call = prepare(p, CUBLASLT_EPILOGUE_DEFAULT);
  Call over_a = call;
  over_a.d = layout(p.a);
  over_a.c = over_a.d;
  const std::vector<float> a_before = p.a.snapshot();
  EXPECT_EQ(matmul(over_a, 1.0f, 0.0f, p.a.data(), p.b.data(), nullptr, p.a.data(), nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(p.a.snapshot(), a_before);
}

}  // namespace
}  // namespace lattice::cuda
