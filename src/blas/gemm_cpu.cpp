// CPU GEMM through oneDNN's sgemm (JIT kernels for AVX-512 / AVX2, chosen at run
// time). Measured on the development machine (docs/benchmarks.md) it runs the
// model's shapes at 2-3x the throughput of Debian's OpenBLAS.
//
// Determinism: a BLAS that splits one product across threads may split the K
// reduction differently for different thread counts, which changes the last bits.
// lattice instead cuts C into blocks whose shapes depend only on the problem, and
// runs one single-threaded sgemm per block (oneDNN runs sequentially inside an OpenMP
// parallel region). Every element is then computed by the same call whatever the
// thread count.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>

#include "blas/gemm.h"
#include "core/error.h"

namespace lattice {
namespace {

// Products below this many multiply-adds run as one call.
constexpr int64_t kMinParallelWork = int64_t(1) << 21;
// Target block extent along the split dimension.
constexpr int64_t kBlock = 512;

void sgemm_call(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(ta == Trans::T ? 'T' : 'N', tb == Trans::T ? 'T' : 'N', M, N, K,
                                alpha, A, lda, B, ldb, beta, C, ldc);
  LATTICE_CHECK(st == dnnl_success) << "dnnl_sgemm failed (status " << int(st) << ") for M=" << M
                                    << " N=" << N << " K=" << K;
}

}  // namespace

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (M * N * K < kMinParallelWork || omp_in_parallel()) {
    sgemm_call(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Split the larger of M and N into an even number of equal blocks (multiples of 16).
  const bool split_m = M >= N;
  const int64_t extent = split_m ? M : N;
  int64_t blocks = (extent + kBlock - 1) / kBlock;
  if (blocks > 1 && blocks % 2) ++blocks;
  const int64_t size = ((extent + blocks - 1) / blocks + 15) / 16 * 16;
  blocks = (extent + size - 1) / size;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t s = i * size, n = std::min(extent, s + size) - s;
    if (split_m) {
      const float* Ab = ta == Trans::N ? A + s * lda : A + s;
      sgemm_call(ta, tb, n, N, K, alpha, Ab, lda, B, ldb, beta, C + s * ldc, ldc);
    } else {
      const float* Bb = tb == Trans::N ? B + s : B + s * ldb;
      sgemm_call(ta, tb, M, n, K, alpha, A, lda, Bb, ldb, beta, C + s, ldc);
    }
  }
}

const char* blas_backend_name() { return "oneDNN sgemm"; }

void blas_set_num_threads(int n) { omp_set_num_threads(n); }

}  // namespace lattice
