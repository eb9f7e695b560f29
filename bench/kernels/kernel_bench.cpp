// Microbenchmarks of the CPU kernels that are bound by memory rather than by the GEMMs
// (Google Benchmark): the optimizer update, the gradient norm, the GELU and dropout passes,
// each at the size it has in the 124M model (B=4, T=64), with the bytes each moves, so the
// reported bytes_per_second compares with the machine's memory bandwidth (a plain copy,
// Copy, is the reference). docs/benchmarks.md, "Memory-bound kernels", has the results.
//   build/kernel_bench [--benchmark_filter=Adamw] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/optimizer.h"

namespace {

constexpr int64_t kParams = 124475904;  // GPT-2 124M, padded vocabulary
constexpr int64_t kMlp = 4 * 64 * 3072;  // one MLP activation [B*T, 4C] at B=4, T=64

std::vector<float> random_vector(int64_t n, float scale, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (auto& v : x) v = d(rng);
  return x;
}

// The machine's reference: read n floats, write n floats.
void Copy(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> a = random_vector(n, 1.0f, 1), b(static_cast<size_t>(n));
  for (auto _ : st) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) b[size_t(i)] = a[size_t(i)];
    benchmark::DoNotOptimize(b.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 8);
}
BENCHMARK(Copy)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();

// AdamW over every parameter: reads p, g, m, v and writes p, m, v (28 bytes per parameter).
void Adamw(benchmark::State& st) {
  const int64_t n = st.range(0);
  const float grad_scale = st.range(1) ? 0.5f : 1.0f;
  std::vector<float> p = random_vector(n, 0.02f, 1), g = random_vector(n, 1e-3f, 2), m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  int64_t step = 0;
  for (auto _ : st) {
    lattice::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step,
                          grad_scale);
    benchmark::DoNotOptimize(p.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 28);
}
BENCHMARK(Adamw)->Args({kParams, 0})->Args({kParams, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

// The gradient norm's sum of squares: reads g (4 bytes per parameter).
void SumOfSquares(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> g = random_vector(n, 1e-3f, 2);
  for (auto _ : st) benchmark::DoNotOptimize(lattice::sum_of_squares(g.data(), n));
  st.SetBytesProcessed(st.iterations() * n * 4);
}
BENCHMARK(SumOfSquares)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();

// GELU's backward over one MLP activation: reads x and dout, writes dx (12 bytes each).
void GeluBackward(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> x = random_vector(n, 1.0f, 1), dout = random_vector(n, 1.0f, 2), dx(static_cast<size_t>(n));
  for (auto _ : st) {
    lattice::gelu_backward(dx.data(), x.data(), dout.data(), n, lattice::GeluKind::erf);
    benchmark::DoNotOptimize(dx.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 12);
}
BENCHMARK(GeluBackward)->Arg(kMlp)->Unit(benchmark::kMicrosecond)->UseRealTime();

// bias + GELU forward over one MLP activation: reads y, writes pre and out (12 bytes each).
void BiasGeluForward(benchmark::State& st) {
  const int64_t rows = 4 * 64, cols = 3072, n = rows * cols;
  std::vector<float> y = random_vector(n, 1.0f, 1), bias = random_vector(cols, 0.1f, 3), pre(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (auto _ : st) {
    lattice::bias_gelu_forward(pre.data(), out.data(), y.data(), bias.data(), rows, cols, lattice::GeluKind::erf,
                               lattice::Rounding::none);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 12);
}
BENCHMARK(BiasGeluForward)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
