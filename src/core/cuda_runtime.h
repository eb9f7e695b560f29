// The CUDA runtime as the rest of lattice sees it: whether a GPU can be used, which
// one this rank drives, device memory and copies, and the compute stream every CUDA
// kernel of a rank is launched on. No CUDA header leaks out of here, so code above the
// kernels compiles the same with and without the CUDA backend.
//
// Built without CUDA (LATTICE_CUDA=OFF, or no toolkit), available() is false with the
// reason, and every other call fails with that reason.
#pragma once
#include <cstddef>
#include <string>

namespace lattice::cuda {

// True when lattice was compiled with its CUDA backend.
bool built_with_cuda();
// True when a CUDA device can be used by this process (backend built, driver loaded,
// at least one device).
bool available();
// Why available() is false ("built without the CUDA backend", "no CUDA device", the
// driver's error ...); empty when it is true.
std::string unavailable_reason();
int device_count();
// One GPU per rank: device local_rank % device_count(). Creates the compute stream.
void select_device(int local_rank);
int current_device();
// "NVIDIA H200 (sm_90, 139 GiB)" for logs.
std::string device_description();

void* malloc_device(size_t bytes);  // zeroed; fails with the size and the device's free memory
void free_device(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
// rows blocks of width bytes, at dst_pitch and src_pitch bytes from one to the next (cudaMemcpy2D).
void copy_rows_device_to_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                size_t rows);
void memset_device(void* p, int value, size_t bytes);
// Waits for the compute stream.
void synchronize();
// The compute stream (a cudaStream_t) of this rank.
void* compute_stream();
// Empty while the CUDA context works (or no GPU is used); else the error that broke it.
// A kernel that faults (an illegal address, a trap) leaves a "sticky" error, after which
// every CUDA call of the process fails; a non-sticky error still pending (a bad launch
// configuration) is cleared, so the next call does not report it.
std::string context_error();

// Owning device buffer (tests, benchmarks, staging).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : ptr_(bytes ? malloc_device(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { if (ptr_) free_device(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace lattice::cuda
