// How the CPU GEMMs cut one product into blocks for threads (internal to src/blas).
// Determinism: a BLAS that splits one product across threads may split the K reduction
// differently for different thread counts, which changes the last bits. lattice instead
// cuts C into blocks whose shapes depend only on the problem, and runs one
// single-threaded call per block (oneDNN runs sequentially inside an OpenMP parallel
// region); a small product is one call on one thread. Every element is then computed by
// the same call whatever the thread count.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "blas/gemm.h"

namespace lattice::blas_detail {

// Products below this many multiply-adds run as one call.
constexpr int64_t kMinParallelWork = int64_t(1) << 21;
// Target block extent along the split dimension.
constexpr int64_t kBlock = 512;

// Runs the BLAS calls of its scope on the calling thread alone (OpenMP's thread count
// for regions started by this thread is 1 until the scope ends).
class SingleThreaded {
 public:
  SingleThreaded() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(threads_); }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int threads_;
};

// Calls call(ta, tb, M', N', K, A', B', C') for each block of C (all of C at once for small
// products). T is the element type of A and B.
template <class T, class Call>
void for_each_block(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                    const T* B, int64_t ldb, float* C, int64_t ldc, const Call& call) {
  if (omp_in_parallel()) {
    call(M, N, A, B, C);
    return;
  }
  if (M * N * K < kMinParallelWork) {
    // One thread: the BLAS must not split a small product's K reduction among threads
    // either (oneDNN's AVX2 sgemm does, for some shapes).
    const SingleThreaded one;
    call(M, N, A, B, C);
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
      const T* Ab = ta == Trans::N ? A + s * lda : A + s;
      call(n, N, Ab, B, C + s * ldc);
    } else {
      const T* Bb = tb == Trans::N ? B + s : B + s * ldb;
      call(M, n, A, Bb, C + s);
    }
  }
}

}  // namespace lattice::blas_detail
