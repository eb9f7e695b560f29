// The per-op profiler (core/op_profiler.h) on the CPU backend: it counts and times real
// kernels called through LATTICE_KERNEL_ENTRY, a nested kernel only in the outermost
// one, nothing while it is off, and only the calls of the thread that started it.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <thread>
#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "core/op_profiler.h"
#include "core/timer.h"
#include "kernels/activation.h"
#include "kernels/layernorm.h"

namespace lattice {

// CUDA twins of the test-local kernels below (never run: the tests use the CPU).
namespace test_twin {
void sleeping_op(int) {}
void gelu_twice(float*, int64_t) {}
}  // namespace test_twin

namespace {

// A kernel that takes a known time.
void sleeping_op(int ms) {
  LATTICE_KERNEL_ENTRY(test_twin::sleeping_op(ms));
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// A kernel that calls another kernel twice.
void gelu_twice(float* x, int64_t n) {
  LATTICE_KERNEL_ENTRY(test_twin::gelu_twice(x, n));
  gelu_forward(x, x, n, GeluKind::erf);
  gelu_forward(x, x, n, GeluKind::tanh);
}

const OpProfileEntry* find(const std::vector<OpProfileEntry>& e, const std::string& name) {
  for (const OpProfileEntry& x : e)
    if (x.name == name) return &x;
  return nullptr;
}

// Each test starts from an empty, stopped profiler and leaves one.
class OpProfiler : public ::testing::Test {
 protected:
  void SetUp() override {
    op_profiler_stop();
    op_profiler_reset();
  }
  void TearDown() override {
    op_profiler_stop();
    op_profiler_reset();
  }
};

struct LayerNormData {
  static constexpr int64_t N = 64, C = 256;
  std::vector<float> x = std::vector<float>(N * C, 0.5f), w = std::vector<float>(C, 1.0f),
                     b = std::vector<float>(C, 0.0f), out = std::vector<float>(N * C), mean = std::vector<float>(N),
                     rstd = std::vector<float>(N);
  LayerNormData() {
    for (int64_t i = 0; i < N * C; ++i) x[size_t(i)] = float(i % 17) * 0.1f;
  }
  void forward() {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  }
};

TEST_F(OpProfiler, CountsCallsAndTimeOfRealKernels) {
  LayerNormData ln;
  std::vector<float> g(4096, 0.3f);
  Timer wall;
  op_profiler_start();
  EXPECT_TRUE(op_profiler_enabled());
  for (int i = 0; i < 5; ++i) ln.forward();
  for (int i = 0; i < 7; ++i) gelu_forward(g.data(), g.data(), int64_t(g.size()), GeluKind::erf);
  op_profiler_stop();
  const double wall_ms = wall.ms();
  EXPECT_FALSE(op_profiler_enabled());

  const auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 2u);
  const OpProfileEntry* l = find(e, "layernorm_forward");
  const OpProfileEntry* gl = find(e, "gelu_forward");
  ASSERT_TRUE(l && gl);
  EXPECT_EQ(l->calls, 5);
  EXPECT_EQ(gl->calls, 7);
  EXPECT_GT(l->ms, 0.0);
  EXPECT_GT(gl->ms, 0.0);
  EXPECT_LE(l->ms + gl->ms, wall_ms);  // the calls happened inside the wall-clock window
  EXPECT_GE(e[0].ms, e[1].ms);         // longest first
}

TEST_F(OpProfiler, TimesInMilliseconds) {
  op_profiler_start();
  Timer wall;
  sleeping_op(20);
  sleeping_op(20);
  const double wall_ms = wall.ms();
  op_profiler_stop();
  const auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].name, "sleeping_op");
  EXPECT_EQ(e[0].calls, 2);
  EXPECT_GE(e[0].ms, 40.0);
  EXPECT_LE(e[0].ms, wall_ms);
}

TEST_F(OpProfiler, NestedKernelCallsCountOnlyInTheOutermost) {
  std::vector<float> x(1000, 0.1f);
  op_profiler_start();
  for (int i = 0; i < 3; ++i) gelu_twice(x.data(), int64_t(x.size()));
  gelu_forward(x.data(), x.data(), int64_t(x.size()), GeluKind::erf);  // outermost again
  op_profiler_stop();
  auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 2u);
  ASSERT_TRUE(find(e, "gelu_twice"));
  EXPECT_EQ(find(e, "gelu_twice")->calls, 3);
  ASSERT_TRUE(find(e, "gelu_forward"));
  EXPECT_EQ(find(e, "gelu_forward")->calls, 1);

  // A real nested kernel: gemm_bf16's fp32 fallback widens A and B and calls gemm_f32.
  op_profiler_reset();
  gemm_bf16_force_path(Bf16GemmPath::fp32_widened);
  const int64_t M = 16, N = 24, K = 32;
  std::vector<uint16_t> A(size_t(M * K), 0x3f80), B(size_t(K * N), 0x3f80);  // bf16 1.0
  std::vector<float> C(size_t(M * N), 0.0f);
  op_profiler_start();
  for (int i = 0; i < 4; ++i) gemm_bf16(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  op_profiler_stop();
  gemm_bf16_use_default_path();
  EXPECT_FLOAT_EQ(C[0], float(K));
  e = op_profiler_entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].name, "gemm_bf16");
  EXPECT_EQ(e[0].calls, 4);
}

TEST_F(OpProfiler, OffRecordsNothing) {
  LayerNormData ln;
  ln.forward();
  sleeping_op(1);
  EXPECT_TRUE(op_profiler_entries().empty());
  op_profiler_start();
  op_profiler_stop();
  ln.forward();
  EXPECT_TRUE(op_profiler_entries().empty());
}

TEST_F(OpProfiler, ResetForgetsTotals) {
  LayerNormData ln;
  op_profiler_start();
  ln.forward();
  op_profiler_reset();  // a new window, still profiling
  ln.forward();
  ln.forward();
  op_profiler_stop();
  const auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].calls, 2);
}

TEST_F(OpProfiler, OnlyTheStartingThreadIsTimed) {
  std::vector<float> a(2048, 0.2f);
  op_profiler_start();
  // Another thread calling kernels all the while.
  std::thread other([] {
    std::vector<float> b(2048, 0.4f);
    for (int i = 0; i < 300; ++i) gelu_forward(b.data(), b.data(), int64_t(b.size()), GeluKind::erf);
  });
  for (int i = 0; i < 100; ++i) gelu_forward(a.data(), a.data(), int64_t(a.size()), GeluKind::erf);
  other.join();
  // Inside an OpenMP region: the team's primary thread is the starting thread (timed),
  // the workers are not.
  int team = 0;
#pragma omp parallel num_threads(4)
  {
#pragma omp single
    team = omp_get_num_threads();
    std::vector<float> c(256, 0.1f);
    gelu_backward(c.data(), c.data(), c.data(), int64_t(c.size()), GeluKind::erf);
  }
  op_profiler_stop();
  const auto e = op_profiler_entries();
  ASSERT_GT(team, 1);
  ASSERT_TRUE(find(e, "gelu_forward"));
  EXPECT_EQ(find(e, "gelu_forward")->calls, 100);
  ASSERT_TRUE(find(e, "gelu_backward"));
  EXPECT_EQ(find(e, "gelu_backward")->calls, 1);
}

// Under the CUDA emulation the CPU kernels run (with device memory guarded), timed on the host.
TEST_F(OpProfiler, EmulatedDeviceTimesTheCpuKernels) {
  struct Restore {
    ~Restore() {
      set_device(Device::cpu);
      set_cuda_emulation(false);
    }
  } restore;
  set_cuda_emulation(true);
  set_device(Device::cuda);
  ASSERT_FALSE(kernels_on_gpu());
  const int64_t n = 1024;
  DevicePtr x = make_device_buffer(size_t(n) * sizeof(float));
  op_profiler_start();
  gelu_forward(static_cast<float*>(x.get()), static_cast<float*>(x.get()), n, GeluKind::erf);
  op_profiler_stop();
  x.reset();
  const auto e = op_profiler_entries();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].name, "gelu_forward");
  EXPECT_EQ(e[0].calls, 1);
}

}  // namespace
}  // namespace lattice
