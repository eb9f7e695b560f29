// Shared by the CUDA kernels (.cu files only): the rank's compute stream, kernel launches,
// launch checks and grid sizing. Every kernel of a rank runs on cuda::compute_stream(), in
// order.
//
// Under the SIMT emulation (LATTICE_CUDA_SIMT, tests/simt/) the .cu files are compiled as
// host C++ and every launch queues the kernel, its arguments copied, to run its threads on
// the CPU in stream order (tests/simt/simt_device.h gives the device built-ins); that is why kernels are launched through launch() and
// dynamic shared memory is declared with LATTICE_DYNAMIC_SHARED.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace lattice::cuda {

inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

// kernel<<<grid, block, shared_bytes, stream()>>>(args...): launched on the compute stream.
#if LATTICE_CUDA_SIMT || defined(__CUDACC__)
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
#if LATTICE_CUDA_SIMT
  ::lattice::simt::launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream(),
                          [kernel, args...] { kernel(args...); });
#else
  kernel<<<grid, block, shared_bytes, stream()>>>(std::forward<Args>(args)...);
#endif
}
#endif

// The kernel's dynamic shared memory (the launch's shared_bytes), as an array of T.
#if LATTICE_CUDA_SIMT
#define LATTICE_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::lattice::simt::dynamic_shared())
#else
#define LATTICE_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

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
