// Deterministic reductions shared by the CUDA op kernels (.cu only): block-wide sums and
// maxima with a fixed shuffle tree, and column sums of an [N, C] array through partial
// sums over fixed row chunks added in chunk order. No float atomics: a result depends
// only on the data and the shape, never on scheduling.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/launch.cuh"

namespace lattice::cuda {

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Reduces v over the block (1-D, blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. Every thread of the block must call it.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T warp_vals[32];
  __shared__ T result;
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous call's readers are done with warp_vals and result
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? warp_vals[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

template <typename T>
__device__ T block_sum(T v) { return block_reduce(v, SumOp{}, T(0)); }

// ---- column sums: out_k[c] += sum_n f(n, c)[k] for K outputs, deterministic.
inline constexpr int kColTile = 32;          // columns per block (threadIdx.x)
inline constexpr int kRowLanes = 8;          // row lanes per block (threadIdx.y)
inline constexpr int64_t kRowsPerChunk = 256;

// partial[(chunk * K + k) * C + c] = sum over the chunk's rows, lanes added in order.
template <int K, typename F>
__global__ void column_partials_kernel(float* partial, F f, int64_t N, int64_t C) {
  __shared__ float sh[K][kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kColTile + tx;
  const int64_t r0 = int64_t(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float acc[K];
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < C)
    for (int64_t n = r0 + ty; n < r1; n += kRowLanes) {
      float v[K];
      f(n, c, v);
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  for (int k = 0; k < K; ++k) sh[k][ty][tx] = acc[k];
  __syncthreads();
  if (ty == 0 && c < C)
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int j = 0; j < kRowLanes; ++j) s += sh[k][j][tx];
      partial[(int64_t(blockIdx.y) * K + k) * C + c] = s;
    }
}

struct ColumnOutputs {
  float* out[3];
};

template <int K>
__global__ void column_finish_kernel(ColumnOutputs outs, const float* partial, int64_t chunks,
                                     int64_t C) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x)
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < chunks; ++j) s += partial[(j * K + k) * C + c];
      outs.out[k][c] += s;
    }
}

// outs.out[k][c] += sum_n f(n, c)[k], k < K <= 3, f a __device__ functor
// void(int64_t n, int64_t c, float v[K]).
template <int K, typename F>
void column_sums_accumulate(ColumnOutputs outs, F f, int64_t N, int64_t C, const char* what) {
  static_assert(K >= 1 && K <= 3, "column_sums_accumulate: one to three outputs");
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t tiles = (C + kColTile - 1) / kColTile;
  LATTICE_CHECK(chunks <= 65535 && tiles <= 2147483647) << what << ": N " << N << " x C " << C << " too large";
  float* partial = nullptr;
  LATTICE_CUDA_CALL(cudaMallocAsync(reinterpret_cast<void**>(&partial),
                                    size_t(chunks * K * C) * sizeof(float), stream()));
  launch(column_partials_kernel<K, F>, dim3(unsigned(tiles), unsigned(chunks)), dim3(kColTile, kRowLanes), 0,
      partial, f, N, C);
  LATTICE_CUDA_LAUNCHED(what);
  launch(column_finish_kernel<K>, grid_for(C, 256), 256, 0, outs, partial, chunks, C);
  LATTICE_CUDA_LAUNCHED(what);
  LATTICE_CUDA_CALL(cudaFreeAsync(partial, stream()));
}

// Grid for one block per row with a block-uniform grid-stride loop over rows.
inline unsigned grid_rows(int64_t N) { return unsigned(N < 65535 * 16 ? (N < 1 ? 1 : N) : 65535 * 16); }

}  // namespace lattice::cuda
