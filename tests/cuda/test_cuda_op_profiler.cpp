// The op profiler (core/op_profiler.h) with the kernels on a GPU: calls through the
// kernel facades are timed by CUDA events on the compute stream (GPU time, not the
// launch's host time), every call is counted when there are more calls than event
// pairs, and nothing is recorded while the profiler is off.
#include <gtest/gtest.h>

#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "core/op_profiler.h"
#include "core/op_profiler_gpu.h"
#include "core/timer.h"
#include "cuda_test_util.h"
#include "kernels/activation.h"

namespace lattice {
namespace {

// The kernels on the GPU for one test; the CPU again (and an empty profiler) after it.
class CudaOpProfiler : public ::testing::Test {
 protected:
  void SetUp() override {
    LATTICE_REQUIRE_CUDA();
    set_device(Device::cuda, 0);
    op_profiler_stop();
    op_profiler_reset();
  }
  void TearDown() override {
    if (!cuda::available()) return;
    op_profiler_stop();
    op_profiler_reset();
    device_synchronize();
    set_device(Device::cpu, 0);
  }
};

const OpProfileEntry* find(const std::vector<OpProfileEntry>& e, const std::string& name) {
  for (const OpProfileEntry& x : e)
    if (x.name == name) return &x;
  return nullptr;
}

TEST_F(CudaOpProfiler, TimesGpuWorkNotTheLaunch) {
  ASSERT_TRUE(kernels_on_gpu());
  // 2 x 4096^3 = 137 GFLOP per fp32 GEMM: milliseconds on any GPU, while its launch
  // returns in microseconds. Under the SIMT emulation a launch only queues the work too
  // (it runs when the stream is waited for), and 2 x 256^3 takes milliseconds there.
#if LATTICE_SIMT_TESTS
  const int64_t n = 256;
#else
  const int64_t n = 4096;
#endif
  DevicePtr a = make_device_buffer(size_t(n * n) * sizeof(float)), b = make_device_buffer(size_t(n * n) * sizeof(float)),
            c = make_device_buffer(size_t(n * n) * sizeof(float));
  auto* A = static_cast<float*>(a.get());
  auto* B = static_cast<float*>(b.get());
  auto* C = static_cast<float*>(c.get());
  gemm_f32(Trans::N, Trans::N, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);  // warm-up (algorithm choice)
  device_synchronize();

  Timer wall;
  op_profiler_start();
  for (int i = 0; i < 3; ++i) gemm_f32(Trans::N, Trans::N, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
  op_profiler_stop();
  device_synchronize();
  const double wall_ms = wall.ms();

  const auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].name, "gemm_f32");
  EXPECT_EQ(e[0].calls, 3);
  EXPECT_GT(e[0].ms, 3 * 0.2);  // each GEMM's GPU time is well above a launch's
  EXPECT_LE(e[0].ms, wall_ms);  // and within the time the GPU took for all three
}

TEST_F(CudaOpProfiler, CountsEveryCallBeyondTheEventPool) {
  const int64_t n = 1 << 12;
  DevicePtr x = make_device_buffer(size_t(n) * sizeof(float));
  auto* X = static_cast<float*>(x.get());
  const int calls = op_profiler_detail::kGpuEventPairs + 100;  // the pool fills once
  op_profiler_start();
  for (int i = 0; i < calls; ++i) gelu_forward(X, X, n, GeluKind::tanh);
  op_profiler_stop();
  for (int i = 0; i < 10; ++i) gelu_forward(X, X, n, GeluKind::tanh);  // off: not counted
  const auto e = op_profiler_entries();
  ASSERT_TRUE(find(e, "gelu_forward"));
  EXPECT_EQ(e.size(), 1u);
  EXPECT_EQ(find(e, "gelu_forward")->calls, calls);
  EXPECT_GT(find(e, "gelu_forward")->ms, 0.0);
}

}  // namespace
}  // namespace lattice
