#include "core/op_profiler_gpu.h"

#include <vector>

#include "core/cuda_runtime.h"

#if LATTICE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lattice::op_profiler_detail {

#if LATTICE_WITH_CUDA

namespace {

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
};

struct Pool {
  std::vector<EventPair> pairs;  // created up to kGpuEventPairs, then reused
  int in_use = 0;                // pairs [0, in_use) hold recorded calls
};

Pool& pool() {
  static Pool p;
  return p;
}

// The compute stream, or null when there is none (the profiler then records nothing).
cudaStream_t stream() noexcept {
  try {
    return static_cast<cudaStream_t>(cuda::compute_stream());
  } catch (...) {
    return nullptr;
  }
}

// Creates pair i's events when the pool does not hold them yet.
bool ensure_pair(int i) noexcept {
  Pool& p = pool();
  while (int(p.pairs.size()) <= i) {
    EventPair e;
    if (cudaEventCreate(&e.start) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (cudaEventCreate(&e.stop) != cudaSuccess) {
      (void)cudaEventDestroy(e.start);
      (void)cudaGetLastError();
      return false;
    }
    p.pairs.push_back(e);
  }
  return true;
}

}  // namespace

void gpu_prepare_events() noexcept { (void)ensure_pair(kGpuEventPairs - 1); }

int gpu_record_start() noexcept {
  Pool& p = pool();
  if (p.in_use >= kGpuEventPairs) return -1;
  const int i = p.in_use;
  cudaStream_t s = stream();
  if (!s || !ensure_pair(i)) return -1;
  if (cudaEventRecord(p.pairs[size_t(i)].start, s) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  ++p.in_use;
  return i;
}

bool gpu_record_stop(int pair) noexcept {
  cudaStream_t s = stream();
  if (!s || cudaEventRecord(pool().pairs[size_t(pair)].stop, s) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

float gpu_elapsed_ms(int pair) noexcept {
  const EventPair& e = pool().pairs[size_t(pair)];
  float ms = 0;
  if (cudaEventSynchronize(e.stop) != cudaSuccess || cudaEventElapsedTime(&ms, e.start, e.stop) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1.0f;
  }
  return ms;
}

void gpu_release_pairs() noexcept { pool().in_use = 0; }

void gpu_destroy_events() noexcept {
  Pool& p = pool();
  for (const EventPair& e : p.pairs) {
    (void)cudaEventDestroy(e.start);
    (void)cudaEventDestroy(e.stop);
  }
  p.pairs.clear();
  p.in_use = 0;
}

#else  // built without the CUDA backend: no kernel runs on a GPU, no pair is recorded

void gpu_prepare_events() noexcept {}
int gpu_record_start() noexcept { return -1; }
bool gpu_record_stop(int) noexcept { return false; }
float gpu_elapsed_ms(int) noexcept { return -1.0f; }
void gpu_release_pairs() noexcept {}
void gpu_destroy_events() noexcept {}

#endif

}  // namespace lattice::op_profiler_detail
