// The device layer (core/device.h): device selection and its errors, device memory and
// copies on the CPU, and the CUDA emulation's guard: device memory the host touches
// outside a kernel or a copy faults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/elementwise.h"

namespace lattice {
namespace {

TEST(Device, ParseNamesTheFlag) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu);
  EXPECT_EQ(parse_device("cuda"), Device::cuda);
  try {
    parse_device("gpu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
  }
}

TEST(Device, CudaWithoutAGpuSaysWhy) {
  if (cuda::available()) GTEST_SKIP() << "a GPU is here";
  set_cuda_emulation(false);
  try {
    set_device(Device::cuda);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
  EXPECT_EQ(current_device(), Device::cpu);
}

TEST(Device, CpuMemoryAndCopies) {
  ASSERT_EQ(current_device(), Device::cpu);
  const size_t n = 1000;
  DevicePtr d = make_device_buffer(n * sizeof(float));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.get()) % 64, 0u);
  std::vector<float> host(n), back(n, -1.0f);
  copy_to_host(back.data(), d.get(), n * sizeof(float));
  for (float v : back) ASSERT_EQ(v, 0.0f);  // zeroed
  for (size_t i = 0; i < n; ++i) host[i] = float(i);
  copy_to_device(d.get(), host.data(), n * sizeof(float));
  copy_to_host(back.data(), d.get(), n * sizeof(float));
  EXPECT_EQ(host, back);
}

// device_alloc_stats (--log-memory-to-tensorboard): the bytes and buffers alive, and the peak.
TEST(Device, AllocStatsCountTheBuffersAlive) {
  const DeviceAllocStats before = device_alloc_stats();
  {
    DevicePtr a = make_device_buffer(1000), b = make_device_buffer(3 << 20);
    const DeviceAllocStats during = device_alloc_stats();
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 1000 + (3 << 20));
    EXPECT_EQ(during.allocations, before.allocations + 2);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  const DeviceAllocStats after = device_alloc_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + 1000 + (3 << 20));  // the peak stays
}

// Large CPU buffers start on a 2 MB boundary (advised as transparent huge pages), zeroed.
TEST(Device, LargeCpuBuffersOnHugePageBoundaries) {
  ASSERT_EQ(current_device(), Device::cpu);
  const char* env = std::getenv("LATTICE_HUGE_PAGES");
  if (env && std::string(env) == "0") GTEST_SKIP() << "LATTICE_HUGE_PAGES=0";
  const size_t bytes = (size_t(32) << 20) + 100;
  DevicePtr d = make_device_buffer(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.get()) % (size_t(2) << 20), 0u);
  const auto* b = static_cast<const unsigned char*>(d.get());
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(b[i], 0) << i;
  ASSERT_EQ(b[bytes - 1], 0);
}

class EmulatedCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    set_cuda_emulation(true);
    set_device(Device::cuda);
  }
  void TearDown() override {
    set_device(Device::cpu);
    set_cuda_emulation(false);
  }
};

TEST_F(EmulatedCuda, KernelsAndCopiesReachGuardedMemory) {
  ASSERT_TRUE(cuda_emulated());
  EXPECT_FALSE(kernels_on_gpu());
  const int64_t n = 3000;
  std::vector<float> host(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[size_t(i)] = 0.5f * float(i);
  {
    DevicePtr d = make_device_buffer(size_t(n) * sizeof(float));
    copy_to_device(d.get(), host.data(), size_t(n) * sizeof(float));
    scale_inplace(static_cast<float*>(d.get()), 2.0f, n);  // a kernel: runs with access
    copy_to_host(back.data(), d.get(), size_t(n) * sizeof(float));
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[size_t(i)], float(i)) << i;
}

using EmulatedCudaDeathTest = EmulatedCuda;

TEST_F(EmulatedCudaDeathTest, HostAccessOutsideKernelsFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DevicePtr d = make_device_buffer(4096);
  float* p = static_cast<float*>(d.get());
  EXPECT_DEATH({ p[3] = 1.0f; }, "");                 // a host write
  EXPECT_DEATH({ std::printf("%f", double(p[0])); }, "");  // a host read
  // Inside a DeviceAccess (what kernels and copies hold) the same access is allowed.
  {
    DeviceAccess access;
    p[3] = 1.0f;
  }
  float v = 0;
  copy_to_host(&v, p + 3, sizeof(float));
  EXPECT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace lattice
