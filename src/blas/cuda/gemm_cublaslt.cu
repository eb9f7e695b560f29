// GEMM facade on the GPU through cuBLASLt (blas/gemm_cuda.h).
//
// Row-major to column-major: a row-major X[r,c] with leading dimension ld is, byte for
// byte, the column-major X^T[c,r] with the same ld. So the row-major product
// C[M,N] = op(A) op(B) is the column-major product C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's
// "A" is our B, its "B" is our A, its m = N, n = M, k = K, and the transpose flags carry
// over unchanged (our B untransposed is stored as col-major B^T[N,K], exactly op(B)^T).
// A bias of the output features (bias[N]) is cuBLASLt's bias over the rows of its D[N,M].
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "blas/gemm_cuda.h"
#include "blas/cuda/cublaslt_api.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "kernels/cuda/launch.cuh"

namespace lattice::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // 32 MiB

enum class Kind : int64_t { f32, bf16, bf16_out };
enum class Epi : int64_t { none, bias, gelu_aux_bias };

const char* kind_name(Kind k) { return k == Kind::f32 ? "f32" : k == Kind::bf16 ? "bf16" : "bf16->bf16"; }
const char* epi_name(Epi e) { return e == Epi::none ? "none" : e == Epi::bias ? "bias" : "gelu_aux_bias"; }

// Everything the plan (descriptors + algorithm) depends on.
struct Shape {
  Kind kind;
  Trans ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  Epi epi;
  int64_t ld_aux;
  // Pointer alignments (bytes, up to 256): the heuristic picks kernels for them.
  int64_t align_a, align_b, align_c, align_bias, align_aux;

  std::array<int64_t, 16> key() const {
    return {int64_t(kind), int64_t(ta), int64_t(tb), M, N, K, lda, ldb, ldc, int64_t(epi), ld_aux,
            align_a, align_b, align_c, align_bias, align_aux};
  }
  std::string describe() const {
    std::ostringstream o;
    o << "GEMM " << kind_name(kind) << " (ta=" << (ta == Trans::T ? 'T' : 'N') << " tb=" << (tb == Trans::T ? 'T' : 'N')
      << " M=" << M << " N=" << N << " K=" << K << " lda=" << lda << " ldb=" << ldb << " ldc=" << ldc
      << " epilogue=" << epi_name(epi) << ")";
    return o.str();
  }
};

std::string status_text(cublasStatus_t s) {
  return std::string(cublaslt().GetStatusName(s)) + ": " + cublaslt().GetStatusString(s);
}

#define LATTICE_LT(call, shape)                                                                        \
  do {                                                                                                 \
    const cublasStatus_t st_ = (call);                                                                 \
    LATTICE_CHECK(st_ == CUBLAS_STATUS_SUCCESS) << "cuBLASLt " << (shape).describe() << ": " << #call \
                                                << " failed: " << status_text(st_);                   \
  } while (0)

int64_t alignment(const void* p) {
  if (!p) return 256;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 1;
  while (al < 256 && (a % uintptr_t(al * 2)) == 0) al *= 2;
  return al;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;  // false: an epilogue without a fused kernel here (caller falls back)
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::array<int64_t, 16>, std::unique_ptr<Plan>> plans;
  int64_t fallbacks = 0;  // calls that ran the unfused epilogue kernel
};

// Made on first use, never destroyed (the driver releases it at exit; destroying it in a
// static destructor could run after the CUDA runtime is gone).
LtState& lt() {
  static LtState* s = nullptr;
  if (!s) {
    auto* n = new LtState;
    const cublasStatus_t st = cublaslt().Create(&n->handle);
    LATTICE_CHECK(st == CUBLAS_STATUS_SUCCESS) << "cuBLASLt: cublasLtCreate failed: " << status_text(st);
    n->workspace = malloc_device(kWorkspaceBytes);  // on the compute stream
    s = n;
  }
  return *s;
}

cudaDataType_t ab_type(Kind k) { return k == Kind::f32 ? CUDA_R_32F : CUDA_R_16BF; }
cudaDataType_t cd_type(Kind k) { return k == Kind::bf16_out ? CUDA_R_16BF : CUDA_R_32F; }

template <typename T>
void set_desc(const Shape& s, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  LATTICE_LT(cublaslt().MatmulDescSetAttribute(d, attr, &v, sizeof(v)), s);
}

// The plan for a shape: descriptors, and the heuristic's best algorithm (queried once).
// bias/aux are the pointers of the first call: the heuristic reads their alignment,
// which is part of the key.
Plan& plan_for(const Shape& s, const void* bias, const void* aux) {
  LtState& st = lt();
  auto it = st.plans.find(s.key());
  if (it != st.plans.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  // True fp32 compute (CUBLAS_COMPUTE_32F): no TF32 rounding of the inputs.
  LATTICE_LT(cublaslt().MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), s);
  const cublasOperation_t op_a = s.tb == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
  const cublasOperation_t op_b = s.ta == Trans::T ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
  set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  // Our B: [K,N] row-major = col-major [N,K]; transposed, [N,K] row-major = col-major [K,N].
  const uint64_t a_rows = uint64_t(s.tb == Trans::T ? s.K : s.N), a_cols = uint64_t(s.tb == Trans::T ? s.N : s.K);
  // Our A: [M,K] row-major = col-major [K,M]; transposed, [K,M] row-major = col-major [M,K].
  const uint64_t b_rows = uint64_t(s.ta == Trans::T ? s.M : s.K), b_cols = uint64_t(s.ta == Trans::T ? s.K : s.M);
  LATTICE_LT(cublaslt().MatrixLayoutCreate(&p->a, ab_type(s.kind), a_rows, a_cols, s.ldb), s);
  LATTICE_LT(cublaslt().MatrixLayoutCreate(&p->b, ab_type(s.kind), b_rows, b_cols, s.lda), s);
  LATTICE_LT(cublaslt().MatrixLayoutCreate(&p->c, cd_type(s.kind), uint64_t(s.N), uint64_t(s.M), s.ldc), s);

  if (s.epi != Epi::none) {
    // Bias and aux (pre-GELU) element types default to D's type: fp32 here.
    const cublasLtEpilogue_t e = s.epi == Epi::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, e);
    set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (s.epi == Epi::gelu_aux_bias) {
      set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
      set_desc(s, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, s.ld_aux);
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  LATTICE_LT(cublaslt().MatmulPreferenceCreate(&pref), s);
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al_a = uint32_t(s.align_b), al_b = uint32_t(s.align_a), al_c = uint32_t(s.align_c);
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
    LATTICE_LT(cublaslt().MatmulPreferenceSetAttribute(pref, attr, v, n), s);
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublaslt().MatmulAlgoGetHeuristic(st.handle, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
    p->algo = result.algo;
    p->has_algo = true;
  } else if (s.epi == Epi::none) {
    LATTICE_FAIL() << "cuBLASLt " << s.describe() << ": no algorithm for this shape ("
                   << (hs == CUBLAS_STATUS_SUCCESS ? std::string("heuristic returned none") : status_text(hs)) << ")";
  }  // else: an epilogue without a fused kernel; the caller runs it as a separate kernel
  Plan& ref = *p;
  st.plans.emplace(s.key(), std::move(p));
  return ref;
}

void check_dims(const Shape& s) {
  LATTICE_CHECK(s.M >= 0 && s.N >= 0 && s.K >= 0) << "cuBLASLt " << s.describe() << ": negative size";
  const int64_t a_width = s.ta == Trans::T ? s.M : s.K, b_width = s.tb == Trans::T ? s.K : s.N;
  LATTICE_CHECK(s.lda >= std::max<int64_t>(1, a_width) && s.ldb >= std::max<int64_t>(1, b_width) &&
                s.ldc >= std::max<int64_t>(1, s.N))
      << "cuBLASLt " << s.describe() << ": a leading dimension is smaller than its row width";
}

Shape make_shape(Kind kind, Epi epi, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                 const void* B, int64_t ldb, const void* C, int64_t ldc, const void* bias, const void* aux,
                 int64_t ld_aux) {
  Shape s{kind, ta, tb, M, N, K, lda, ldb, ldc, epi, ld_aux,
          alignment(A), alignment(B), alignment(C), alignment(bias), alignment(aux)};
  check_dims(s);
  return s;
}

// Runs a plan: D = alpha op(A) op(B) + beta C (+ epilogue), on the compute stream.
void run(const Shape& s, Plan& p, float alpha, const void* A, const void* B, float beta, void* C, const void* bias,
         void* aux) {
  LtState& st = lt();
  if (s.epi != Epi::none) {
    set_desc(s, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (s.epi == Epi::gelu_aux_bias) set_desc(s, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  }
  LATTICE_LT(cublaslt().Matmul(st.handle, p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, st.workspace,
                            kWorkspaceBytes, stream()),
             s);
}

// ---- kernels for what the GEMM itself does not cover ----

// C = beta * C over an [M,N] block (K == 0: the product is empty).
template <typename T>
__global__ void scale_kernel(T* C, int64_t ldc, int64_t M, int64_t N, float beta) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    T& c = C[(i / N) * ldc + i % N];
    if constexpr (sizeof(T) == 4) {
      c = beta == 0.0f ? 0.0f : beta * c;
    } else {  // bf16 bits: widen, scale, round to nearest even
      float v = 0.0f;
      if (beta != 0.0f) v = beta * __uint_as_float(uint32_t(c) << 16);
      uint32_t u = __float_as_uint(v);
      if ((u & 0x7fffffffu) > 0x7f800000u) {
        c = uint16_t((u >> 16) | 0x40);  // quiet NaN
      } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        c = uint16_t(u >> 16);
      }
    }
  }
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (GeluKind::tanh, as the CPU kernel)
__device__ inline float gelu_tanh(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// Unfused epilogue: X[i,j] += bias[j]; with gelu, pre = X and C = gelu_tanh(X).
__global__ void bias_epilogue_kernel(float* X, int64_t ldx, const float* bias, int64_t M, int64_t N, float* C,
                                     int64_t ldc, bool gelu) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, j = i % N;
    const float v = X[r * ldx + j] + bias[j];
    X[r * ldx + j] = v;
    if (gelu) C[r * ldc + j] = gelu_tanh(v);
  }
}

template <typename T>
void scale(T* C, int64_t ldc, int64_t M, int64_t N, float beta) {
  launch(scale_kernel<T>, grid_for(M * N, 256), 256, 0, C, ldc, M, N, beta);
  LATTICE_CUDA_LAUNCHED("gemm scale (K = 0)");
}

void bias_epilogue(float* X, int64_t ldx, const float* bias, int64_t M, int64_t N, float* C, int64_t ldc, bool gelu) {
  launch(bias_epilogue_kernel, grid_for(M * N, 256), 256, 0, X, ldx, bias, M, N, C, ldc, gelu);
  LATTICE_CUDA_LAUNCHED("gemm bias epilogue");
}

// alpha op(A) op(B) + beta C without an epilogue.
template <typename TC>
void plain(Kind kind, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
           const void* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  const Shape s = make_shape(kind, Epi::none, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, nullptr, nullptr, 0);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    scale<TC>(C, ldc, M, N, beta);
    return;
  }
  run(s, plan_for(s, nullptr, nullptr), alpha, A, B, beta, C, nullptr, nullptr);
}

}  // namespace

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  plain<float>(Kind::f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  plain<float>(Kind::bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float beta, uint16_t* C, int64_t ldc) {
  plain<uint16_t>(Kind::bf16_out, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_bias(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                    const uint16_t* B, int64_t ldb, const float* bias, float* C, int64_t ldc) {
  const Shape s = make_shape(Kind::bf16, Epi::bias, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, bias, nullptr, 0);
  LATTICE_CHECK(bias != nullptr) << "cuBLASLt " << s.describe() << ": no bias";
  if (M == 0 || N == 0) return;
  Plan* p = K > 0 ? &plan_for(s, bias, nullptr) : nullptr;
  if (p && p->has_algo) {
    run(s, *p, 1.0f, A, B, 0.0f, C, bias, nullptr);
    return;
  }
  lt().fallbacks += 1;
  plain<float>(Kind::bf16, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
  bias_epilogue(C, ldc, bias, M, N, nullptr, 0, false);
}

void gemm_bf16_bias_gelu(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                         const uint16_t* B, int64_t ldb, const float* bias, float* C, int64_t ldc, float* pre,
                         int64_t ld_pre) {
  const Shape s =
      make_shape(Kind::bf16, Epi::gelu_aux_bias, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, bias, pre, ld_pre);
  LATTICE_CHECK(bias != nullptr && pre != nullptr && ld_pre >= std::max<int64_t>(1, N))
      << "cuBLASLt " << s.describe() << ": needs a bias and a pre-GELU output with ld_pre >= N (ld_pre=" << ld_pre
      << ")";
  if (M == 0 || N == 0) return;
  // The fused epilogue needs the aux leading dimension divisible by 8.
  Plan* p = (K > 0 && ld_pre % 8 == 0) ? &plan_for(s, bias, pre) : nullptr;
  if (p && p->has_algo) {
    run(s, *p, 1.0f, A, B, 0.0f, C, bias, pre);
    return;
  }
  lt().fallbacks += 1;
  plain<float>(Kind::bf16, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, pre, ld_pre);
  bias_epilogue(pre, ld_pre, bias, M, N, C, ldc, true);
}

int64_t gemm_plan_cache_size() { return int64_t(lt().plans.size()); }
int64_t gemm_epilogue_fallbacks() { return lt().fallbacks; }

}  // namespace lattice::cuda
