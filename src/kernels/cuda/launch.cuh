// Shared by the CUDA kernels (.cu files only): the rank's compute stream, launch checks
// and grid sizing. Every kernel of a rank runs on cuda::compute_stream(), in order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace lattice::cuda {

inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

// Checks a launch (the configuration; faults inside a kernel surface at the next sync).
#define LATTICE_CUDA_LAUNCHED(what)                                                        \
  do {                                                                                     \
    const cudaError_t err_ = cudaGetLastError();                                           \
    LATTICE_CHECK(err_ == cudaSuccess) << "CUDA kernel " << what << ": " << cudaGetErrorString(err_); \
  } while (0)

#define LATTICE_CUDA_CALL(call)                                                            \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    LATTICE_CHECK(err_ == cudaSuccess) << #call << ": " << cudaGetErrorString(err_);       \
  } while (0)

// Blocks of `threads` covering n elements (at most 65535 * 1024 blocks; kernels
// loop with a grid stride beyond that).
inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535 * 1024) b = 65535 * 1024;
  return unsigned(b);
}

}  // namespace lattice::cuda
