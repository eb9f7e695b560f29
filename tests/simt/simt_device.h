// The SIMT emulation: lattice's CUDA sources compiled as host C++ and run on the CPU, so
// the GPU code path (kernels, launches, runtime calls, cuBLASLt and NCCL calls) is tested
// on a machine without a GPU (docs/cuda.md, "The SIMT emulation").
//
// This header is force-included (-include) into every src/**/*.cu compiled for the
// emulation (with LATTICE_CUDA_SIMT=1). It gives the device built-ins the kernels use:
// threadIdx, blockIdx, blockDim, gridDim, __shared__, __syncthreads, the warp shuffles,
// the atomics, the _rn intrinsics, __trap, and the tensor cores' mma.m16n8k16 in
// software. A launch (kernels/cuda/launch.cuh: launch()) is queued on its stream
// (simt_streams.h); when the stream's work runs, every thread of every block runs as a
// fiber on the calling thread (simt_scheduler.cpp): a block at a time, its threads in a
// shuffled order, each until it finishes or waits at __syncthreads or a warp-wide operation; a
// warp's operation completes when all its lanes have arrived, a barrier when all the
// block's threads have. What the emulation catches besides wrong results: a __syncthreads
// or shuffle some threads never reach (deadlock), a shuffle with a lane that has exited,
// launch configurations the GPU rejects (block size, grid size, dynamic shared memory
// beyond the kernel's limit), uninitialized shared and scratch memory (filled with NaN
// bytes), a missing barrier (another order of the threads reads what is not yet written),
// copies outside an allocation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

namespace lattice::simt {

// The running thread's coordinates, set by the scheduler whenever it resumes a thread.
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

// The running block's dynamic shared memory (the launch's shared_bytes, 16-byte aligned).
unsigned char* dynamic_shared();
// __syncthreads(): waits until every thread of the block has arrived.
void syncthreads();

enum class WarpOp : uint8_t { shfl_idx, shfl_xor, shfl_down, shfl_up, vote_any, vote_all, ballot, mma_bf16, mma_fp16 };
// A lane's operands and results of a warp-wide operation: shuffles move u[0..1] (a value of
// up to 8 bytes); votes read the predicate from u[0] and return u[0]; the mma reads A from
// u[0..3], B from u[4..5], and returns D in f[0..3].
struct WarpRegs {
  uint32_t u[6];
  float f[4];
};
// Every lane in `mask` calls it with the same op, mask, arg and width; returns this lane's
// result once all of them have arrived.
WarpRegs warp_op(WarpOp op, unsigned mask, int arg, int width, const WarpRegs& mine);

// Queues body (one thread's kernel call, its arguments copied as a launch copies them) on
// the stream, to run as every thread of the grid when the stream's work runs
// (simt_streams.h). A configuration the GPU rejects goes to cudaGetLastError() at once; a
// failure while running, at the next synchronization.
void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> body);

// __trap(): the kernel stops; the launch reports it through cudaGetLastError().
[[noreturn]] void trap();

template <typename T>
T shuffle(WarpOp op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move values of up to 8 bytes");
  WarpRegs r{};
  std::memcpy(r.u, &v, sizeof(T));
  r = warp_op(op, mask, arg, width, r);
  T out;
  std::memcpy(&out, r.u, sizeof(T));
  return out;
}

// d += a b for the warp's m16n8k16 fragments (PTX ISA layout; bf16 or fp16 operands).
inline void mma_m16n8k16(bool fp16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpRegs r{};
  for (int i = 0; i < 4; ++i) r.u[i] = a[i];
  r.u[4] = b0;
  r.u[5] = b1;
  r = warp_op(fp16 ? WarpOp::mma_fp16 : WarpOp::mma_bf16, 0xffffffffu, 0, 32, r);
  for (int e = 0; e < 4; ++e) d[e] += r.f[e];
}

}  // namespace lattice::simt

#define threadIdx (::lattice::simt::thread_idx)
#define blockIdx (::lattice::simt::block_idx)
#define blockDim (::lattice::simt::block_dim)
#define gridDim (::lattice::simt::grid_dim)

// A block's static shared memory: one object per kernel, which the block running (blocks
// run one at a time) owns.
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { ::lattice::simt::syncthreads(); }
[[noreturn]] inline void __trap() { ::lattice::simt::trap(); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::shfl_idx, mask, v, src_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::shfl_xor, mask, v, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::shfl_down, mask, v, int(delta), width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::shfl_up, mask, v, int(delta), width);
}

inline int __any_sync(unsigned mask, int predicate) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::vote_any, mask, predicate ? 1u : 0u, 0, 32);
}
inline int __all_sync(unsigned mask, int predicate) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::vote_all, mask, predicate ? 1u : 0u, 0, 32);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::lattice::simt::shuffle(::lattice::simt::WarpOp::ballot, mask, predicate ? 1u : 0u, 0, 32);
}

// The device's min and max (CUDA declares them for every arithmetic pair).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(b) < T(a) ? T(b) : T(a);
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return T(a) < T(b) ? T(b) : T(a);
}

// The C++ forms of the kernel attributes (cuda_runtime.h gives them to nvcc only).
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
template <typename T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* kernel) {
  return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(kernel));
}

// One block's threads run one at a time: the atomics are plain read-modify-writes.
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = v > old ? v : old;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}

// The device's classification functions, in the global namespace as CUDA has them.
using std::isfinite;
using std::isinf;
using std::isnan;

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Correctly rounded fp32 arithmetic, never merged into a multiply-add: the empty asm
// statements make the operands and the result opaque to the compiler's contraction (the
// rest of the kernels' code is contracted as the compiler sees fit, as nvcc does).
inline float __fadd_rn(float a, float b) {
  asm("" : "+x"(a), "+x"(b));
  float r = a + b;
  asm("" : "+x"(r));
  return r;
}
inline float __fmul_rn(float a, float b) {
  asm("" : "+x"(a), "+x"(b));
  float r = a * b;
  asm("" : "+x"(r));
  return r;
}
