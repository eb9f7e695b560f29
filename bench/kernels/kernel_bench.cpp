// Microbenchmarks of the CPU kernels other than the GEMMs (Google Benchmark): the optimizer
// update, the gradient norm, zero_grad's fill, the GELU and SwiGLU passes, LayerNorm, the fused cross entropy, each at the
// size it has in the 124M model (B=4, T=64), with the bytes each moves, so the reported
// bytes_per_second compares with the machine's memory bandwidth (a plain copy, Copy, is the
// reference); one layer's causal attention at T=64 and T=1024 (GFLOP/s); a Gated DeltaNet layer's delta rule
// and convolution; a Mamba-2 layer's scan; a decode step's output-layer GEMV with fp32 and bf16 weights.
// docs/benchmarks.md, "Memory-bound kernels", has the results.
//   build/kernel_bench [--benchmark_filter=Adamw] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "blas/gemm.h"
#include "core/device.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
#include "kernels/mamba.h"
#include "kernels/optimizer.h"
#include "kernels/swiglu.h"

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

// A decode step's GEMV y[1, N] = x[1, K] W[N, K]^T (the 124M model's output layer: K 768, N 50304), weights in
// fp32 (gemm_f32) or bf16 (gemm_bf16 on oneDNN's bf16 matmul, x rounded to bf16): bytes are the weights read.
void Gemv(benchmark::State& st) {
  const int64_t K = 768, N = 50304;
  const bool bf16 = st.range(0) != 0;
  std::vector<float> W = random_vector(N * K, 0.02f, 2), x = random_vector(K, 1.0f, 3);
  std::vector<float> y(static_cast<size_t>(N));
  std::vector<uint16_t> Wb(W.size()), xb(x.size());
  for (size_t i = 0; i < W.size(); ++i) Wb[i] = uint16_t(reinterpret_cast<const uint32_t&>(W[i]) >> 16);
  for (size_t i = 0; i < x.size(); ++i) xb[i] = uint16_t(reinterpret_cast<const uint32_t&>(x[i]) >> 16);
  if (bf16) {
    if (!lattice::gemm_bf16_path_supported(lattice::Bf16GemmPath::onednn_bf16)) {
      st.SkipWithError("no AVX512-BF16");
      return;
    }
    lattice::gemm_bf16_force_path(lattice::Bf16GemmPath::onednn_bf16);
  }
  for (auto _ : st) {
    if (bf16)
      lattice::gemm_bf16(lattice::Trans::N, lattice::Trans::T, 1, N, K, 1.0f, xb.data(), K, Wb.data(), K, 0.0f,
                         y.data(), N);
    else
      lattice::gemm_f32(lattice::Trans::N, lattice::Trans::T, 1, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f,
                        y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  if (bf16) lattice::gemm_bf16_use_default_path();
  st.SetBytesProcessed(st.iterations() * N * K * (bf16 ? 2 : 4));
}
BENCHMARK(Gemv)->Arg(0)->Arg(1)->ArgName("bf16")->Unit(benchmark::kMicrosecond)->UseRealTime();

// zero_grad's fill: n floats set to zero on the device (here the host), 4 bytes each.
void Zero(benchmark::State& st) {
  const int64_t n = st.range(0);
  std::vector<float> a = random_vector(n, 1.0f, 1);
  for (auto _ : st) {
    lattice::zero_on_device(a.data(), size_t(n) * sizeof(float));
    benchmark::DoNotOptimize(a.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 4);
}
BENCHMARK(Zero)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();

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

// SwiGLU over a Llama-style MLP's gate and up rows [B*T, 2F] (B=4, T=64, F=3072): the forward reads y
// [N, 2F] and writes pre [N, 2F] and out [N, F], the backward reads pre and dout [N, F] and writes dx
// [N, 2F]: 20 bytes per output element either way.
void SwiGlu(benchmark::State& st) {
  const int64_t rows = 4 * 64, F = 3072, n = rows * F;
  const bool backward = st.range(0) != 0;
  std::vector<float> y = random_vector(2 * n, 1.0f, 1), pre(static_cast<size_t>(2 * n)), out(static_cast<size_t>(n)),
      dout = random_vector(n, 1.0f, 2), dx(static_cast<size_t>(2 * n));
  lattice::bias_swiglu_forward(pre.data(), out.data(), y.data(), nullptr, rows, F, lattice::Rounding::none);
  for (auto _ : st) {
    if (backward)
      lattice::swiglu_backward(dx.data(), pre.data(), dout.data(), rows, F, lattice::Rounding::none);
    else
      lattice::bias_swiglu_forward(pre.data(), out.data(), y.data(), nullptr, rows, F, lattice::Rounding::none);
    benchmark::DoNotOptimize(backward ? dx.data() : out.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 20);
}
BENCHMARK(SwiGlu)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMicrosecond)->UseRealTime();

// LayerNorm forward and backward over the residual stream [B*T, C] = [256, 768].
void LayerNorm(benchmark::State& st) {
  const int64_t N = 4 * 64, C = 768, n = N * C;
  const bool backward = st.range(0) != 0;
  std::vector<float> x = random_vector(n, 1.0f, 1), w = random_vector(C, 0.1f, 2), b = random_vector(C, 0.1f, 3);
  std::vector<float> out(static_cast<size_t>(n)), mean(N), rstd(N), dout = random_vector(n, 1.0f, 4),
      dx(static_cast<size_t>(n)), dw(C), db(C);
  lattice::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  for (auto _ : st) {
    if (backward)
      lattice::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                  rstd.data(), N, C);
    else
      lattice::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    benchmark::DoNotOptimize(backward ? dx.data() : out.data());
  }
  st.SetBytesProcessed(st.iterations() * n * (backward ? 12 : 8));
}
BENCHMARK(LayerNorm)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMicrosecond)->UseRealTime();

// The cross entropy over the output layer's logits [B*T, 50304] (whole vocabulary on one rank),
// forward and backward in one call: reads the logits, writes their gradient in place.
void CrossEntropyFused(benchmark::State& st) {
  const int64_t N = 4 * 64, V = 50257, Vl = 50304, n = N * Vl;
  const std::vector<float> logits = random_vector(n, 1.0f, 1);
  std::vector<float> work(static_cast<size_t>(n)), losses(N), row_max(N);
  std::vector<double> stats(2 * N);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[size_t(i)] = int32_t((i * 7919) % V);
  for (auto _ : st) {
    st.PauseTiming();
    work = logits;
    st.ResumeTiming();
    lattice::vocab_parallel_ce_fused(losses.data(), work.data(), row_max.data(), stats.data(), targets.data(), true,
                                     nullptr, 1.0f / float(N), N, V, Vl);
    benchmark::DoNotOptimize(work.data());
  }
  st.SetBytesProcessed(st.iterations() * n * 8);
}
BENCHMARK(CrossEntropyFused)->Unit(benchmark::kMillisecond)->UseRealTime();

// Times the attention of `shape` (no grouping), its forward or its backward (from the forward's
// out and lse), on random inputs (seeds `seed` and seed + 1).
void time_attention(benchmark::State& st, const lattice::AttentionShape& shape, bool backward, uint32_t seed) {
  const int64_t tokens = shape.B * shape.T, H = shape.H, D = shape.D;
  const std::vector<float> qkv = random_vector(tokens * H * 3 * D, 1.0f, seed),
                           dout = random_vector(tokens * H * D, 1.0f, seed + 1);
  std::vector<float> out(static_cast<size_t>(tokens * H * D)), lse(static_cast<size_t>(shape.B * H * shape.T)),
      dqkv(static_cast<size_t>(tokens * H * 3 * D));
  const lattice::AttentionDropout no_dropout;
  lattice::attention_forward(out.data(), lse.data(), qkv.data(), shape, no_dropout);
  for (auto _ : st) {
    if (backward)
      lattice::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), shape, no_dropout);
    else
      lattice::attention_forward(out.data(), lse.data(), qkv.data(), shape, no_dropout);
    benchmark::DoNotOptimize(backward ? dqkv.data() : out.data());
  }
}

// Causal attention of one layer, 12 heads of 64, B=4, forward or backward, at T = 64 or 1024;
// reported in GFLOP/s of its products (causal: half of each T x T product).
void Attention(benchmark::State& st) {
  const int64_t T = st.range(0), B = 4, H = 12, D = 64;
  const bool backward = st.range(1) != 0;
  time_attention(st, lattice::AttentionShape{B, T, H, D}, backward, 1);
  // 2 products of B H T^2 D / 2 multiply-adds forward, 5 backward.
  const double flops = (backward ? 5.0 : 2.0) * B * H * double(T) * double(T) * D;
  st.counters["GFLOP"] = benchmark::Counter(flops * double(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(Attention)->Args({64, 0})->Args({64, 1})->Args({1024, 0})->Args({1024, 1})->ArgNames({"T", "backward"})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// Sliding-window attention (--window-size W) against full causal attention at T=4096, one sequence
// of 12 heads of 64, forward or backward: the window skips the key tiles before it, so the time
// should fall with the (query, key) pairs computed, T (W + 1) against T (T + 1) / 2. window -1:
// full causal attention. GFLOP/s of the pairs the window keeps.
void SlidingWindowAttention(benchmark::State& st) {
  const int64_t T = 4096, B = 1, H = 12, D = 64, window = st.range(0);
  const bool backward = st.range(1) != 0;
  time_attention(st, lattice::AttentionShape{B, T, H, D, 0, window}, backward, 3);
  double pairs = 0;  // (query, key) pairs the window keeps
  for (int64_t i = 0; i < T; ++i) pairs += double(window < 0 || i <= window ? i + 1 : window + 1);
  const double flops = (backward ? 5.0 : 2.0) * 2.0 * B * H * pairs * D;
  st.counters["pairs_per_query"] = pairs / double(T);
  st.counters["GFLOP"] = benchmark::Counter(flops * double(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(SlidingWindowAttention)->Args({-1, 0})->Args({256, 0})->Args({-1, 1})->Args({256, 1})
    ->ArgNames({"window", "backward"})->Unit(benchmark::kMillisecond)->UseRealTime();

// The gated delta rule of one Gated DeltaNet layer (kernels/gated_delta_net.h) at a Qwen3.5-like head shape, 4 key
// and 8 value heads of 128, B=2 sequences of T=1024, its q, k, values, g and beta made by the layer's own
// convolution and gates from random in_proj rows with Megatron's initial A_log (log U(1, 16)) and dt_bias (1):
// the forward (with its state checkpoints every 64 tokens) or the backward. tokens_per_second counts the B T
// tokens of one call.
lattice::GdnShape gdn_bench_shape() {
  lattice::GdnShape s;
  s.B = 2;
  s.T = 1024;
  s.Hk = 4;
  s.Hv = 8;
  s.Dk = 128;
  s.Dv = 128;
  s.K = 4;
  s.chunk = 64;
  return s;
}

void GatedDeltaRule(benchmark::State& st) {
  const lattice::GdnShape s = gdn_bench_shape();
  const bool backward = st.range(0) != 0;
  const int64_t N = s.N();
  const std::vector<float> x = random_vector(N * s.width(), 1.0f, 5), w = random_vector(s.conv() * s.K, 0.3f, 6),
                           d_o = random_vector(N * s.v(), 1.0f, 9), dt_bias(static_cast<size_t>(s.Hv), 1.0f);
  std::vector<float> A_log(static_cast<size_t>(s.Hv));
  for (int64_t h = 0; h < s.Hv; ++h) A_log[size_t(h)] = std::log(1.0f + 15.0f * float(h) / float(s.Hv));
  auto buffer = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> u = buffer(N * s.conv()), q = buffer(N * s.qk()), k = buffer(N * s.qk()), g = buffer(N * s.Hv),
                     beta = buffer(N * s.Hv), o = buffer(N * s.v()), state = buffer(s.B * s.Hv * s.state()),
                     ckpt = buffer(s.B * s.Hv * s.chunks() * s.state()), dq_v = buffer(N * s.Hv * s.Dk),
                     dk_v = buffer(N * s.Hv * s.Dk), du = buffer(N * s.conv()), dg = buffer(N * s.Hv),
                     dbeta = buffer(N * s.Hv), work = buffer(lattice::gdn_delta_rule_work(s));
  lattice::gdn_conv_forward(u.data(), x.data(), w.data(), s);
  lattice::gdn_gates_forward(q.data(), k.data(), g.data(), beta.data(), u.data(), x.data(), A_log.data(),
                             dt_bias.data(), s);
  lattice::gdn_delta_rule_forward(o.data(), state.data(), ckpt.data(), q.data(), k.data(), u.data(), g.data(),
                                  beta.data(), s);
  for (auto _ : st) {
    if (backward)
      lattice::gdn_delta_rule_backward(dq_v.data(), dk_v.data(), du.data(), dg.data(), dbeta.data(), work.data(),
                                       d_o.data(), ckpt.data(), q.data(), k.data(), u.data(), g.data(), beta.data(), s);
    else
      lattice::gdn_delta_rule_forward(o.data(), state.data(), ckpt.data(), q.data(), k.data(), u.data(), g.data(),
                                      beta.data(), s);
    benchmark::DoNotOptimize(backward ? dq_v.data() : o.data());
  }
  st.counters["tokens_per_second"] =
      benchmark::Counter(double(N) * double(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(GatedDeltaRule)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMillisecond)->UseRealTime();

// Generation's step: one token of one sequence from the state (the same heads), as GPTInference decodes.
void GatedDeltaRuleDecode(benchmark::State& st) {
  lattice::GdnShape s = gdn_bench_shape();
  s.B = 1;
  s.T = 1;
  s.chunk = 1;
  const std::vector<float> x = random_vector(s.width(), 1.0f, 5), w = random_vector(s.conv() * s.K, 0.3f, 6),
                           A_log(static_cast<size_t>(s.Hv), 0.5f), dt_bias(static_cast<size_t>(s.Hv), 1.0f);
  auto buffer = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> u = buffer(s.conv()), q = buffer(s.qk()), k = buffer(s.qk()), g = buffer(s.Hv),
                     beta = buffer(s.Hv), o = buffer(s.v()), state = random_vector(s.Hv * s.state(), 0.1f, 8);
  lattice::gdn_conv_forward(u.data(), x.data(), w.data(), s);
  lattice::gdn_gates_forward(q.data(), k.data(), g.data(), beta.data(), u.data(), x.data(), A_log.data(),
                             dt_bias.data(), s);
  for (auto _ : st) {
    lattice::gdn_delta_rule_forward(o.data(), state.data(), nullptr, q.data(), k.data(), u.data(), g.data(),
                                    beta.data(), s, true);
    benchmark::DoNotOptimize(o.data());
  }
}
BENCHMARK(GatedDeltaRuleDecode)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same layer's causal depthwise convolution (kernel 4 over its 2048 q, k, v channels) and SiLU, forward
// or backward (the input's and the weights' gradients).
void GatedDeltaNetConv(benchmark::State& st) {
  const lattice::GdnShape s = gdn_bench_shape();
  const bool backward = st.range(0) != 0;
  const int64_t N = s.N();
  const std::vector<float> x = random_vector(N * s.width(), 1.0f, 5), w = random_vector(s.conv() * s.K, 0.3f, 6),
                           du = random_vector(N * s.conv(), 1.0f, 7);
  std::vector<float> u(static_cast<size_t>(N * s.conv())), dx(x.size()), dw(w.size());
  for (auto _ : st) {
    if (backward)
      lattice::gdn_conv_backward(dx.data(), dw.data(), du.data(), x.data(), w.data(), s);
    else
      lattice::gdn_conv_forward(u.data(), x.data(), w.data(), s);
    benchmark::DoNotOptimize(backward ? dx.data() : u.data());
  }
  st.counters["tokens_per_second"] =
      benchmark::Counter(double(N) * double(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(GatedDeltaNetConv)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMillisecond)->UseRealTime();

// The scan of one Mamba-2 layer (kernels/mamba.h) on one rank at a Nemotron-H-like per-rank shape: 16 heads of 64
// (hidden 512, expand 2: d_inner 1024), 2 groups of B and C, state 128, B=2 sequences of T=1024, its inputs
// random: u (xs, B, C: SiLU outputs' range) uniform in (-1, 1), dt uniform in (0.01, 0.1), Megatron's initial
// A_log (log U(1, 16)) and D (ones): the forward (with its state checkpoints every 64 tokens) or the backward
// (from the checkpoints of one forward before the timing; the CPU needs no workspace). bench/mamba_scan_compare.sh
// sets it beside PyTorch. tokens_per_second counts the B T tokens of one call.
void MambaScan(benchmark::State& st) {
  lattice::MambaShape s;
  s.B = 2;
  s.T = 1024;
  s.H = 16;
  s.P = 64;
  s.G = 2;
  s.N = 128;
  s.K = 4;
  s.chunk = 64;
  const bool backward = st.range(0) != 0;
  const int64_t rows = s.rows();
  std::mt19937 rng(10);
  auto uniform = [&rng](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    return x;
  };
  const std::vector<float> u = uniform(rows * s.conv(), -1.0f, 1.0f), dt = uniform(rows * s.H, 0.01f, 0.1f),
                           dy = random_vector(rows * s.inner(), 1.0f, 11), D(static_cast<size_t>(s.H), 1.0f);
  std::vector<float> A_log = uniform(s.H, 1.0f, 16.0f);
  for (auto& a : A_log) a = std::log(a);
  auto buffer = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> y = buffer(rows * s.inner()), ckpt = buffer(s.B * s.H * s.chunks() * s.state()),
                     du = buffer(rows * s.conv()), d_dt = buffer(rows * s.H), dA_log = buffer(s.H), dD = buffer(s.H);
  lattice::mamba_scan_forward(y.data(), ckpt.data(), u.data(), dt.data(), A_log.data(), D.data(), s);
  for (auto _ : st) {
    if (backward)
      lattice::mamba_scan_backward(du.data(), d_dt.data(), dA_log.data(), dD.data(), nullptr, dy.data(), ckpt.data(),
                                   u.data(), dt.data(), A_log.data(), D.data(), s);
    else
      lattice::mamba_scan_forward(y.data(), ckpt.data(), u.data(), dt.data(), A_log.data(), D.data(), s);
    benchmark::DoNotOptimize(backward ? du.data() : y.data());
  }
  st.counters["tokens_per_second"] =
      benchmark::Counter(double(rows) * double(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(MambaScan)->Arg(0)->Arg(1)->ArgName("backward")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
