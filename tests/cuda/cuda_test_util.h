// Shared by the CUDA tests: skip (visibly, with the reason) where no GPU can be used,
// and move vectors to and from the device.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "core/cuda_runtime.h"

#define LATTICE_REQUIRE_CUDA()                                                      \
  do {                                                                              \
    if (!::lattice::cuda::available())                                              \
      GTEST_SKIP() << "no GPU here: " << ::lattice::cuda::unavailable_reason();    \
  } while (0)

// Skips a test that only a real GPU can answer (its speed, the asynchrony of its streams)
// when the binary runs under the SIMT emulation (lattice_simt_tests, tests/simt/).
#if LATTICE_SIMT_TESTS
#define LATTICE_SKIP_UNDER_SIMT(why) GTEST_SKIP() << "under the SIMT emulation: " << why
#else
#define LATTICE_SKIP_UNDER_SIMT(why) \
  do {                               \
  } while (0)
#endif

namespace lattice::cuda_test {

// A device copy of a host vector.
template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& host) {
  cuda::DeviceBuffer d(host.size() * sizeof(T));
  if (!host.empty()) cuda::copy_to_device(d.data(), host.data(), d.size());
  return d;
}

// n elements of a device buffer, copied to the host (after the compute stream finishes).
template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& d, size_t n) {
  std::vector<T> host(n);
  cuda::synchronize();
  if (n) cuda::copy_to_host(host.data(), d.data(), n * sizeof(T));
  return host;
}

}  // namespace lattice::cuda_test
