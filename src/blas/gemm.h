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

// Which library and threading the facade uses, for logs and benchmarks.
const char* blas_backend_name();

// Thread count the BLAS library uses (the trainer sets it at start-up).
void blas_set_num_threads(int n);

}  // namespace lattice
