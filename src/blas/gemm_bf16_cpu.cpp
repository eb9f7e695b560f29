// bf16 GEMM on the CPU, by the path gemm_bf16_path() chooses:
//   onednn_bf16: oneDNN's matmul primitive with bf16 source and weights and an fp32
//     destination (AMX-BF16 tiles or AVX512-BF16 dot products, fp32 accumulation), blocked
//     for threads as blas/blocking.h says. Strides express the transposes and leading
//     dimensions; beta != 0 is the matmul's sum post-op, alpha its output scale. oneDNN keeps
//     created primitives in its primitive cache, so each shape is JIT-compiled once.
//   fp32_widened: A and B widened to fp32 and multiplied by gemm_f32.
#include <dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blas/blocking.h"

#include "core/device.h"
#include "blas/gemm_cuda.h"
#include "blas/gemm.h"
#include "core/error.h"
#include "kernels/cast.h"
#include "kernels/cast_math.h"

namespace lattice {
namespace {

// -1: the default path; else a forced Bf16GemmPath.
std::atomic<int> g_forced_path{-1};

bool cpu_has(dnnl_cpu_isa_t isa) { return (dnnl_get_effective_cpu_isa() & isa) == isa; }

// LATTICE_BF16_GEMM's choice, else AMX -> oneDNN, anything less -> fp32.
Bf16GemmPath default_path() {
  const char* v = std::getenv("LATTICE_BF16_GEMM");
  const std::string s = v ? v : "";
  if (s == "onednn") {
    if (!gemm_bf16_path_supported(Bf16GemmPath::onednn_bf16))
      LATTICE_FAIL() << "LATTICE_BF16_GEMM=onednn: this CPU has no AVX512-BF16 (as oneDNN sees it), so oneDNN has "
                        "no bf16 matmul here; use fp32 or auto";
    return Bf16GemmPath::onednn_bf16;
  }
  if (s == "fp32") return Bf16GemmPath::fp32_widened;
  if (!s.empty() && s != "auto")
    LATTICE_FAIL() << "LATTICE_BF16_GEMM=" << s << ": expected onednn (oneDNN's bf16 matmul), fp32 (operands "
                   << "widened, fp32 GEMM) or auto";
  return cpu_has(dnnl_cpu_isa_avx512_core_amx) ? Bf16GemmPath::onednn_bf16 : Bf16GemmPath::fp32_widened;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

using dt = dnnl::memory::data_type;

// C[M,N] = alpha op(A) op(B) + beta C through one matmul call (sequential inside OpenMP).
void matmul_call(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a_md(dims{M, K}, dt::bf16, ta == Trans::N ? dims{lda, 1} : dims{1, lda});
  const dnnl::memory::desc b_md(dims{K, N}, dt::bf16, tb == Trans::N ? dims{ldb, 1} : dims{1, ldb});
  const dnnl::memory::desc c_md(dims{M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::engine& eng = cpu_engine();
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
  } catch (const dnnl::error& e) {
    LATTICE_FAIL() << "oneDNN bf16 matmul unavailable for M=" << M << " N=" << N << " K=" << K << ": " << e.what();
  }
  dnnl::memory a(a_md, eng, const_cast<uint16_t*>(A)), b(b_md, eng, const_cast<uint16_t*>(B)), c(c_md, eng, C);
  dnnl::stream s(eng);
  dnnl::matmul(pd).execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  s.wait();
}

// The onednn_bf16 path: oneDNN's matmul over the facade's thread-count-invariant blocks.
void onednn_gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                      const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_detail::for_each_block(ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
                              [&](int64_t m, int64_t n, const uint16_t* a, const uint16_t* b, float* c) {
    matmul_call(ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

// op(X) rows x cols, X stored with leading dimension ld, widened to a dense fp32 copy of
// the stored layout ([rows, cols] for N, [cols, rows] for T) in `out`, which is kept from
// call to call (grow-only: no page faults once it has its size); leading dimension returned.
int64_t widen(std::vector<float>& out, Trans t, int64_t rows, int64_t cols, const uint16_t* X, int64_t ld) {
  const int64_t r = t == Trans::N ? rows : cols, c = t == Trans::N ? cols : rows;
  if (out.size() < size_t(r * c)) out.resize(size_t(r * c));
  float* o = out.data();
  if (ld == c) {
    cast_bf16_to_fp32(o, X, r * c);
    return c;
  }
#pragma omp parallel for schedule(static) if (r * c > 32768)
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) o[i * c + j] = math::bf16_to_fp32(X[i * ld + j]);
  return c;
}

// Packs n fp32 values at the start of buf into n bf16 values at its start, in place.
// Chunk k of kPack values is read from bytes [4 k S, 4 (k + 1) S) and written to
// [2 k S, 2 (k + 1) S): for k >= 1 that lies below its own source and within chunks already
// read, so the chunks run in order (each one in parallel); chunk 0 goes through a copy.
void pack_bf16_in_place(float* buf, int64_t n) {
  constexpr int64_t kPack = int64_t(1) << 18;
  uint16_t* out = reinterpret_cast<uint16_t*>(buf);
  const int64_t first = std::min(n, kPack);
  std::vector<uint16_t> head(static_cast<size_t>(first));
  for (int64_t i = 0; i < first; ++i) head[size_t(i)] = math::fp32_to_bf16(buf[i]);
  std::memcpy(out, head.data(), size_t(first) * sizeof(uint16_t));
  for (int64_t b = kPack; b < n; b += kPack) {
    const int64_t e = std::min(n, b + kPack);
    const float* __restrict in = buf + b;
    uint16_t* __restrict o = out + b;
#pragma omp parallel for simd schedule(static) if (e - b > 32768)
    for (int64_t i = 0; i < e - b; ++i) o[i] = math::fp32_to_bf16(in[i]);
  }
}

// A widened operand is for the fp32_widened path on the CPU only.
void check_operand(const Bf16Operand& B, const char* kernel) {
  LATTICE_CHECK(!B.wide || bf16_weights_widened())
      << kernel << ": a widened operand on the " << (kernels_on_gpu() ? "GPU" : "oneDNN bf16 path");
}

}  // namespace

Bf16GemmPath gemm_bf16_path() {
  const int forced = g_forced_path.load();
  if (forced >= 0) return Bf16GemmPath(forced);
  static const Bf16GemmPath path = default_path();
  return path;
}

bool gemm_bf16_path_supported(Bf16GemmPath path) {
  return path == Bf16GemmPath::fp32_widened || cpu_has(dnnl_cpu_isa_avx512_core_bf16);
}

const char* gemm_bf16_path_name() {
  if (gemm_bf16_path() == Bf16GemmPath::fp32_widened) return "fp32 GEMM on widened bf16 operands";
  return cpu_has(dnnl_cpu_isa_avx512_core_amx) ? "oneDNN bf16 matmul (AMX-BF16)" : "oneDNN bf16 matmul (AVX512-BF16)";
}

void gemm_bf16_force_path(Bf16GemmPath path) {
  LATTICE_CHECK(gemm_bf16_path_supported(path)) << "gemm_bf16: this CPU cannot take the forced path";
  g_forced_path = int(path);
}

void gemm_bf16_use_default_path() { g_forced_path = -1; }

bool bf16_weights_widened() { return !kernels_on_gpu() && gemm_bf16_path() == Bf16GemmPath::fp32_widened; }

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, alpha, A, lda, Bf16Operand(B), ldb, beta, C, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, Bf16Operand B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_operand(B, "gemm_bf16");
  LATTICE_KERNEL_ENTRY(cuda::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B.bits, ldb, beta, C, ldc));
  if (M == 0 || N == 0) return;
  if (K == 0 || gemm_bf16_path() == Bf16GemmPath::fp32_widened) {
    // The same products in fp32 (each a bf16 x bf16 product, exact in fp32), from widened
    // copies kept per thread (B as given where it comes widened).
    thread_local std::vector<float> a, b;
    const int64_t la = widen(a, ta, M, K, A, lda);
    const float* bw = B.wide;
    int64_t lb = ldb;
    if (!bw) {
      lb = widen(b, tb, K, N, B.bits, ldb);
      bw = b.data();
    }
    gemm_f32(ta, tb, M, N, K, alpha, a.data(), la, bw, lb, beta, C, ldc);
    return;
  }
  onednn_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B.bits, ldb, beta, C, ldc);
}

void gemm_bf16_few_rows(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (kernels_on_gpu() || M == 0 || N == 0 || K == 0 || !gemm_bf16_path_supported(Bf16GemmPath::onednn_bf16)) {
    gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  onednn_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

uint16_t* gemm_bf16_packed_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                               int64_t lda, Bf16Operand B, int64_t ldb, float* buffer) {
  uint16_t* out = reinterpret_cast<uint16_t*>(buffer);
  check_operand(B, "gemm_bf16_packed_out");
  LATTICE_KERNEL_ENTRY((cuda::gemm_bf16_out(ta, tb, M, N, K, alpha, A, lda, B.bits, ldb, 0.0f, out, N), out));
  gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, buffer, N);
  pack_bf16_in_place(buffer, M * N);
  return out;
}

}  // namespace lattice
