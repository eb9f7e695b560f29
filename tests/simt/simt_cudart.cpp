// The SIMT emulation's CUDA runtime: the runtime API functions lattice calls, on the CPU.
// Linked instead of libcudart into the emulation's tests. One "device" (sm_90, 227 KiB of
// opt-in shared memory per block); device memory is host memory. Streams and events are
// simt_streams.h's: a stream's operations run in order when something waits for them
// (copies from pageable host memory read their source when enqueued and copies to it
// complete before they return, as CUDA's do). What it checks as the GPU would: launch
// configurations (block and grid limits, dynamic shared memory against the kernel's
// limit, 48 KiB unless raised by cudaFuncSetAttribute), copies and memsets inside a device
// allocation, frees of allocated pointers only. New allocations are filled with NaN bytes
// (cudaMalloc does not zero; lattice's device_alloc must).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "simt_state.h"
#include "simt_streams.h"

namespace lattice::simt {
namespace {

constexpr int kMaxSharedOptin = 232448;      // bytes per block (sm_90)
constexpr int kDefaultDynamicShared = 49152;  // without cudaFuncSetAttribute
constexpr size_t kTotalMemory = size_t(64) << 30;

struct State {
  std::map<uintptr_t, size_t> allocations;  // base -> bytes
  size_t in_use = 0;
  std::map<const void*, int> max_dynamic_shared;  // per kernel
  cudaError_t last = cudaSuccess;
  std::string detail;
};
State& state() {
  static State s;
  return s;
}

cudaError_t fail(cudaError_t code, const std::string& detail) {
  State& s = state();
  s.last = code;
  s.detail = detail;
  return code;
}

// Whether [p, p + bytes) lies inside one device allocation.
bool on_device(const void* p, size_t bytes) {
  State& s = state();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocations.upper_bound(a);
  if (it == s.allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}
bool is_device_pointer(const void* p) { return on_device(p, 1); }

std::string hex(const void* p) {
  std::ostringstream o;
  o << p;
  return o.str();
}

struct MemPool {};

// A kernel's failure, returned by every synchronization after it (sticky, as on the GPU).
cudaError_t sticky() { return state().last == cudaErrorLaunchFailure ? cudaErrorLaunchFailure : cudaSuccess; }

// Frees a device allocation (already known to be one).
void release(void* p) {
  State& s = state();
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocations.end()) return;
  s.in_use -= it->second;
  s.allocations.erase(it);
  std::free(p);
}

cudaError_t check_free(void* p, const char* what) {
  if (state().allocations.count(reinterpret_cast<uintptr_t>(p))) return cudaSuccess;
  return fail(cudaErrorInvalidDevicePointer, std::string(what) + " of " + hex(p) + ", not an allocation's start");
}

}  // namespace

std::string launch_config_error(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  std::ostringstream o;
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    o << "a grid or block dimension is 0";
  else if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    o << "block " << block.x << "x" << block.y << "x" << block.z << " exceeds 1024 threads (or 1024, 1024, 64)";
  else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    o << "grid " << grid.x << "x" << grid.y << "x" << grid.z << " exceeds (2^31-1, 65535, 65535)";
  else {
    State& s = state();
    auto it = s.max_dynamic_shared.find(kernel);
    const size_t limit = size_t(it == s.max_dynamic_shared.end() ? kDefaultDynamicShared : it->second);
    if (shared_bytes > limit)
      o << shared_bytes << " bytes of dynamic shared memory, over the kernel's " << limit
        << (it == s.max_dynamic_shared.end() ? " (not raised with cudaFuncSetAttribute)" : "");
  }
  return o.str();
}

void record_launch_error(cudaError_t code, const std::string& detail) { fail(code, detail); }

std::string kernel_name(const void* kernel) { return "kernel " + hex(kernel); }

}  // namespace lattice::simt

using lattice::simt::fail;
using lattice::simt::state;

extern "C" {

cudaError_t cudaGetLastError() {
  auto& s = state();
  const cudaError_t e = s.last;
  s.last = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t error) {
  static thread_local std::string text;
  auto& s = state();
  text = std::string(cudaGetErrorName(error));
  if (error != cudaSuccess && !s.detail.empty()) text += " (SIMT emulation: " + s.detail + ")";
  return text.c_str();
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaError (other)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "device " + std::to_string(device));
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "device " + std::to_string(device));
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "SIMT emulation on the CPU");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = lattice::simt::kTotalMemory;
  prop->sharedMemPerBlock = 49152;
  prop->sharedMemPerBlockOptin = lattice::simt::kMaxSharedOptin;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = lattice::simt::kMaxSharedOptin; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 49152; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(int(attr)));
  }
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  lattice::simt::drain_all();
  return lattice::simt::sticky();
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = lattice::simt::kTotalMemory;
  *free_bytes = lattice::simt::kTotalMemory - state().in_use;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  auto& s = state();
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* q = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!q) return fail(cudaErrorMemoryAllocation, std::to_string(bytes) + " bytes");
  std::memset(q, 0xff, bytes);  // not zeroed: NaN bytes
  s.allocations[reinterpret_cast<uintptr_t>(q)] = bytes;
  s.in_use += bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (const cudaError_t e = lattice::simt::check_free(p, "cudaFree"); e != cudaSuccess) return e;
  lattice::simt::drain_all();  // cudaFree synchronizes the device
  lattice::simt::release(p);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!p) return cudaSuccess;
  if (const cudaError_t e = lattice::simt::check_free(p, "cudaFreeAsync"); e != cudaSuccess) return e;
  lattice::simt::enqueue(stream, [p] { lattice::simt::release(p); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!lattice::simt::on_device(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(bytes) + " bytes at " +
                                           lattice::simt::hex(p) + " outside a device allocation");
  lattice::simt::enqueue(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  using lattice::simt::on_device;
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = on_device(dst, bytes), src_dev = on_device(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && !lattice::simt::is_device_pointer(src); break;
    case cudaMemcpyDeviceToHost: ok = src_dev && !lattice::simt::is_device_pointer(dst); break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyDefault:
      ok = (dst_dev || !lattice::simt::is_device_pointer(dst)) && (src_dev || !lattice::simt::is_device_pointer(src));
      break;
    default: ok = false;
  }
  if (!ok)
    return fail(cudaErrorInvalidValue, "cudaMemcpyAsync (kind " + std::to_string(int(kind)) + ") of " +
                                           std::to_string(bytes) + " bytes from " + lattice::simt::hex(src) + " to " +
                                           lattice::simt::hex(dst) + ": a device side outside an allocation, or a " +
                                           "host pointer where the kind says device");
  // Host memory here is pageable (lattice pins none): a copy to it completes before
  // returning, a copy from it reads the source before returning.
  if (!dst_dev) {
    lattice::simt::drain(stream);
    std::memmove(dst, src, bytes);
    return lattice::simt::sticky();
  }
  if (!src_dev) {
    const auto* from = static_cast<const unsigned char*>(src);
    auto staged = std::make_shared<std::vector<unsigned char>>(from, from + bytes);
    lattice::simt::enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  lattice::simt::enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

// Device to device only (what lattice's strided copies do): `height` rows of `width` bytes.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  using lattice::simt::on_device;
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidPitchValue, "cudaMemcpy2DAsync: width " + std::to_string(width) +
                                                " exceeds a pitch (" + std::to_string(dpitch) + ", " +
                                                std::to_string(spitch) + ")");
  const size_t dst_span = (height - 1) * dpitch + width, src_span = (height - 1) * spitch + width;
  if (!(kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDefault) || !on_device(dst, dst_span) ||
      !on_device(src, src_span))
    return fail(cudaErrorInvalidValue, "cudaMemcpy2DAsync (kind " + std::to_string(int(kind)) + ") of " +
                                           std::to_string(height) + " x " + std::to_string(width) + " bytes from " +
                                           lattice::simt::hex(src) + " to " + lattice::simt::hex(dst) +
                                           ": the emulation copies within device allocations only");
  lattice::simt::enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  });
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = cudaPointerAttributes{};
  const bool dev = lattice::simt::is_device_pointer(p);
  a->type = dev ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  a->device = dev ? 0 : -1;
  a->devicePointer = dev ? const_cast<void*>(p) : nullptr;
  a->hostPointer = dev ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = lattice::simt::create_stream();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  lattice::simt::destroy_stream(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  // A kernel's failure surfaces at the next synchronization, as on the GPU.
  lattice::simt::drain(s);
  return lattice::simt::sticky();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  lattice::simt::wait_event(s, e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = lattice::simt::create_event();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  lattice::simt::destroy_event(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  lattice::simt::record_event(e, s);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return lattice::simt::query_event(e) ? lattice::simt::sticky() : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  lattice::simt::synchronize_event(e);
  return lattice::simt::sticky();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  if (!lattice::simt::event_completed(start) || !lattice::simt::event_completed(stop)) return cudaErrorNotReady;
  *ms = lattice::simt::elapsed_ms(start, stop);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int) {
  static lattice::simt::MemPool the_pool;
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > lattice::simt::kMaxSharedOptin)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                           " bytes of dynamic shared memory, over the device's " +
                                           std::to_string(lattice::simt::kMaxSharedOptin));
  state().max_dynamic_shared[func] = value;
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  *attr = cudaFuncAttributes{};
  auto& s = state();
  auto it = s.max_dynamic_shared.find(func);
  attr->maxDynamicSharedSizeBytes = it == s.max_dynamic_shared.end() ? lattice::simt::kDefaultDynamicShared : it->second;
  attr->sharedSizeBytes = 0;
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  return cudaSuccess;
}

}  // extern "C"
