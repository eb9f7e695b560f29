// A thread block's own small fp32 product (.cu only): out(i, j) = sum_k a(i, k) b(k, j) for i < m, j < n,
// k < kk, computed by the whole block, for the chunked scans' products of a chunk's rows (a few dozen to a
// few hundred in each dimension, too small and too many for a cuBLASLt call each). The operands come through
// functors (any layout, any scaling of rows or columns, global or shared memory); tiles of 64 x 64 outputs,
// each k-slice of 16 staged in shared memory, each of the block's 256 threads summing a 4 x 4 micro-tile in
// registers (rows ty + 16 r, columns tx + 16 c: a warp reads the staged B slice without bank conflicts and
// the A slice as a broadcast). Every output's terms are added in k order, so results depend on the data and
// the shape only.
//
// Each output is handed to out(i, j, v), which returns a value to add to row i's sum (0 where none is
// wanted); after a row's last column row(i, sum) receives that sum, added over the columns in a fixed order
// (each thread's in column order, then the 16 threads of a row by a shuffle tree).
//
// Every thread of the block must call it, with blockDim.x == kBlockGemmThreads, and one BlockGemmStage in
// shared memory (the kernel's, one for all its calls). It starts and ends with a barrier: what the block
// wrote before the call is read by it, and what out() and row() wrote is seen by the whole block after it
// (and may overwrite the operands).
#pragma once
#include <cstdint>

#include "kernels/cuda/launch.cuh"

namespace lattice::cuda {

inline constexpr int kBlockGemmThreads = 256;

struct NoRowSum {
  __device__ void operator()(int64_t, float) const {}
};

// Rows of a row-major array, row i at i * ld: an operand or an output of block_gemm.
template <typename T>
struct Rows {
  T* at;
  int64_t ld;
  __device__ T& operator()(int64_t i, int64_t j) const { return at[i * ld + j]; }
};

// out() functors: each output stored into, or added to, view(i, j) (no row sums).
template <typename View>
struct StoreTo {
  View view;
  __device__ float operator()(int64_t i, int64_t j, float x) const {
    view(i, j) = x;
    return 0.0f;
  }
};
template <typename View>
struct AddTo {
  View view;
  __device__ float operator()(int64_t i, int64_t j, float x) const {
    view(i, j) += x;
    return 0.0f;
  }
};
template <typename View>
__device__ StoreTo<View> store_to(View v) {
  return {v};
}
template <typename View>
__device__ AddTo<View> add_to(View v) {
  return {v};
}

namespace block_gemm_detail {
constexpr int kTile = 64, kSlice = 16, kLanes = 16, kMicro = 4;  // kLanes x kMicro = kTile

// Stages x(i, k) for the tile's rows r0.. and the slice's k0.. into st[k][r] (zeros outside). KMajor: the
// threads run along k first (operands contiguous in k), else along the rows.
template <bool KMajor, typename X>
__device__ void stage(float (*st)[kTile + 1], X x, int64_t r0, int64_t rows, int64_t k0, int64_t kk) {
  for (int e = int(threadIdx.x); e < kTile * kSlice; e += kBlockGemmThreads) {
    const int k = KMajor ? e % kSlice : e / kTile, r = KMajor ? e / kSlice : e % kTile;
    st[k][r] = r0 + r < rows && k0 + k < kk ? x(r0 + r, k0 + k) : 0.0f;
  }
}
}  // namespace block_gemm_detail

// The staged k-slices of a and b.
struct BlockGemmStage {
  float a[block_gemm_detail::kSlice][block_gemm_detail::kTile + 1];
  float b[block_gemm_detail::kSlice][block_gemm_detail::kTile + 1];
};

// AKMajor / BKMajor: whether a(i, k) / b(k, j) is contiguous in k (the staging loads then run along k).
template <bool AKMajor, bool BKMajor, typename A, typename B, typename Out, typename Row = NoRowSum>
__device__ void block_gemm(BlockGemmStage& st, int64_t m, int64_t n, int64_t kk, A a, B b, Out out, Row row = {}) {
  using namespace block_gemm_detail;
  auto& as = st.a;
  auto& bs = st.b;
  // b's staging reads b(k, j) as a function of (j, k).
  const auto bt = [&](int64_t j, int64_t k) { return b(k, j); };
  const int tx = int(threadIdx.x) % kLanes, ty = int(threadIdx.x) / kLanes;
  __syncthreads();  // the caller's writes of the operands are done
  for (int64_t i0 = 0; i0 < m; i0 += kTile) {
    float rows[kMicro] = {};  // this thread's share of its rows' sums
    for (int64_t j0 = 0; j0 < n; j0 += kTile) {
      float acc[kMicro][kMicro] = {};
      for (int64_t k0 = 0; k0 < kk; k0 += kSlice) {
        stage<AKMajor>(as, a, i0, m, k0, kk);
        stage<BKMajor>(bs, bt, j0, n, k0, kk);
        __syncthreads();
        for (int k = 0; k < kSlice; ++k) {
          float av[kMicro], bv[kMicro];
          for (int r = 0; r < kMicro; ++r) av[r] = as[k][ty + kLanes * r];
          for (int c = 0; c < kMicro; ++c) bv[c] = bs[k][tx + kLanes * c];
          for (int r = 0; r < kMicro; ++r)
            for (int c = 0; c < kMicro; ++c) acc[r][c] += av[r] * bv[c];
        }
        __syncthreads();  // the slice's readers are done before the next is staged
      }
      for (int r = 0; r < kMicro; ++r)
        for (int c = 0; c < kMicro; ++c) {
          const int64_t i = i0 + ty + kLanes * r, j = j0 + tx + kLanes * c;
          if (i < m && j < n) rows[r] += out(i, j, acc[r][c]);
        }
    }
    // A row's 16 threads are 16 consecutive lanes of one warp: their sums by a shuffle tree to tx 0.
    for (int r = 0; r < kMicro; ++r) {
      float v = rows[r];
      for (int offset = kLanes / 2; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset, kLanes);
      const int64_t i = i0 + ty + kLanes * r;
      if (tx == 0 && i < m) row(i, v);
    }
  }
  __syncthreads();  // the operands' readers are done
}

}  // namespace lattice::cuda
