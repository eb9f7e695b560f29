#include <cblas.h>

#include "blas/gemm.h"

namespace lattice {

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta == Trans::T ? CblasTrans : CblasNoTrans,
              tb == Trans::T ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A,
              int(lda), B, int(ldb), beta, C, int(ldc));
}

const char* blas_backend_name() { return "OpenBLAS (OpenMP build)"; }

void blas_set_num_threads(int n) { openblas_set_num_threads(n); }

}  // namespace lattice
