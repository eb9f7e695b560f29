#include "core/cuda_runtime.h"

#include <cstdint>
#include <sstream>

#include "core/error.h"

#if LATTICE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lattice::cuda {

bool built_with_cuda() { return LATTICE_WITH_CUDA != 0; }

#if LATTICE_WITH_CUDA

namespace {

#define LATTICE_CUDART(call)                                                                  \
  do {                                                                                        \
    const cudaError_t err_ = (call);                                                          \
    LATTICE_CHECK(err_ == cudaSuccess) << #call << ": " << cudaGetErrorString(err_);          \
  } while (0)

struct State {
  bool probed = false;
  int count = 0;
  std::string reason;
  int device = -1;
  cudaStream_t stream = nullptr;
};

State& state() {
  static State s;
  if (!s.probed) {
    s.probed = true;
    const cudaError_t err = cudaGetDeviceCount(&s.count);
    if (err != cudaSuccess) {
      s.count = 0;
      s.reason = std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
      (void)cudaGetLastError();  // clear the sticky error
    } else if (s.count == 0) {
      s.reason = "no CUDA device";
    }
  }
  return s;
}

State& ready() {
  State& s = state();
  LATTICE_CHECK(s.count > 0) << "CUDA: " << s.reason;
  if (s.device < 0) select_device(0);
  return s;
}

}  // namespace

bool available() { return state().count > 0; }
std::string unavailable_reason() { return state().reason; }
int device_count() { return state().count; }

void select_device(int local_rank) {
  State& s = state();
  LATTICE_CHECK(s.count > 0) << "--device cuda: " << s.reason;
  const int d = local_rank % s.count;
  LATTICE_CUDART(cudaSetDevice(d));
  if (s.stream && s.device != d) {
    LATTICE_CUDART(cudaStreamDestroy(s.stream));
    s.stream = nullptr;
  }
  s.device = d;
  if (!s.stream) LATTICE_CUDART(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  // The kernels' stream-ordered scratch (cudaMallocAsync: column sums, reductions) comes
  // from the device's default pool. Its default release threshold (0) hands the pool's
  // memory back to the driver at every synchronisation (each loss read), so the next
  // iteration maps it again; keep it instead.
  cudaMemPool_t pool = nullptr;
  LATTICE_CUDART(cudaDeviceGetDefaultMemPool(&pool, d));
  uint64_t keep = UINT64_MAX;
  LATTICE_CUDART(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

int current_device() { return ready().device; }

std::string device_description() {
  State& s = ready();
  cudaDeviceProp p{};
  LATTICE_CUDART(cudaGetDeviceProperties(&p, s.device));
  std::ostringstream o;
  o << p.name << " (sm_" << p.major << p.minor << ", " << (p.totalGlobalMem >> 30) << " GiB)";
  return o.str();
}

void* malloc_device(size_t bytes) {
  ready();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    std::ostringstream os;
    os << "CUDA: cannot allocate " << describe_bytes(bytes) << " (" << (free_b >> 20) << " MiB free of "
       << (total_b >> 20) << " MiB): " << cudaGetErrorString(err);
    if (err == cudaErrorMemoryAllocation) throw OutOfMemory(os.str());
    LATTICE_FAIL() << os.str();
  }
  if (bytes) LATTICE_CUDART(cudaMemsetAsync(p, 0, bytes, ready().stream));
  return p;
}

void free_device(void* p) {
  if (p) (void)cudaFree(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  State& s = ready();
  LATTICE_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s.stream));
  LATTICE_CUDART(cudaStreamSynchronize(s.stream));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  State& s = ready();
  LATTICE_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.stream));
  LATTICE_CUDART(cudaStreamSynchronize(s.stream));
}

void copy_device_to_device(void* dst, const void* src, size_t bytes) {
  // cudaMemcpyDefault: either side may also be host memory (unified addressing).
  LATTICE_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ready().stream));
}

void copy_rows_device_to_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                size_t rows) {
  LATTICE_CUDART(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, ready().stream));
}

void memset_device(void* p, int value, size_t bytes) {
  LATTICE_CUDART(cudaMemsetAsync(p, value, bytes, ready().stream));
}

void synchronize() { LATTICE_CUDART(cudaStreamSynchronize(ready().stream)); }

void* compute_stream() { return ready().stream; }

std::string context_error() {
  const State& s = state();
  if (s.count == 0 || s.device < 0) return "";
  if (cudaDeviceSynchronize() == cudaSuccess) return "";
  (void)cudaGetLastError();  // a non-sticky error ends here; a sticky one stays
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

#else  // built without the CUDA backend

namespace {
[[noreturn]] void unavailable() { LATTICE_FAIL() << "CUDA: lattice was built without the CUDA backend"; }
}  // namespace

bool available() { return false; }
std::string unavailable_reason() { return "built without the CUDA backend"; }
int device_count() { return 0; }
void select_device(int) { unavailable(); }
int current_device() { unavailable(); }
std::string device_description() { unavailable(); }
void* malloc_device(size_t) { unavailable(); }
void free_device(void*) {}
void copy_to_device(void*, const void*, size_t) { unavailable(); }
void copy_to_host(void*, const void*, size_t) { unavailable(); }
void copy_device_to_device(void*, const void*, size_t) { unavailable(); }
void copy_rows_device_to_device(void*, size_t, const void*, size_t, size_t, size_t) { unavailable(); }
void memset_device(void*, int, size_t) { unavailable(); }
void synchronize() { unavailable(); }
void* compute_stream() { unavailable(); }
std::string context_error() { return ""; }

#endif

}  // namespace lattice::cuda
