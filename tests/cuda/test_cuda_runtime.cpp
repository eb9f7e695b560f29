// The CUDA runtime wrapper: device discovery, memory and copies. Without a GPU every
// test here reports skipped with the reason.
#include <gtest/gtest.h>

#include <vector>

#include "core/cuda_runtime.h"
#include "cuda_test_util.h"

namespace lattice {
namespace {

TEST(CudaRuntime, BuiltWithTheBackend) { EXPECT_TRUE(cuda::built_with_cuda()); }

TEST(CudaRuntime, ReasonGivenWhenUnavailable) {
  if (cuda::available()) {
    EXPECT_TRUE(cuda::unavailable_reason().empty());
    EXPECT_GT(cuda::device_count(), 0);
  } else {
    EXPECT_FALSE(cuda::unavailable_reason().empty());
    EXPECT_EQ(cuda::device_count(), 0);
  }
}

TEST(CudaRuntime, RoundTripThroughDeviceMemory) {
  LATTICE_REQUIRE_CUDA();
  std::vector<float> host(1000), back(1000, -1.0f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.5f;
  cuda::DeviceBuffer d(host.size() * sizeof(float)), e(host.size() * sizeof(float));
  cuda::copy_to_device(d.data(), host.data(), d.size());
  cuda::copy_device_to_device(e.data(), d.data(), d.size());
  cuda::copy_to_host(back.data(), e.data(), e.size());
  EXPECT_EQ(host, back);
  cuda::memset_device(e.data(), 0, e.size());
  cuda::copy_to_host(back.data(), e.data(), e.size());
  for (float v : back) ASSERT_EQ(v, 0.0f);
}

// An empty buffer (a tensor of zero elements) allocates and frees without an error, and
// leaves the stream usable.
TEST(CudaRuntime, ZeroByteAllocation) {
  LATTICE_REQUIRE_CUDA();
  void* p = cuda::malloc_device(0);
  cuda::synchronize();
  cuda::free_device(p);
  std::vector<float> host{1.0f, 2.0f}, back(2);
  cuda::DeviceBuffer d(host.size() * sizeof(float));
  cuda::copy_to_device(d.data(), host.data(), d.size());
  cuda::copy_to_host(back.data(), d.data(), d.size());
  EXPECT_EQ(host, back);
}

}  // namespace
}  // namespace lattice
