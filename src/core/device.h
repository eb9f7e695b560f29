// Where a rank's tensors live and its kernels run: the CPU, or one CUDA device per rank
// (--device cuda). Chosen once at start-up, before any parameter or activation is
// allocated; the code above the kernels is the same for both (docs/cuda.md).
//
// Device memory goes through this header: device_alloc for buffers kernels touch, and
// explicit copies wherever host code reads or writes them. On the CPU these are plain
// host memory and memcpy.
//
// CUDA emulation (tests, no GPU needed): set_device(Device::cuda) with
// LATTICE_EMULATE_CUDA=1 (or set_cuda_emulation(true) first) keeps the CPU kernels but
// allocates "device" memory in pages the host cannot touch (PROT_NONE) except inside a
// kernel (DeviceAccess) or a copy. Host code that reads device memory without a copy
// then faults at once, so the whole CUDA code path above the kernels is exercised, and
// its host/device traffic checked, on a machine without a GPU. With one process only
// (other ranks' MPI writes into guarded pages would fault): with more, the guard is off.
#pragma once
#include <cstddef>
#include <memory>

#include "core/op_profiler.h"

namespace lattice {

enum class Device { cpu, cuda };
const char* device_name(Device d);
// "cpu" or "cuda"; fails naming --device otherwise.
Device parse_device(const char* name);

Device current_device();
// Selects the device for this process. cuda: the rank's GPU (local_rank % GPUs), or the
// emulation. Fails with the reason when no GPU can be used.
void set_device(Device d, int local_rank = 0);
// Tests: choose the emulation for the next set_device(Device::cuda).
void set_cuda_emulation(bool on);
bool cuda_emulated();
// Kernels run on a real GPU (current_device() == cuda and not emulated).
bool kernels_on_gpu();

// Buffers of the current device, zeroed, 64-byte aligned.
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);

// What device_alloc holds now and has held at most (the bytes asked for), and how many
// buffers are alive: Megatron's --log-memory-to-tensorboard allocated figures.
struct DeviceAllocStats {
  size_t allocated_bytes = 0, peak_allocated_bytes = 0;
  int64_t allocations = 0;
};
DeviceAllocStats device_alloc_stats();
// Host <-> device copies (synchronous for the host side: the data may be used or
// changed as soon as they return). On the CPU, memcpy.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
// A strided copy on the device: `rows` blocks of `width` bytes, block r from src + r src_pitch
// to dst + r dst_pitch (cudaMemcpy2D's arguments; the blocks must not overlap).
void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows);
void zero_on_device(void* p, size_t bytes);
// Waits for the device's queued work (a no-op on the CPU).
void device_synchronize();

// While alive, the CPU may touch device memory (emulation only; free otherwise). Every
// CPU kernel entry and every host-side collective holds one.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// An owning device buffer.
struct DeviceFree {
  size_t bytes = 0;
  void operator()(void* p) const { device_free(p, bytes); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;
inline DevicePtr make_device_buffer(size_t bytes) { return DevicePtr(device_alloc(bytes), DeviceFree{bytes}); }

}  // namespace lattice

// At the top of every kernel with a CUDA twin (same name and arguments in
// namespace lattice::cuda): on a GPU the twin runs; otherwise the CPU code below it,
// with device memory accessible. Under --profile-ops each call is timed under the
// kernel's name (core/op_profiler.h): the twin's launch by CUDA events on the compute
// stream, the CPU code by the wall clock until the function returns.
#if LATTICE_WITH_CUDA
#define LATTICE_KERNEL_ENTRY(cuda_call)                                         \
  if (::lattice::kernels_on_gpu()) {                                            \
    ::lattice::OpTimer lattice_op_timer_(__func__, ::lattice::OpClock::gpu);    \
    return cuda_call;                                                           \
  }                                                                             \
  ::lattice::OpTimer lattice_op_timer_(__func__);                               \
  ::lattice::DeviceAccess lattice_device_access_
#else
#define LATTICE_KERNEL_ENTRY(cuda_call)           \
  ::lattice::OpTimer lattice_op_timer_(__func__); \
  ::lattice::DeviceAccess lattice_device_access_
#endif
