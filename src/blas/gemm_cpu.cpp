// CPU GEMM through oneDNN's sgemm (JIT kernels for AVX-512 / AVX2, chosen at run
// time). Measured on the development machine (docs/benchmarks.md) it runs the
// model's shapes at 2-3x the throughput of Debian's OpenBLAS. Blocks for threads as
// blas/blocking.h says (thread-count-invariant results).
#include <dnnl.h>
#include <omp.h>

#include "blas/blocking.h"

#include "core/device.h"
#include "blas/gemm_cuda.h"
#include "blas/gemm.h"
#include "core/error.h"

namespace lattice {

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  LATTICE_KERNEL_ENTRY(cuda::gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  if (M == 0 || N == 0) return;
  blas_detail::for_each_block(ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
                              [&](int64_t m, int64_t n, const float* a, const float* b, float* c) {
    dnnl_status_t st = dnnl_sgemm(ta == Trans::T ? 'T' : 'N', tb == Trans::T ? 'T' : 'N', m, n, K,
                                  alpha, a, lda, b, ldb, beta, c, ldc);
    LATTICE_CHECK(st == dnnl_success) << "dnnl_sgemm failed (status " << int(st) << ") for M=" << m
                                      << " N=" << n << " K=" << K;
  });
}

const char* blas_backend_name() { return "oneDNN sgemm"; }

void blas_set_num_threads(int n) { omp_set_num_threads(n); }

}  // namespace lattice
