// GEMM facade: every matrix product in lattice goes through here (CPU: a BLAS
// library, never hand-rolled loops). Row-major, as the rest of lattice.
#pragma once
#include <cstdint>

namespace lattice {

enum class Trans : bool { N = false, T = true };

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C
// op(A) = A (A is [M,K], lda >= K) or A^T (A is [K,M], lda >= M); likewise B.
void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same with A and B in bf16 (their 16-bit patterns, see kernels/cast.h) and C in
// fp32: every product of two bf16 values is exact in fp32 and the products are
// accumulated in fp32, by one of two paths (Bf16GemmPath; the same numbers up to
// accumulation order).
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// A bf16 operand as its 16-bit patterns, or as fp32 values that are bf16 numbers: a weight
// widened once per update (Bf16Operand::widened), which the fp32_widened path then multiplies as
// it is instead of widening it at every GEMM. Widened operands are for the CPU's fp32_widened
// path only (bf16_weights_widened()).
struct Bf16Operand {
  Bf16Operand(const uint16_t* b) : bits(b) {}  // NOLINT(google-explicit-constructor): the usual form
  static Bf16Operand widened(const float* w) {
    Bf16Operand o(nullptr);
    o.wide = w;
    return o;
  }
  const uint16_t* bits = nullptr;
  const float* wide = nullptr;
};
// Whether a bf16 weight is best kept widened (bf16 numbers in fp32): on the CPU when gemm_bf16
// takes the fp32_widened path.
bool bf16_weights_widened();
// gemm_bf16 with B as a Bf16Operand.
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, Bf16Operand B, int64_t ldb, float beta, float* C, int64_t ldc);

// C = bf16(alpha * op(A) op(B)) as bf16 patterns [M, N] (row-major, dense), written at the
// start of `buffer`, which must hold M * N floats: on the CPU the fp32 product is computed
// there with gemm_bf16 and then packed in place (the same bits as gemm_bf16 followed by
// cast_fp32_to_bf16); on a GPU the GEMM writes bf16 directly, half the memory traffic of an
// fp32 result. Returns the bf16 result (buffer, reinterpreted).
uint16_t* gemm_bf16_packed_out(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                               int64_t lda, Bf16Operand B, int64_t ldb, float* buffer);

// gemm_bf16 for a memory-bound product of a few rows (a decode step's GEMVs): on a CPU with AVX512-BF16 always
// oneDNN's bf16 matmul, which reads B's 2 bytes per element (about twice as fast as fp32 weights there, also
// without AMX: docs/benchmarks.md), else (and on a GPU) gemm_bf16's path. The same numbers up to
// accumulation order.
void gemm_bf16_few_rows(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// How gemm_bf16 computes on the CPU.
enum class Bf16GemmPath {
  onednn_bf16,   // oneDNN's bf16 matmul (AMX-BF16 tiles or AVX512-BF16 dot products)
  fp32_widened,  // A and B widened to fp32, then gemm_f32
};
// The path gemm_bf16 takes: LATTICE_BF16_GEMM=onednn|fp32 where set (auto: the default), else
// onednn_bf16 on a CPU with AMX-BF16 and fp32_widened elsewhere. Without AMX oneDNN's bf16
// kernels ran at half its fp32 sgemm's rate on an AVX512-BF16 Xeon (docs/benchmarks.md). An
// unknown value, or onednn on a CPU without AVX512-BF16, fails naming the variable.
Bf16GemmPath gemm_bf16_path();
// Whether this CPU can take `path` (onednn_bf16: AVX512-BF16 at least).
bool gemm_bf16_path_supported(Bf16GemmPath path);
// The path in words for logs: "oneDNN bf16 matmul (AMX-BF16)", ...
const char* gemm_bf16_path_name();
// Tests: take `path` (which must be supported) until gemm_bf16_use_default_path().
void gemm_bf16_force_path(Bf16GemmPath path);
void gemm_bf16_use_default_path();

// Which library and threading the facade uses, for logs and benchmarks.
const char* blas_backend_name();

// Thread count the BLAS library uses (the trainer sets it at start-up).
void blas_set_num_threads(int n);

}  // namespace lattice
