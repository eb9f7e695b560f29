// Every op's CUDA kernel against its CPU kernel, as one table: each entry names the op,
// its shapes and its tolerance, and runs the CPU and the CUDA version on the same random
// inputs (forward and backward, uneven sizes, vocab-parallel slices with padding). A
// failure names the op, the shape, the output, the first bad elements and the largest
// error. Without a GPU every entry reports skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <array>
#include <functional>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/activation.h"
#include "kernels/cast.h"
#include "kernels/cast_math.h"
#include "kernels/cross_entropy.h"
#include "kernels/attention.h"
#include "kernels/attention_gate.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/ops.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/moe.h"
#include "core/device.h"
#include "kernels/muon.h"
#include "optim/muon.h"
#include "kernels/optimizer.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/rotary_embedding.h"

namespace lattice {
namespace {

using cuda::DeviceBuffer;
using cuda_test::download;
using cuda_test::upload;

// |gpu - cpu| <= atol + rtol |cpu| elementwise; NaN must meet NaN, infinities must be equal.
// Zero tolerances demand the same value (bit-identical up to the sign of zero and NaN payloads;
// expect_bits checks the bits themselves).
struct Tol {
  double rtol, atol;
};

struct OpCase {
  std::string op;     // the kernel(s) compared
  std::string shape;  // the sizes, as a test-name suffix
  Tol tol;
  std::function<void(const OpCase&)> run;
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " " << c.shape; }

template <typename T>
void expect_close(const OpCase& c, const std::string& output, const std::vector<T>& cpu,
                  const std::vector<T>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size()) << c.op << " " << c.shape << " " << output << ": sizes differ";
  size_t bad = 0, worst = 0;
  double worst_err = 0.0;
  std::ostringstream first;
  first << std::setprecision(9);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = double(cpu[i]), b = double(gpu[i]);
    bool ok;
    if (std::isnan(a) || std::isnan(b)) {
      ok = std::isnan(a) && std::isnan(b);
    } else if (a == b) {
      ok = true;
    } else {
      const double err = std::fabs(a - b);
      ok = std::isfinite(err) && err <= c.tol.atol + c.tol.rtol * std::fabs(a);
      if (!(err <= worst_err)) {
        worst_err = err;
        worst = i;
      }
    }
    if (!ok) {
      if (bad < 5) first << " [" << i << "] cpu " << a << " gpu " << b << ";";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << c.op << " " << c.shape << ", output " << output << ": " << bad << " of "
                     << cpu.size() << " elements beyond " << c.tol.atol << " + " << c.tol.rtol
                     << " |cpu| (largest |error| " << worst_err << " at [" << worst << "]);"
                     << first.str();
}

// The same bits (casts, copies, masks).
void expect_bits(const OpCase& c, const std::string& output, const std::vector<float>& cpu,
                 const std::vector<float>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size()) << c.op << " " << c.shape << " " << output << ": sizes differ";
  size_t bad = 0;
  std::ostringstream first;
  first << std::setprecision(9) << std::hex;
  for (size_t i = 0; i < cpu.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &cpu[i], 4);
    std::memcpy(&b, &gpu[i], 4);
    if (a != b) {
      if (bad < 5) first << " [" << std::dec << i << std::hex << "] cpu 0x" << a << " gpu 0x" << b << ";";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << c.op << " " << c.shape << ", output " << output << ": " << bad << " of "
                     << cpu.size() << " elements differ in their bits;" << first.str();
}

std::vector<float> rand_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> rand_ints(size_t n, uint32_t seed, int32_t lo, int32_t hi_excl) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi_excl - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

// Values spanning many binades, with the special cases of the number formats.
std::vector<float> cast_inputs(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-40, 20), sign(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = (sign(gen) ? -1.0f : 1.0f) * std::ldexp(mant(gen), ex(gen));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, inf, -inf, nan, -nan, 65504.0f, 65519.0f, 65520.0f, 65536.0f,
                            5.96046448e-8f, 2.98023224e-8f, 2.9802326e-8f, 1e-8f, 6.1e-5f, 3.0e38f,
                            3.4028235e38f, 1e-40f, -1e-45f, 448.0f, 449.0f, 464.0f, 480.0f, 57344.0f,
                            61440.0f, 1.0f / 1024.0f, 1.0f / 512.0f * 1.0625f, 0.0009765625f * 3.0f};
  const uint32_t tie_bits[] = {0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7f8000u, 0x7f7fffffu, 0x00008000u};
  size_t k = 0;
  for (float s : specials) v[k++ % n] = s;
  for (uint32_t b : tie_bits) std::memcpy(&v[k++ % n], &b, 4);
  return v;
}

std::string shape_name(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (const auto& [name, value] : dims) s += (s.empty() ? "" : "_") + std::string(name) + std::to_string(value);
  return s;
}

// The GEMM-result roundings the fused kernels take (kernels/cast.h), as a name suffix.
constexpr Rounding kRoundings[] = {Rounding::none, Rounding::bf16, Rounding::fp16};
std::string rounding_suffix(Rounding r) {
  return r == Rounding::bf16 ? "_round_bf16" : r == Rounding::fp16 ? "_round_fp16" : "";
}

// ---------------------------------------------------------------- layernorm

void layernorm_cases(std::vector<OpCase>& t) {
  // C: one, two or three (768) columns a thread in the fused backward, 6 (1300), and past
  // its 8 (2100: the unfused kernels).
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 100}, {300, 768}, {2, 1}, {45, 1300}, {19, 2100}}) {
    // Row statistics summed over C in another order than the CPU's 16 lanes: ~1e-6 relative
    // on O(1) values.
    for (Normalization kind : {Normalization::layernorm, Normalization::rmsnorm})
      t.push_back({kind == Normalization::rmsnorm ? "rmsnorm_forward" : "layernorm_forward",
                   shape_name({{"N", N}, {"C", C}}), {1e-5, 1e-5}, [N, C, kind](const OpCase& c) {
      const auto x = rand_floats(static_cast<size_t>(N * C), 1, -2.0f, 3.0f);
      const auto w = rand_floats(static_cast<size_t>(C), 2), b = rand_floats(static_cast<size_t>(C), 3);
      std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f, kind);
      auto dx = upload(x), dw = upload(w), db = upload(b);
      DeviceBuffer dout(out.size() * 4), dmean(mean.size() * 4), drstd(rstd.size() * 4);
      cuda::layernorm_forward(dout.as<float>(), dmean.as<float>(), drstd.as<float>(), dx.as<float>(),
                              dw.as<float>(), db.as<float>(), N, C, 1e-5f, kind);
      expect_close(c, "out", out, download<float>(dout, out.size()));
      expect_close(c, "mean", mean, download<float>(dmean, mean.size()));
      expect_close(c, "rstd", rstd, download<float>(drstd, rstd.size()));
    }});
    // The bf16 output (a GEMM's input): within one bf16 ulp (2^-8 relative), as the fp32
    // values before the rounding differ by ~1e-6.
    t.push_back({"layernorm_forward_bf16", shape_name({{"N", N}, {"C", C}}), {1.0 / 128, 1e-5},
                 [N, C](const OpCase& c) {
      const auto x = rand_floats(static_cast<size_t>(N * C), 1, -2.0f, 3.0f);
      const auto w = rand_floats(static_cast<size_t>(C), 2), b = rand_floats(static_cast<size_t>(C), 3);
      std::vector<uint16_t> out(static_cast<size_t>(N * C));
      std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      layernorm_forward_bf16(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      auto dx = upload(x), dw = upload(w), db = upload(b);
      DeviceBuffer dout(out.size() * 2), dmean(mean.size() * 4), drstd(rstd.size() * 4);
      cuda::layernorm_forward_bf16(dout.as<uint16_t>(), dmean.as<float>(), drstd.as<float>(), dx.as<float>(),
                                   dw.as<float>(), db.as<float>(), N, C, 1e-5f);
      std::vector<float> o(out.size()), g(out.size());
      const auto gout = download<uint16_t>(dout, out.size());
      cast_bf16_to_fp32(o.data(), out.data(), int64_t(o.size()));
      cast_bf16_to_fp32(g.data(), gout.data(), int64_t(g.size()));
      expect_close(c, "out", o, g);
      const OpCase stats{c.op, c.shape, {1e-5, 1e-5}, nullptr};
      expect_close(stats, "mean", mean, download<float>(dmean, mean.size()));
      expect_close(stats, "rstd", rstd, download<float>(drstd, rstd.size()));
    }});
    // dx: two row sums of C terms; dw, db: column sums of N terms (per block of 16 rows, then
    // the blocks in order, on the GPU; lane by lane on the CPU), so the absolute error grows
    // with N. Forms: dout fp32 (rounded as read), or bf16; with or without the next layer's
    // bf16 output gradient and bias gradient (ResidualGradOut) made from the new dx.
    struct Form {
      std::string name;
      Rounding round;
      bool bf16_dout, next;
      Normalization kind = Normalization::layernorm;
    };
    std::vector<Form> forms;
    for (Rounding r : kRoundings) forms.push_back({rounding_suffix(r), r, false, false});
    forms.push_back({"_bf16_dout_next", Rounding::none, true, true});
    forms.push_back({"_next", Rounding::bf16, false, true});
    forms.push_back({"_rmsnorm", Rounding::none, false, false, Normalization::rmsnorm});
    forms.push_back({"_rmsnorm_bf16_dout_next", Rounding::none, true, true, Normalization::rmsnorm});
    for (const Form& f : forms)
      t.push_back({"layernorm_backward" + f.name, shape_name({{"N", N}, {"C", C}}), {1e-5, 2e-5 + 1e-7 * double(N)},
                   [N, C, f](const OpCase& c) {
      const auto x = rand_floats(static_cast<size_t>(N * C), 4, -2.0f, 3.0f);
      const auto w = rand_floats(static_cast<size_t>(C), 5), b = rand_floats(static_cast<size_t>(C), 6);
      const auto dout = rand_floats(static_cast<size_t>(N * C), 7);
      std::vector<uint16_t> dout16(dout.size());
      cast_fp32_to_bf16(dout16.data(), dout.data(), int64_t(dout.size()));
      std::vector<float> out(static_cast<size_t>(N * C)), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f, f.kind);
      // Non-zero starting gradients: every output accumulates.
      auto dx = rand_floats(static_cast<size_t>(N * C), 8), dw = rand_floats(static_cast<size_t>(C), 9), db = rand_floats(static_cast<size_t>(C), 10);
      auto dnext = rand_floats(static_cast<size_t>(C), 11);
      const auto dx0 = dx, dnext0 = dnext;
      std::vector<uint16_t> next16(f.next ? dx.size() : 0);
      auto g_x = upload(x), g_w = upload(w), g_dout = upload(dout), g_dout16 = upload(dout16), g_mean = upload(mean);
      auto g_rstd = upload(rstd), g_dx = upload(dx), g_dw = upload(dw), g_db = upload(db), g_dnext = upload(dnext);
      DeviceBuffer g_next16(next16.size() * 2);
      layernorm_backward(dx.data(), dw.data(), db.data(),
                         f.bf16_dout ? LayerNormDout::in_bf16(dout16.data()) : LayerNormDout(dout.data(), f.round),
                         x.data(), w.data(), mean.data(), rstd.data(), N, C,
                         f.next ? ResidualGradOut{next16.data(), dnext.data()} : ResidualGradOut{}, f.kind);
      auto run_gpu = [&] {
        cuda::layernorm_backward(
            g_dx.as<float>(), g_dw.as<float>(), g_db.as<float>(),
            f.bf16_dout ? LayerNormDout::in_bf16(g_dout16.as<uint16_t>()) : LayerNormDout(g_dout.as<float>(), f.round),
            g_x.as<float>(), g_w.as<float>(), g_mean.as<float>(), g_rstd.as<float>(), N, C,
            f.next ? ResidualGradOut{g_next16.as<uint16_t>(), g_dnext.as<float>()} : ResidualGradOut{}, f.kind);
      };
      run_gpu();
      const auto gpu_dx = download<float>(g_dx, dx.size());
      const auto gpu_dw = download<float>(g_dw, dw.size()), gpu_db = download<float>(g_db, db.size());
      const auto gpu_dnext = download<float>(g_dnext, dnext.size());
      expect_close(c, "dx", dx, gpu_dx);
      expect_close(c, "dw", dw, gpu_dw);
      expect_close(c, "db", db, gpu_db);
      if (f.next) {
        expect_close(c, "next bias grad", dnext, gpu_dnext);
        // The cast is of the GPU's own dx, to the bit.
        std::vector<uint16_t> cast(gpu_dx.size());
        cast_fp32_to_bf16(cast.data(), gpu_dx.data(), int64_t(cast.size()));
        EXPECT_EQ(cast, download<uint16_t>(g_next16, next16.size())) << c.op << " " << c.shape << ": the bf16 cast";
        // And the sums are of the GPU's dx, in some order: within N x 2^-24 of each column's
        // sum of magnitudes of the exact sum of that dx (a bound no misplaced row meets).
        for (int64_t col = 0; col < C; ++col) {
          double exact = dnext0[size_t(col)], mag = std::fabs(double(dnext0[size_t(col)]));
          for (int64_t n = 0; n < N; ++n) {
            exact += gpu_dx[size_t(n * C + col)];
            mag += std::fabs(double(gpu_dx[size_t(n * C + col)]));
          }
          EXPECT_LE(std::fabs(gpu_dnext[size_t(col)] - exact), double(N + 1) * std::ldexp(1.0, -24) * mag)
              << c.op << " " << c.shape << ": column " << col;
        }
      }
      // Deterministic: a second accumulation from the same start gives the same bits.
      cuda::copy_to_device(g_dw.data(), rand_floats(static_cast<size_t>(C), 9).data(), g_dw.size());
      cuda::copy_to_device(g_db.data(), rand_floats(static_cast<size_t>(C), 10).data(), g_db.size());
      cuda::copy_to_device(g_dnext.data(), dnext0.data(), g_dnext.size());
      cuda::copy_to_device(g_dx.data(), dx0.data(), g_dx.size());
      run_gpu();
      expect_bits(c, "dw (second run)", gpu_dw, download<float>(g_dw, dw.size()));
      expect_bits(c, "db (second run)", gpu_db, download<float>(g_db, db.size()));
      expect_bits(c, "next bias grad (second run)", gpu_dnext, download<float>(g_dnext, dnext.size()));
    }});
  }
}

// ---------------------------------------------------------------- activation

void gelu_cases(std::vector<OpCase>& t) {
  for (GeluKind kind : {GeluKind::erf, GeluKind::tanh, GeluKind::squared_relu}) {
    const std::string k = kind == GeluKind::erf ? "erf" : kind == GeluKind::tanh ? "tanh" : "relu2";
    for (int64_t n : {int64_t(37), int64_t(100003)}) {
      // The same polynomials on both (kernels/activation_math.h); only FMA contraction
      // differs (a few ulp), which 1 + erf(x) for x << 0 turns into absolute error.
      t.push_back({"gelu_forward_" + k, shape_name({{"n", n}}), {1e-5, 1e-6}, [n, kind](const OpCase& c) {
        const auto x = rand_floats(static_cast<size_t>(n), 11, -6.0f, 6.0f);
        std::vector<float> out(x.size());
        gelu_forward(out.data(), x.data(), n, kind);
        auto gx = upload(x);
        DeviceBuffer gout(out.size() * 4);
        cuda::gelu_forward(gout.as<float>(), gx.as<float>(), n, kind);
        expect_close(c, "out", out, download<float>(gout, out.size()));
        cuda::gelu_forward(gx.as<float>(), gx.as<float>(), n, kind);  // in place
        expect_close(c, "out (in place)", out, download<float>(gx, out.size()));
      }});
      for (Rounding r : kRoundings)
        t.push_back({"gelu_backward_" + k + rounding_suffix(r), shape_name({{"n", n}}), {1e-5, 1e-6},
                     [n, kind, r](const OpCase& c) {
          const auto x = rand_floats(static_cast<size_t>(n), 12, -6.0f, 6.0f), dout = rand_floats(static_cast<size_t>(n), 13);
          std::vector<float> dx(x.size(), 123.0f);  // written, not accumulated
          gelu_backward(dx.data(), x.data(), dout.data(), n, kind, r);
          auto gx = upload(x), gdout = upload(dout);
          auto gdx = upload(std::vector<float>(x.size(), -7.0f));
          cuda::gelu_backward(gdx.as<float>(), gx.as<float>(), gdout.as<float>(), n, kind, r);
          expect_close(c, "dx", dx, download<float>(gdx, dx.size()));
          cuda::gelu_backward(gdout.as<float>(), gx.as<float>(), gdout.as<float>(), n, kind, r);  // dx aliases dout
          expect_close(c, "dx (in place)", dx, download<float>(gdout, dx.size()));
        }});
    }
    // bias_gelu: the rounding and the bias add are exact operations (the same bits), the
    // GELU as gelu_forward's.
    for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 100}, {256, 3072}})
      for (Rounding r : kRoundings)
        for (bool bias : {true, false})
          t.push_back({"bias_gelu_forward_" + k + rounding_suffix(r) + (bias ? "" : "_no_bias"),
                       shape_name({{"N", N}, {"C", C}}), {1e-5, 1e-6}, [N, C, kind, r, bias](const OpCase& c) {
            const size_t n = size_t(N * C);
            const auto y = rand_floats(n, 24, -6.0f, 6.0f), b = rand_floats(size_t(C), 25, -0.5f, 0.5f);
            std::vector<float> pre(n), out(n);
            bias_gelu_forward(pre.data(), out.data(), y.data(), bias ? b.data() : nullptr, N, C, kind, r);
            auto gy = upload(y), gb = upload(b);
            DeviceBuffer gpre(n * 4), gout(n * 4);
            const float* gbias = bias ? gb.as<float>() : nullptr;
            cuda::bias_gelu_forward(gpre.as<float>(), gout.as<float>(), gy.as<float>(), gbias, N, C, kind, r);
            expect_bits(c, "pre", pre, download<float>(gpre, n));
            expect_close(c, "out", out, download<float>(gout, n));
            cuda::bias_gelu_forward(gy.as<float>(), gout.as<float>(), gy.as<float>(), gbias, N, C, kind, r);  // pre aliases y
            expect_bits(c, "pre (in place)", pre, download<float>(gy, n));
            expect_close(c, "out (in place)", out, download<float>(gout, n));
          }});
    // bias_gelu on fc1's bf16 GEMM result (the bf16 policy): the output, fc2's bf16 input,
    // within one bf16 ulp of the CPU's; the backward's pre-activation is recomputed exactly
    // (y + bias), the GELU derivative as gelu_backward's.
    for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 100}, {256, 3072}})
      for (bool bias : {true, false}) {
        const std::string shape = shape_name({{"N", N}, {"C", C}});
        t.push_back({"bias_gelu_forward_packed_" + k + (bias ? "" : "_no_bias"), shape, {1.0 / 128, 1e-6},
                     [N, C, kind, bias](const OpCase& c) {
          const size_t n = size_t(N * C);
          std::vector<uint16_t> y(n), out(n);
          cast_fp32_to_bf16(y.data(), rand_floats(n, 26, -6.0f, 6.0f).data(), int64_t(n));
          const auto b = rand_floats(size_t(C), 27, -0.5f, 0.5f);
          bias_gelu_forward_packed(out.data(), y.data(), bias ? b.data() : nullptr, N, C, kind);
          auto gy = upload(y), gb = upload(b);
          DeviceBuffer gout(n * 2);
          cuda::bias_gelu_forward_packed(gout.as<uint16_t>(), gy.as<uint16_t>(), bias ? gb.as<float>() : nullptr, N,
                                         C, kind);
          std::vector<float> want(n), got(n);
          const auto got16 = download<uint16_t>(gout, n);
          cast_bf16_to_fp32(want.data(), out.data(), int64_t(n));
          cast_bf16_to_fp32(got.data(), got16.data(), int64_t(n));
          expect_close(c, "out (bf16)", want, got);
        }});
        for (Rounding r : kRoundings)
          t.push_back({"bias_gelu_backward_packed_" + k + rounding_suffix(r) + (bias ? "" : "_no_bias"), shape,
                       {1e-5, 1e-6}, [N, C, kind, r, bias](const OpCase& c) {
            const size_t n = size_t(N * C);
            std::vector<uint16_t> y(n);
            cast_fp32_to_bf16(y.data(), rand_floats(n, 28, -6.0f, 6.0f).data(), int64_t(n));
            const auto b = rand_floats(size_t(C), 29, -0.5f, 0.5f), dout = rand_floats(n, 30);
            std::vector<float> dx(n, 123.0f);  // written, not accumulated
            bias_gelu_backward_packed(dx.data(), y.data(), bias ? b.data() : nullptr, dout.data(), N, C, kind, r);
            auto gy = upload(y), gb = upload(b), gdout = upload(dout);
            auto gdx = upload(std::vector<float>(n, -7.0f));
            const float* gbias = bias ? gb.as<float>() : nullptr;
            cuda::bias_gelu_backward_packed(gdx.as<float>(), gy.as<uint16_t>(), gbias, gdout.as<float>(), N, C, kind, r);
            expect_close(c, "dx", dx, download<float>(gdx, n));
            cuda::bias_gelu_backward_packed(gdout.as<float>(), gy.as<uint16_t>(), gbias, gdout.as<float>(), N, C, kind,
                                            r);  // dx aliases dout
            expect_close(c, "dx (in place)", dx, download<float>(gdout, n));
            // dx also in bf16, written over y (fc1's gradient in the place of its result):
            // within one bf16 ulp of the CPU's cast.
            auto gdout2 = upload(dout);
            cuda::bias_gelu_backward_packed(gdx.as<float>(), gy.as<uint16_t>(), gbias, gdout2.as<float>(), N, C, kind, r,
                                            gy.as<uint16_t>());
            expect_close(c, "dx (with the bf16 one)", dx, download<float>(gdx, n));
            std::vector<uint16_t> dx16(n);
            cast_fp32_to_bf16(dx16.data(), dx.data(), int64_t(n));
            std::vector<float> want(n), got(n);
            const auto got16 = download<uint16_t>(gy, n);
            cast_bf16_to_fp32(want.data(), dx16.data(), int64_t(n));
            cast_bf16_to_fp32(got.data(), got16.data(), int64_t(n));
            const OpCase bf16_tol{c.op, c.shape, {1.0 / 128, 1e-6}, nullptr};
            expect_close(bf16_tol, "dx (bf16)", want, got);
            if (r == Rounding::bf16) {
              // dout in bf16 (fc2's input gradient as its GEMM wrote it rounded): the same dx.
              std::vector<uint16_t> dout16(n);
              cast_fp32_to_bf16(dout16.data(), dout.data(), int64_t(n));
              auto gy3 = upload(y), gdout16 = upload(dout16);
              cuda::bias_gelu_backward_packed(gdx.as<float>(), gy3.as<uint16_t>(), gbias, gdout16.as<uint16_t>(), N, C,
                                              kind, gy3.as<uint16_t>());
              expect_close(c, "dx (bf16 dout)", dx, download<float>(gdx, n));
              std::vector<float> got3(n);
              const auto got3_16 = download<uint16_t>(gy3, n);
              cast_bf16_to_fp32(got3.data(), got3_16.data(), int64_t(n));
              expect_close(bf16_tol, "dx (bf16 dout, bf16)", want, got3);
              if (bias) {
                // The form that sums the bias gradient as it goes: its bf16 gradient is the one
                // just made, bit for bit, and its dbias the GPU's bias_backward of the fp32
                // gradient (the same column sums), near the CPU's.
                const auto db0 = rand_floats(size_t(C), 31, -1.0f, 1.0f);
                std::vector<float> db = db0;
                bias_backward(db.data(), dx.data(), N, C);
                auto gdb = upload(db0), gdb_ref = upload(db0), gy4 = upload(y);
                cuda::bias_backward(gdb_ref.as<float>(), gdx.as<float>(), N, C);
                cuda::bias_gelu_backward_packed_dbias(gy4.as<uint16_t>(), gdb.as<float>(), gy4.as<uint16_t>(), gbias,
                                                      gdout16.as<uint16_t>(), N, C, kind);
                std::vector<float> got4(n);
                const auto got4_16 = download<uint16_t>(gy4, n);
                cast_bf16_to_fp32(got4.data(), got4_16.data(), int64_t(n));
                expect_bits(c, "dx (dbias form, bf16)", got3, got4);
                expect_bits(c, "dbias (against bias_backward)", download<float>(gdb_ref, size_t(C)),
                            download<float>(gdb, size_t(C)));
                const OpCase sum_tol{c.op, c.shape, {1e-4, 2e-6 * double(N)}, nullptr};  // sums of N near terms
                expect_close(sum_tol, "dbias", db, download<float>(gdb, size_t(C)));
              }
            }
          }});
      }
  }
}

// ---------------------------------------------------------------- swiglu

// SwiGLU (--swiglu): the pre-activation is exact (the same bits), the activation and its
// gradients within the element math's tolerance; the bf16 forms within a bf16 ulp of the
// CPU's, their bias gradient the GPU's bias_backward of the fp32 gradient bit for bit (the same
// column sums, both halves in one pass). F = 1 (one column per half), uneven, and 1024.
void swiglu_cases(std::vector<OpCase>& t) {
  const std::pair<const char*, GluForm> forms[] = {{"", GluForm{}}, {"_gpt_oss", GluForm{kQuickGeluAlpha, 1.0f, 3.0f}}};
  for (auto [N, F] : {std::pair<int64_t, int64_t>{3, 1}, {37, 100}, {256, 1024}})
    for (bool bias : {true, false})
      for (auto [form_name, f] : forms) {
        const std::string shape = shape_name({{"N", N}, {"F", F}}),
                          suffix = std::string(bias ? "" : "_no_bias") + form_name;
        for (Rounding r : kRoundings)
          t.push_back(
              {"bias_swiglu_forward_backward" + rounding_suffix(r) + suffix,
               shape,
               {1e-5, 1e-6},
               [N, F, r, bias, f = f](const OpCase& c) {
                 const size_t n2 = size_t(N * 2 * F), n = size_t(N * F);
                 const auto y = rand_floats(n2, 40, -6.0f, 6.0f), b = rand_floats(size_t(2 * F), 41, -0.5f, 0.5f);
                 const auto dout = rand_floats(n, 42);
                 std::vector<float> pre(n2), out(n), dx(n2, 123.0f);
                 bias_swiglu_forward(pre.data(), out.data(), y.data(), bias ? b.data() : nullptr, N, F, r, f);
                 swiglu_backward(dx.data(), pre.data(), dout.data(), N, F, r, f);
                 auto gy = upload(y), gb = upload(b), gdout = upload(dout);
                 DeviceBuffer gpre(n2 * 4), gout(n * 4);
                 auto gdx = upload(std::vector<float>(n2, -7.0f));  // written, not accumulated
                 const float* gbias = bias ? gb.as<float>() : nullptr;
                 cuda::bias_swiglu_forward(gpre.as<float>(), gout.as<float>(), gy.as<float>(), gbias, N, F, r, f);
                 expect_bits(c, "pre", pre, download<float>(gpre, n2));
                 expect_close(c, "out", out, download<float>(gout, n));
                 cuda::swiglu_backward(gdx.as<float>(), gpre.as<float>(), gdout.as<float>(), N, F, r, f);
                 expect_close(c, "dx", dx, download<float>(gdx, n2));
                 // In place: pre over y, then dx over pre.
                 cuda::bias_swiglu_forward(gy.as<float>(), gout.as<float>(), gy.as<float>(), gbias, N, F, r, f);
                 expect_bits(c, "pre (in place)", pre, download<float>(gy, n2));
                 cuda::swiglu_backward(gy.as<float>(), gy.as<float>(), gdout.as<float>(), N, F, r, f);
                 expect_close(c, "dx (in place)", dx, download<float>(gy, n2));
               }});
        t.push_back(
            {"bias_swiglu_packed" + suffix, shape, {1.0 / 128, 1e-6}, [N, F, bias, f = f](const OpCase& c) {
               const size_t n2 = size_t(N * 2 * F), n = size_t(N * F);
               std::vector<uint16_t> y(n2), dout(n), out(n), dx16(n2);
               cast_fp32_to_bf16(y.data(), rand_floats(n2, 43, -6.0f, 6.0f).data(), int64_t(n2));
               cast_fp32_to_bf16(dout.data(), rand_floats(n, 44).data(), int64_t(n));
               const auto b = rand_floats(size_t(2 * F), 45, -0.5f, 0.5f), db0 = rand_floats(size_t(2 * F), 46);
               const float* bias_cpu = bias ? b.data() : nullptr;
               bias_swiglu_forward_packed(out.data(), y.data(), bias_cpu, N, F, f);
               std::vector<float> db = db0;
               bias_swiglu_backward_packed_dbias(dx16.data(), db.data(), y.data(), bias_cpu, dout.data(), N, F, f);
               auto gy = upload(y), gb = upload(b), gdout = upload(dout), gdb = upload(db0), gdb_ref = upload(db0);
               const float* gbias = bias ? gb.as<float>() : nullptr;
               DeviceBuffer gout(n * 2);
               cuda::bias_swiglu_forward_packed(gout.as<uint16_t>(), gy.as<uint16_t>(), gbias, N, F, f);
               auto widen = [](const std::vector<uint16_t>& v) {
                 std::vector<float> o(v.size());
                 cast_bf16_to_fp32(o.data(), v.data(), int64_t(v.size()));
                 return o;
               };
               expect_close(c, "out (bf16)", widen(out), widen(download<uint16_t>(gout, n)));
               // The fp32 gradient the GPU's unpacked kernels make, for the bits of the packed form.
               std::vector<float> yf = widen(y);
               if (bias)
                 for (size_t i = 0; i < n2; ++i) yf[i] += b[i % size_t(2 * F)];
               auto gpre = upload(yf), gdout32 = upload(widen(dout));
               DeviceBuffer gdx(n2 * 4);
               cuda::swiglu_backward(gdx.as<float>(), gpre.as<float>(), gdout32.as<float>(), N, F, Rounding::none, f);
               cuda::bias_backward(gdb_ref.as<float>(), gdx.as<float>(), N, 2 * F);
               cuda::bias_swiglu_backward_packed_dbias(gy.as<uint16_t>(), gdb.as<float>(), gy.as<uint16_t>(), gbias,
                                                       gdout.as<uint16_t>(), N, F, f);  // dx over y
               const std::vector<float> got16 = widen(download<uint16_t>(gy, n2));
               expect_close(c, "dx (bf16)", widen(dx16), got16);
               std::vector<uint16_t> gdx16(n2);
               cast_fp32_to_bf16(gdx16.data(), download<float>(gdx, n2).data(), int64_t(n2));
               expect_bits(c, "dx (bf16, against the fp32 kernel's)", widen(gdx16), got16);
               expect_bits(c, "dbias (against bias_backward)", download<float>(gdb_ref, size_t(2 * F)),
                           download<float>(gdb, size_t(2 * F)));
               const OpCase sum_tol{c.op, c.shape, {1e-4, 2e-6 * double(N)}, nullptr};  // sums of N near terms
               expect_close(sum_tol, "dbias", db, download<float>(gdb, size_t(2 * F)));
             }});
      }
}

// ---------------------------------------------------------------- dropout

void dropout_cases(std::vector<OpCase>& t) {
  struct D {
    int64_t n;
    uint64_t first;
    float p;
  };
  for (D d : {D{37, 5, 0.1f}, D{100003, (uint64_t(1) << 33) + 3, 0.5f}, D{1000, 0, 0.0f}, D{4099, 2, 0.9f}}) {
    const std::string shape = shape_name({{"n", d.n}, {"first", int64_t(d.first)}, {"p_pct", int64_t(d.p * 100)}});
    // The same Philox draws and one multiply: the same bits.
    for (bool backward : {false, true})
      t.push_back({backward ? "dropout_backward" : "dropout_forward", shape, {0.0, 0.0}, [d, backward](const OpCase& c) {
        const PhiloxStream stream{0x1234567890abcdefull, 77u, 3u, 9u};
        auto x = rand_floats(static_cast<size_t>(d.n), 14, -4.0f, 4.0f);
        x[0] = std::numeric_limits<float>::infinity();  // dropped infinities become 0
        std::vector<float> out(x.size());
        auto gx = upload(x);
        DeviceBuffer gout(out.size() * 4);
        if (backward) {
          dropout_backward(out.data(), x.data(), d.n, d.p, stream, d.first);
          cuda::dropout_backward(gout.as<float>(), gx.as<float>(), d.n, d.p, stream, d.first);
        } else {
          dropout_forward(out.data(), x.data(), d.n, d.p, stream, d.first);
          cuda::dropout_forward(gout.as<float>(), gx.as<float>(), d.n, d.p, stream, d.first);
        }
        expect_bits(c, "out", out, download<float>(gout, out.size()));
        cuda::dropout_forward(gx.as<float>(), gx.as<float>(), d.n, d.p, stream, d.first);  // in place
        expect_bits(c, "out (in place)", out, download<float>(gx, out.size()));
      }});
  }
  // The MoE router's input jitter: the same draws, the factor's one FMA, then a multiply (forward)
  // or an FMA into the accumulated gradient (backward): the same bits.
  for (D d : {D{37, 5, 0.1f}, D{100003, (uint64_t(1) << 33) + 3, 0.5f}, D{4099, 2, 0.0f}})
    for (bool backward : {false, true}) {
      const std::string shape = shape_name({{"n", d.n}, {"first", int64_t(d.first)}, {"eps_pct", int64_t(d.p * 100)}});
      t.push_back({backward ? "input_jitter_backward" : "input_jitter_forward", shape, {0.0, 0.0},
                   [d, backward](const OpCase& c) {
                     const PhiloxStream stream{0x1234567890abcdefull, 78u, 3u, 9u};
                     auto x = rand_floats(static_cast<size_t>(d.n), 15, -4.0f, 4.0f);
                     std::vector<float> out = rand_floats(x.size(), 16);  // accumulated into by the backward
                     auto gx = upload(x);
                     auto gout = upload(out);
                     if (backward) {
                       input_jitter_backward(out.data(), x.data(), d.n, d.p, stream, d.first);
                       cuda::input_jitter_backward(gout.as<float>(), gx.as<float>(), d.n, d.p, stream, d.first);
                     } else {
                       input_jitter_forward(out.data(), x.data(), d.n, d.p, stream, d.first);
                       cuda::input_jitter_forward(gout.as<float>(), gx.as<float>(), d.n, d.p, stream, d.first);
                     }
                     expect_bits(c, "out", out, download<float>(gout, out.size()));
                   }});
    }
  // The fused bias-dropout-add: the same draws and explicitly rounded add, multiply, add.
  struct F {
    int64_t N, C;
    uint64_t first;
    float p;
  };
  for (F f : {F{37, 77, 5, 0.1f}, F{1024, 768, (uint64_t(1) << 33) + 1, 0.1f}, F{9, 33, 0, 0.0f}})
    for (Rounding r : kRoundings) {
      const std::string shape = shape_name({{"N", f.N}, {"C", f.C}, {"first", int64_t(f.first)},
                                            {"p_pct", int64_t(f.p * 100)}});
      t.push_back({"bias_dropout_add_forward" + rounding_suffix(r), shape, {0.0, 0.0}, [f, r](const OpCase& c) {
        const PhiloxStream stream{0x1234567890abcdefull, 78u, 3u, 9u};
        const size_t n = size_t(f.N * f.C);
        const auto y = rand_floats(n, 15, -4.0f, 4.0f), residual = rand_floats(n, 16, -1.0f, 1.0f);
        const auto bias = rand_floats(size_t(f.C), 17, -0.5f, 0.5f);
        std::vector<float> out(n);
        bias_dropout_add_forward(out.data(), residual.data(), y.data(), bias.data(), f.N, f.C, f.p, stream, f.first, r);
        auto gy = upload(y), gres = upload(residual), gbias = upload(bias);
        DeviceBuffer gout(n * 4);
        cuda::bias_dropout_add_forward(gout.as<float>(), gres.as<float>(), gy.as<float>(), gbias.as<float>(), f.N,
                                       f.C, f.p, stream, f.first, r);
        expect_bits(c, "out", out, download<float>(gout, n));
        cuda::bias_dropout_add_forward(gres.as<float>(), gres.as<float>(), gy.as<float>(), gbias.as<float>(), f.N,
                                       f.C, f.p, stream, f.first, r);  // in place on the residual
        expect_bits(c, "out (in place)", out, download<float>(gres, n));
      }});
    }
  // A row-parallel layer's output and bias gradients through dropout in one pass: on the GPU
  // the bits of dropout_backward then bias_backward_cast_bf16; near the CPU's (column sums
  // in another order; the cast within one bf16 ulp).
  for (F f : {F{37, 77, 5, 0.1f}, F{1024, 768, (uint64_t(1) << 33) + 1, 0.1f}}) {
    const std::string shape = shape_name({{"N", f.N}, {"C", f.C}, {"first", int64_t(f.first)},
                                          {"p_pct", int64_t(f.p * 100)}});
    t.push_back({"dropout_backward_bias_cast_bf16", shape, {1e-5, 1e-7 * double(f.N)}, [f](const OpCase& c) {
      const PhiloxStream stream{0x1234567890abcdefull, 78u, 3u, 9u};
      const size_t n = size_t(f.N * f.C);
      const auto dout = rand_floats(n, 18, -2.0f, 2.0f), db0 = rand_floats(size_t(f.C), 19);
      std::vector<float> db = db0;
      std::vector<uint16_t> cast(n);
      dropout_backward_bias_cast_bf16(db.data(), cast.data(), dout.data(), f.N, f.C, f.p, stream, f.first);
      auto gdout = upload(dout), gdb = upload(db0), gdb_ref = upload(db0);
      DeviceBuffer gdx(n * 4), gcast(n * 2), gcast_ref(n * 2);
      cuda::dropout_backward_bias_cast_bf16(gdb.as<float>(), gcast.as<uint16_t>(), gdout.as<float>(), f.N, f.C, f.p,
                                            stream, f.first);
      cuda::dropout_backward(gdx.as<float>(), gdout.as<float>(), int64_t(n), f.p, stream, f.first);
      cuda::bias_backward_cast_bf16(gdb_ref.as<float>(), gcast_ref.as<uint16_t>(), gdx.as<float>(), f.N, f.C);
      const auto got_db = download<float>(gdb, db.size());
      expect_bits(c, "dbias (against the two kernels)", download<float>(gdb_ref, db.size()), got_db);
      const auto got = download<uint16_t>(gcast, n), want = download<uint16_t>(gcast_ref, n);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * 2)) << c.op << " " << c.shape << ": the cast";
      expect_close(c, "dbias", db, got_db);
      std::vector<float> cpu(n), gpu(n);
      cast_bf16_to_fp32(cpu.data(), cast.data(), int64_t(n));
      cast_bf16_to_fp32(gpu.data(), got.data(), int64_t(n));
      const OpCase bf16_tol{c.op, c.shape, {1.0 / 128, 0.0}, nullptr};
      expect_close(bf16_tol, "dx (bf16)", cpu, gpu);
    }});
  }
  // The GEMM result as bf16 patterns (no tensor parallelism): the CPU's bf16 overload.
  for (F f : {F{37, 77, 5, 0.1f}, F{1024, 768, (uint64_t(1) << 33) + 1, 0.1f}, F{9, 33, 0, 0.0f}}) {
    const std::string shape = shape_name({{"N", f.N}, {"C", f.C}, {"first", int64_t(f.first)},
                                          {"p_pct", int64_t(f.p * 100)}});
    t.push_back({"bias_dropout_add_forward_packed", shape, {0.0, 0.0}, [f](const OpCase& c) {
      const PhiloxStream stream{0x1234567890abcdefull, 78u, 3u, 9u};
      const size_t n = size_t(f.N * f.C);
      std::vector<uint16_t> y(n);
      cast_fp32_to_bf16(y.data(), rand_floats(n, 15, -4.0f, 4.0f).data(), int64_t(n));
      const auto residual = rand_floats(n, 16, -1.0f, 1.0f), bias = rand_floats(size_t(f.C), 17, -0.5f, 0.5f);
      std::vector<float> out(n);
      bias_dropout_add_forward(out.data(), residual.data(), y.data(), bias.data(), f.N, f.C, f.p, stream, f.first);
      auto gy = upload(y), gres = upload(residual), gbias = upload(bias);
      DeviceBuffer gout(n * 4);
      cuda::bias_dropout_add_forward(gout.as<float>(), gres.as<float>(), gy.as<uint16_t>(), gbias.as<float>(), f.N,
                                     f.C, f.p, stream, f.first);
      expect_bits(c, "out", out, download<float>(gout, n));
      cuda::bias_dropout_add_forward(gres.as<float>(), gres.as<float>(), gy.as<uint16_t>(), gbias.as<float>(), f.N,
                                     f.C, f.p, stream, f.first);  // in place on the residual
      expect_bits(c, "out (in place)", out, download<float>(gres, n));
    }});
  }
  // bias_dropout_add with the LayerNorm of its result (the next layer's input): on the GPU
  // the bits of bias_dropout_add_forward then layernorm_forward(_bf16); near the CPU's (the
  // sum exact, the LayerNorm's row sums in another order). y fp32 (rounded as read) or bf16;
  // the LayerNorm's output fp32 or bf16; C up to 8 columns a thread (1300), and past (2100:
  // the two kernels).
  struct L {
    int64_t N, C;
    uint64_t first;
    float p;
  };
  for (L f : {L{37, 77, 5, 0.1f}, L{300, 768, (uint64_t(1) << 33) + 1, 0.1f}, L{9, 1300, 0, 0.0f},
              L{5, 2100, 3, 0.1f}})
    for (int form = 0; form < 4; ++form) {  // y fp32 + ln fp32; y fp32 rounded bf16 + ln bf16; y bf16 + ln bf16;
                                            // y fp32 + RMSNorm fp32
      const std::string name = form == 0   ? ""
                               : form == 1 ? "_round_bf16_ln_bf16"
                               : form == 2 ? "_packed_ln_bf16"
                                           : "_rmsnorm";
      const std::string shape = shape_name({{"N", f.N}, {"C", f.C}, {"first", int64_t(f.first)},
                                            {"p_pct", int64_t(f.p * 100)}});
      t.push_back({"bias_dropout_add_layernorm_forward" + name, shape, {1e-5, 1e-5}, [f, form](const OpCase& c) {
        const PhiloxStream stream{0x1234567890abcdefull, 79u, 3u, 9u};
        const size_t n = size_t(f.N * f.C);
        const auto y = rand_floats(n, 20, -4.0f, 4.0f), residual = rand_floats(n, 21, -1.0f, 1.0f);
        std::vector<uint16_t> y16(n);
        cast_fp32_to_bf16(y16.data(), y.data(), int64_t(n));
        const auto bias = rand_floats(size_t(f.C), 22, -0.5f, 0.5f), w = rand_floats(size_t(f.C), 23);
        const auto b = rand_floats(size_t(f.C), 24);
        const Rounding r = form == 1 ? Rounding::bf16 : Rounding::none;
        const bool ln16 = form == 1 || form == 2;
        const Normalization kind = form == 3 ? Normalization::rmsnorm : Normalization::layernorm;
        // The CPU.
        std::vector<float> out(n), ln(n), mean(size_t(f.N)), rstd(size_t(f.N));
        std::vector<uint16_t> ln_b(n);
        LayerNormOut cpu_ln{ln16 ? nullptr : ln.data(), ln16 ? ln_b.data() : nullptr, mean.data(), rstd.data(),
                            w.data(), b.data(), 1e-5f, kind};
        if (form == 2)
          bias_dropout_add_layernorm_forward(out.data(), residual.data(), y16.data(), bias.data(), f.N, f.C, f.p,
                                             stream, f.first, cpu_ln);
        else
          bias_dropout_add_layernorm_forward(out.data(), residual.data(), y.data(), bias.data(), f.N, f.C, f.p,
                                             stream, f.first, r, cpu_ln);
        // The GPU, fused and as the two kernels.
        auto gy = upload(y), gy16 = upload(y16), gres = upload(residual), gbias = upload(bias), gw = upload(w);
        auto gb = upload(b);
        DeviceBuffer gout(n * 4), gln(n * 4), gmean(size_t(f.N) * 4), grstd(size_t(f.N) * 4);
        DeviceBuffer rout(n * 4), rln(n * 4), rmean(size_t(f.N) * 4), rrstd(size_t(f.N) * 4);
        auto ln_out = [&](DeviceBuffer& o, DeviceBuffer& m, DeviceBuffer& s) {
          return LayerNormOut{ln16 ? nullptr : o.as<float>(), ln16 ? o.as<uint16_t>() : nullptr, m.as<float>(),
                              s.as<float>(), gw.as<float>(), gb.as<float>(), 1e-5f, kind};
        };
        if (form == 2) {
          cuda::bias_dropout_add_layernorm_forward(gout.as<float>(), gres.as<float>(), gy16.as<uint16_t>(),
                                                   gbias.as<float>(), f.N, f.C, f.p, stream, f.first,
                                                   ln_out(gln, gmean, grstd));
          cuda::bias_dropout_add_forward(rout.as<float>(), gres.as<float>(), gy16.as<uint16_t>(), gbias.as<float>(),
                                         f.N, f.C, f.p, stream, f.first);
        } else {
          cuda::bias_dropout_add_layernorm_forward(gout.as<float>(), gres.as<float>(), gy.as<float>(),
                                                   gbias.as<float>(), f.N, f.C, f.p, stream, f.first, r,
                                                   ln_out(gln, gmean, grstd));
          cuda::bias_dropout_add_forward(rout.as<float>(), gres.as<float>(), gy.as<float>(), gbias.as<float>(), f.N,
                                         f.C, f.p, stream, f.first, r);
        }
        if (ln16)
          cuda::layernorm_forward_bf16(rln.as<uint16_t>(), rmean.as<float>(), rrstd.as<float>(), rout.as<float>(),
                                       gw.as<float>(), gb.as<float>(), f.N, f.C, 1e-5f, kind);
        else
          cuda::layernorm_forward(rln.as<float>(), rmean.as<float>(), rrstd.as<float>(), rout.as<float>(),
                                  gw.as<float>(), gb.as<float>(), f.N, f.C, 1e-5f, kind);
        const auto got_out = download<float>(gout, n);
        expect_bits(c, "out", out, got_out);
        expect_bits(c, "out (against the two kernels)", download<float>(rout, n), got_out);
        expect_bits(c, "mean (against the two kernels)", download<float>(rmean, size_t(f.N)),
                    download<float>(gmean, size_t(f.N)));
        expect_bits(c, "rstd (against the two kernels)", download<float>(rrstd, size_t(f.N)),
                    download<float>(grstd, size_t(f.N)));
        expect_close(c, "mean", mean, download<float>(gmean, size_t(f.N)));
        expect_close(c, "rstd", rstd, download<float>(grstd, size_t(f.N)));
        std::vector<float> cpu(n), gpu(n), ref(n);
        if (ln16) {
          const auto got = download<uint16_t>(gln, n), want = download<uint16_t>(rln, n);
          EXPECT_EQ(got, want) << c.op << " " << c.shape << ": the LayerNorm against the two kernels";
          cast_bf16_to_fp32(cpu.data(), ln_b.data(), int64_t(n));
          cast_bf16_to_fp32(gpu.data(), got.data(), int64_t(n));
          const OpCase bf16_tol{c.op, c.shape, {1.0 / 128, 1e-5}, nullptr};
          expect_close(bf16_tol, "ln (bf16)", cpu, gpu);
        } else {
          const auto got = download<float>(gln, n);
          expect_bits(c, "ln (against the two kernels)", download<float>(rln, n), got);
          expect_close(c, "ln", ln, got);
        }
      }});
    }
}

// ---------------------------------------------------------------- elementwise

void elementwise_cases(std::vector<OpCase>& t) {
  // One rounding each, as on the CPU: exact.
  t.push_back({"add_forward", "n100003", {0.0, 0.0}, [](const OpCase& c) {
    const int64_t n = 100003;
    const auto a = rand_floats(static_cast<size_t>(n), 15), b = rand_floats(static_cast<size_t>(n), 16);
    std::vector<float> out(a.size());
    add_forward(out.data(), a.data(), b.data(), n);
    auto ga = upload(a), gb = upload(b);
    DeviceBuffer gout(out.size() * 4);
    cuda::add_forward(gout.as<float>(), ga.as<float>(), gb.as<float>(), n);
    expect_bits(c, "out", out, download<float>(gout, out.size()));
    cuda::add_forward(ga.as<float>(), ga.as<float>(), gb.as<float>(), n);  // out aliases a
    expect_bits(c, "out (aliasing a)", out, download<float>(ga, out.size()));
  }});
  t.push_back({"accumulate", "n37", {0.0, 0.0}, [](const OpCase& c) {
    const int64_t n = 37;
    auto y = rand_floats(static_cast<size_t>(n), 17);
    const auto x = rand_floats(static_cast<size_t>(n), 18);
    auto gy = upload(y), gx = upload(x);
    accumulate(y.data(), x.data(), n);
    cuda::accumulate(gy.as<float>(), gx.as<float>(), n);
    expect_bits(c, "y", y, download<float>(gy, y.size()));
  }});
  t.push_back({"scale_inplace", "n100003", {0.0, 0.0}, [](const OpCase& c) {
    const int64_t n = 100003;
    auto x = rand_floats(static_cast<size_t>(n), 19);
    auto gx = upload(x);
    scale_inplace(x.data(), 0.37f, n);
    cuda::scale_inplace(gx.as<float>(), 0.37f, n);
    expect_bits(c, "x", x, download<float>(gx, x.size()));
  }});
  // The multi-latent attention's strided copies: per-head blocks scaled, a broadcast (source head
  // stride 0), zeros, and the heads summed (destination head stride 0).
  t.push_back({"copy_head_blocks", "N37_H5_len7", {0.0, 0.0}, [](const OpCase& c) {
    const int64_t N = 37, H = 5, len = 7, row = 3 * H * 12, head = 36;
    const auto src = rand_floats(static_cast<size_t>(N * row), 22);
    auto dst = rand_floats(static_cast<size_t>(N * row), 23);
    auto gsrc = upload(src), gdst = upload(dst);
    auto both = [&](float* d, const float* s, float* gd, const float* gs, int64_t dr, int64_t dh, int64_t sr,
                    int64_t sh, float scale) {
      copy_head_blocks(d, dr, dh, s, sr, sh, N, H, len, scale);
      cuda::copy_head_blocks(gd, dr, dh, gs, sr, sh, N, H, len, scale);
    };
    float* d = dst.data();
    float* gd = gdst.as<float>();
    const float* s = src.data();
    const float* gs = gsrc.as<float>();
    both(d + 3, s + 1, gd + 3, gs + 1, row, head, row, head, 0.37f);  // scaled blocks
    both(d + 12, s + 2, gd + 12, gs + 2, row, head, row, 0, 1.0f);    // one source block in every head
    both(d + 24, nullptr, gd + 24, nullptr, row, head, 0, 0, 1.0f);   // zeros
    both(d + 30, s + 5, gd + 30, gs + 5, row, 0, row, head, 1.0f);    // the heads summed into one block
    expect_bits(c, "dst", dst, download<float>(gdst, dst.size()));
  }});
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 100}, {1000, 768}}) {
    for (Rounding r : kRoundings)
      t.push_back({"bias_add" + rounding_suffix(r), shape_name({{"N", N}, {"C", C}}), {0.0, 0.0}, [N, C, r](const OpCase& c) {
        auto out = rand_floats(static_cast<size_t>(N * C), 20);
        const auto bias = rand_floats(static_cast<size_t>(C), 21);
        auto gout = upload(out), gbias = upload(bias);
        bias_add(out.data(), bias.data(), N, C, r);
        cuda::bias_add(gout.as<float>(), gbias.as<float>(), N, C, r);
        expect_bits(c, "out", out, download<float>(gout, out.size()));
      }});
    // Column sums of N terms in [-1, 1], in another order than the CPU's.
    t.push_back({"bias_backward", shape_name({{"N", N}, {"C", C}}), {1e-5, 1e-7 * double(N)}, [N, C](const OpCase& c) {
      const auto dout = rand_floats(static_cast<size_t>(N * C), 22);
      auto dbias = rand_floats(static_cast<size_t>(C), 23);  // accumulates
      auto gdout = upload(dout), gdbias = upload(dbias);
      bias_backward(dbias.data(), dout.data(), N, C);
      cuda::bias_backward(gdbias.as<float>(), gdout.as<float>(), N, C);
      const auto once = download<float>(gdbias, dbias.size());
      expect_close(c, "dbias", dbias, once);
      auto gdbias2 = upload(rand_floats(static_cast<size_t>(C), 23));
      cuda::bias_backward(gdbias2.as<float>(), gdout.as<float>(), N, C);
      expect_bits(c, "dbias (second run)", once, download<float>(gdbias2, dbias.size()));
      // With the bf16 cast written in the same pass: the GPU's bias_backward bits and the cast.
      auto gdbias3 = upload(rand_floats(static_cast<size_t>(C), 23));
      DeviceBuffer gcast(size_t(N * C) * 2);
      cuda::bias_backward_cast_bf16(gdbias3.as<float>(), gcast.as<uint16_t>(), gdout.as<float>(), N, C);
      expect_bits(c, "dbias (with the cast)", once, download<float>(gdbias3, dbias.size()));
      std::vector<uint16_t> cast(static_cast<size_t>(N * C));
      cast_fp32_to_bf16(cast.data(), dout.data(), N * C);
      const auto got = download<uint16_t>(gcast, cast.size());
      EXPECT_EQ(0, std::memcmp(got.data(), cast.data(), cast.size() * 2)) << c.op << " " << c.shape << ": the cast";
    }});
  }
}

// ---------------------------------------------------------------- embedding

void embedding_cases(std::vector<OpCase>& t) {
  // Gathers and single adds; the backward sums rows in index order as the CPU does:
  // all exact.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 100}, {1000, 768}}) {
    const int64_t V = 50, P = 40;
    const std::string shape = shape_name({{"N", N}, {"C", C}, {"V", V}});
    for (bool with_wpe : {true, false})
      t.push_back({with_wpe ? "embedding_forward" : "embedding_forward_no_wpe", shape, {0.0, 0.0},
                   [N, C, with_wpe](const OpCase& c) {
        const auto tokens = rand_ints(static_cast<size_t>(N), 24, 0, V), positions = rand_ints(static_cast<size_t>(N), 25, 0, P);
        const auto wte = rand_floats(static_cast<size_t>(V * C), 26), wpe = rand_floats(static_cast<size_t>(P * C), 27);
        std::vector<float> out(static_cast<size_t>(N * C));
        embedding_forward(out.data(), tokens.data(), positions.data(), wte.data(), with_wpe ? wpe.data() : nullptr, N, C);
        auto gt = upload(tokens), gp = upload(positions), gwte = upload(wte), gwpe = upload(wpe);
        DeviceBuffer gout(out.size() * 4);
        cuda::embedding_forward(gout.as<float>(), gt.as<int32_t>(), gp.as<int32_t>(), gwte.as<float>(),
                                with_wpe ? gwpe.as<float>() : nullptr, N, C);
        expect_bits(c, "out", out, download<float>(gout, out.size()));
      }});
    // This rank holds rows [20, 37) of the table; tokens outside give zero rows.
    t.push_back({"vocab_parallel_embedding_forward", shape + "_begin20_Vl17", {0.0, 0.0}, [N, C](const OpCase& c) {
      const int64_t begin = 20, Vl = 17;
      const auto tokens = rand_ints(static_cast<size_t>(N), 28, 0, V);
      const auto wte_local = rand_floats(static_cast<size_t>(Vl * C), 29);
      std::vector<float> out(static_cast<size_t>(N * C), 5.0f);
      vocab_parallel_embedding_forward(out.data(), tokens.data(), wte_local.data(), begin, Vl, N, C);
      auto gt = upload(tokens), gw = upload(wte_local);
      auto gout = upload(std::vector<float>(out.size(), -5.0f));
      cuda::vocab_parallel_embedding_forward(gout.as<float>(), gt.as<int32_t>(), gw.as<float>(), begin, Vl, N, C);
      expect_bits(c, "out", out, download<float>(gout, out.size()));
    }});
    t.push_back({"position_embedding_add", shape, {0.0, 0.0}, [N, C](const OpCase& c) {
      const auto positions = rand_ints(static_cast<size_t>(N), 30, 0, P);
      const auto wpe = rand_floats(static_cast<size_t>(P * C), 31);
      auto out = rand_floats(static_cast<size_t>(N * C), 32);
      auto gp = upload(positions), gw = upload(wpe), gout = upload(out);
      position_embedding_add(out.data(), positions.data(), wpe.data(), N, C);
      cuda::position_embedding_add(gout.as<float>(), gp.as<int32_t>(), gw.as<float>(), N, C);
      expect_bits(c, "out", out, download<float>(gout, out.size()));
    }});
    // Whole table (Vl = -1), with and without dwpe; and a vocab slice [32, 52) of a table
    // padded past V = 50 (rows 50, 51 never hit), tokens outside the slice skipped.
    // Each also with the rows grouped by token and position (group_rows_by_index: a block
    // per group), and with tokens grouped but not positions.
    struct B {
      const char* name;
      int64_t begin, Vl;
      bool with_wpe;
      int grouped;  // 0: no groups; 1: tokens and positions; 2: tokens only
    };
    for (B b : {B{"embedding_backward", 0, -1, true, 0}, B{"embedding_backward_no_wpe", 0, -1, false, 0},
                B{"embedding_backward_vocab_slice", 32, 20, true, 0}, B{"embedding_backward_grouped", 0, -1, true, 1},
                B{"embedding_backward_grouped_no_wpe", 0, -1, false, 1},
                B{"embedding_backward_grouped_vocab_slice", 32, 20, true, 1},
                B{"embedding_backward_grouped_tokens", 32, 20, true, 2}})
      t.push_back({b.name, shape + "_begin" + std::to_string(b.begin) + "_Vl" + std::to_string(b.Vl < 0 ? V : b.Vl),
                   {0.0, 0.0}, [N, C, b](const OpCase& c) {
        const int64_t rows = b.Vl < 0 ? V : b.Vl;
        const auto tokens = rand_ints(static_cast<size_t>(N), 33, 0, V), positions = rand_ints(static_cast<size_t>(N), 34, 0, P);
        const auto dout = rand_floats(static_cast<size_t>(N * C), 35);
        auto dwte = rand_floats(static_cast<size_t>(rows * C), 36), dwpe = rand_floats(static_cast<size_t>(P * C), 37);  // accumulate
        auto gt = upload(tokens), gp = upload(positions), gd = upload(dout), gwte = upload(dwte), gwpe = upload(dwpe);
        embedding_backward(dwte.data(), b.with_wpe ? dwpe.data() : nullptr, dout.data(), tokens.data(),
                           positions.data(), N, C, b.begin, b.Vl);
        std::vector<int32_t> groups(size_t(2 * (2 * N + 1)));
        const int64_t token_groups = group_rows_by_index(tokens.data(), N, groups.data());
        const int64_t position_groups = group_rows_by_index(positions.data(), N, groups.data() + 2 * N + 1);
        auto gg = upload(groups);
        const int32_t* g = gg.as<int32_t>();
        EmbeddingRowGroups rg;
        if (b.grouped > 0) rg.tokens = RowGroups{g, g + N, token_groups};
        if (b.grouped == 1) rg.positions = RowGroups{g + 2 * N + 1, g + 3 * N + 1, position_groups};
        cuda::embedding_backward(gwte.as<float>(), b.with_wpe ? gwpe.as<float>() : nullptr, gd.as<float>(),
                                 gt.as<int32_t>(), gp.as<int32_t>(), N, C, b.begin, b.Vl, rg);
        expect_bits(c, "dwte", dwte, download<float>(gwte, dwte.size()));
        expect_bits(c, "dwpe", dwpe, download<float>(gwpe, dwpe.size()));
      }});
  }
}

// ---------------------------------------------------------------- cross entropy

void cross_entropy_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t N, V, Vp;
  };
  for (S s : {S{37, 100, 128}, S{5, 50257, 50304}}) {
    const std::string shape = shape_name({{"N", s.N}, {"V", s.V}, {"Vp", s.Vp}});
    // The same exp polynomial; the sum of exponentials in float lanes (CPU) or double (GPU):
    // ~1e-7 relative on the sum, so ~1e-6 on losses of O(10) and on the softmax.
    t.push_back({"cross_entropy_forward", shape, {1e-5, 1e-5}, [s](const OpCase& c) {
      const auto logits = rand_floats(static_cast<size_t>(s.N * s.Vp), 38, -8.0f, 8.0f);
      const auto targets = rand_ints(static_cast<size_t>(s.N), 39, 0, int32_t(s.V));
      std::vector<float> losses(static_cast<size_t>(s.N));
      cross_entropy_forward(losses.data(), logits.data(), targets.data(), s.N, s.V, s.Vp);
      auto gl = upload(logits), gt = upload(targets);
      DeviceBuffer gloss(losses.size() * 4);
      cuda::cross_entropy_forward(gloss.as<float>(), gl.as<float>(), gt.as<int32_t>(), s.N, s.V, s.Vp);
      expect_close(c, "losses", losses, download<float>(gloss, losses.size()));
      expect_bits(c, "logits (unchanged)", logits, download<float>(gl, logits.size()));
    }});
    for (bool masked : {false, true})
      t.push_back({masked ? "cross_entropy_forward_backward_masked" : "cross_entropy_forward_backward", shape,
                   {1e-5, 1e-9}, [s, masked](const OpCase& c) {
        // atol 1e-9 is for dlogits (softmax * scale, down to ~1e-8); losses are checked
        // with the forward's tolerance below.
        auto logits = rand_floats(static_cast<size_t>(s.N * s.Vp), 40, -8.0f, 8.0f);
        const auto targets = rand_ints(static_cast<size_t>(s.N), 41, 0, int32_t(s.V));
        std::vector<float> mask(static_cast<size_t>(s.N));
        for (int64_t n = 0; n < s.N; ++n) mask[static_cast<size_t>(n)] = n % 3 == 1 ? 0.0f : 1.0f;
        const float grad_scale = 1.0f / float(s.N);
        auto gl = upload(logits), gt = upload(targets), gm = upload(mask);
        std::vector<float> losses(static_cast<size_t>(s.N));
        DeviceBuffer gloss(losses.size() * 4);
        cross_entropy_forward_backward(logits.data(), losses.data(), targets.data(), masked ? mask.data() : nullptr,
                                       grad_scale, s.N, s.V, s.Vp);
        cuda::cross_entropy_forward_backward(gl.as<float>(), gloss.as<float>(), gt.as<int32_t>(),
                                             masked ? gm.as<float>() : nullptr, grad_scale, s.N, s.V, s.Vp);
        const OpCase loss_tol{c.op, c.shape, {1e-5, 1e-5}, nullptr};
        expect_close(loss_tol, "losses", losses, download<float>(gloss, losses.size()));
        expect_close(c, "dlogits", logits, download<float>(gl, logits.size()));
      }});
  }

  // Vocab-parallel: P ranks each hold Vl = Vp / P columns; the last holds padding (or,
  // for V = 64 of Vp = 96, nothing real: valid = 0). The all-reduces are done by hand,
  // separately for the CPU and the GPU results.
  struct VP {
    int64_t N, V, Vp, P;
  };
  for (VP s : {VP{37, 100, 108, 3}, VP{6, 64, 96, 3}, VP{4, 50257, 50304, 2}}) {
    const std::string shape = shape_name({{"N", s.N}, {"V", s.V}, {"Vp", s.Vp}, {"P", s.P}});
    struct Variant {
      bool masked;
      Rounding r;  // the logits read as an unrounded GEMM result
    };
    for (Variant vt : {Variant{false, Rounding::none}, Variant{true, Rounding::none}, Variant{true, Rounding::bf16},
                       Variant{false, Rounding::fp16}})
      t.push_back({std::string(vt.masked ? "vocab_parallel_ce_masked" : "vocab_parallel_ce") + rounding_suffix(vt.r),
                   shape, {1e-5, 1e-9}, [s, masked = vt.masked, rnd = vt.r](const OpCase& c) {
        // Tolerances as for cross_entropy_forward_backward: the row maxima are exact, the
        // sums of exponentials ~1e-7 relative, the losses ~1e-6, dlogits 1e-5 relative.
        const OpCase exact{c.op, c.shape, {0.0, 0.0}, nullptr};
        const OpCase loss_tol{c.op, c.shape, {1e-5, 1e-5}, nullptr};
        const OpCase sum_tol{c.op, c.shape, {1e-6, 0.0}, nullptr};
        const int64_t N = s.N, Vl = s.Vp / s.P;
        const auto full = rand_floats(static_cast<size_t>(N * s.Vp), 42, -8.0f, 8.0f);
        const auto targets = rand_ints(static_cast<size_t>(N), 43, 0, int32_t(s.V));
        std::vector<float> mask(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) mask[static_cast<size_t>(n)] = n % 4 == 2 ? 0.0f : 1.0f;
        const float grad_scale = 0.25f;
        const float* mask_ptr = masked ? mask.data() : nullptr;
        auto gt = upload(targets), gm = upload(mask);
        std::vector<std::vector<float>> cpu_x(static_cast<size_t>(s.P));
        std::vector<DeviceBuffer> gpu_x;
        gpu_x.reserve(static_cast<size_t>(s.P));
        std::vector<float> cpu_max(static_cast<size_t>(N), -INFINITY), gpu_max(static_cast<size_t>(N), -INFINITY);
        DeviceBuffer grow(static_cast<size_t>(N) * 4);
        for (int64_t r = 0; r < s.P; ++r) {
          const int64_t begin = r * Vl, valid = std::clamp<int64_t>(s.V - begin, 0, Vl);
          auto& x = cpu_x[static_cast<size_t>(r)];
          x.resize(static_cast<size_t>(N * Vl));
          for (int64_t n = 0; n < N; ++n)
            std::copy_n(full.data() + n * s.Vp + begin, Vl, x.data() + n * Vl);
          gpu_x.push_back(upload(x));
          std::vector<float> m(static_cast<size_t>(N));
          vocab_parallel_ce_max(m.data(), x.data(), N, valid, Vl, rnd);
          cuda::vocab_parallel_ce_max(grow.as<float>(), gpu_x.back().as<float>(), N, valid, Vl, rnd);
          const auto gm_r = download<float>(grow, static_cast<size_t>(N));
          expect_close(exact, "row_max rank " + std::to_string(r), m, gm_r);
          for (int64_t n = 0; n < N; ++n) {  // all-reduce MAX
            cpu_max[static_cast<size_t>(n)] = std::max(cpu_max[static_cast<size_t>(n)], m[static_cast<size_t>(n)]);
            gpu_max[static_cast<size_t>(n)] = std::max(gpu_max[static_cast<size_t>(n)], gm_r[static_cast<size_t>(n)]);
          }
        }
        auto gmax = upload(gpu_max);
        std::vector<double> cpu_stats(static_cast<size_t>(2 * N), 0.0), gpu_stats(static_cast<size_t>(2 * N), 0.0);
        DeviceBuffer gstats_r(static_cast<size_t>(2 * N) * 8);
        for (int64_t r = 0; r < s.P; ++r) {
          const int64_t begin = r * Vl, valid = std::clamp<int64_t>(s.V - begin, 0, Vl);
          std::vector<double> st(static_cast<size_t>(2 * N));
          // Evaluation first (no backward, store_exp false): the same sums, and the logits
          // as the CPU leaves them (rounded in place where rnd says, no exponentials).
          vocab_parallel_ce_partials(st.data(), cpu_x[static_cast<size_t>(r)].data(), cpu_max.data(), targets.data(), begin, N,
                                     valid, Vl, false, rnd);
          cuda::vocab_parallel_ce_partials(gstats_r.as<double>(), gpu_x[static_cast<size_t>(r)].as<float>(), gmax.as<float>(),
                                           gt.as<int32_t>(), begin, N, valid, Vl, false, rnd);
          expect_close(sum_tol, "evaluation stats rank " + std::to_string(r), st, download<double>(gstats_r, st.size()));
          expect_close(exact, "evaluation logits rank " + std::to_string(r), cpu_x[static_cast<size_t>(r)],
                       download<float>(gpu_x[static_cast<size_t>(r)], cpu_x[static_cast<size_t>(r)].size()));
          vocab_parallel_ce_partials(st.data(), cpu_x[static_cast<size_t>(r)].data(), cpu_max.data(), targets.data(), begin, N,
                                     valid, Vl, true, rnd);
          cuda::vocab_parallel_ce_partials(gstats_r.as<double>(), gpu_x[static_cast<size_t>(r)].as<float>(), gmax.as<float>(),
                                           gt.as<int32_t>(), begin, N, valid, Vl, true, rnd);
          const auto gst = download<double>(gstats_r, st.size());
          expect_close(sum_tol, "stats rank " + std::to_string(r), st, gst);
          // The stored exponentials: the same polynomial, a few ulp apart at most.
          expect_close(loss_tol, "exp rank " + std::to_string(r), cpu_x[static_cast<size_t>(r)],
                       download<float>(gpu_x[static_cast<size_t>(r)], cpu_x[static_cast<size_t>(r)].size()));
          for (size_t i = 0; i < st.size(); ++i) {  // all-reduce SUM
            cpu_stats[i] += st[i];
            gpu_stats[i] += gst[i];
          }
        }
        auto gstats = upload(gpu_stats);
        std::vector<float> losses(static_cast<size_t>(N));
        vocab_parallel_ce_loss(losses.data(), cpu_stats.data(), cpu_max.data(), N);
        DeviceBuffer gloss(static_cast<size_t>(N) * 4);
        cuda::vocab_parallel_ce_loss(gloss.as<float>(), gstats.as<double>(), gmax.as<float>(), N);
        expect_close(loss_tol, "losses", losses, download<float>(gloss, losses.size()));
        for (int64_t r = 0; r < s.P; ++r) {
          const int64_t begin = r * Vl, valid = std::clamp<int64_t>(s.V - begin, 0, Vl);
          vocab_parallel_ce_backward(cpu_x[static_cast<size_t>(r)].data(), cpu_stats.data(), targets.data(), mask_ptr, grad_scale,
                                     begin, N, valid, Vl);
          cuda::vocab_parallel_ce_backward(gpu_x[static_cast<size_t>(r)].as<float>(), gstats.as<double>(), gt.as<int32_t>(),
                                           masked ? gm.as<float>() : nullptr, grad_scale, begin, N, valid, Vl);
          expect_close(c, "dlogits rank " + std::to_string(r), cpu_x[static_cast<size_t>(r)],
                       download<float>(gpu_x[static_cast<size_t>(r)], cpu_x[static_cast<size_t>(r)].size()));
        }
      }});
  }
}

// The cross entropy on bf16 logits (the bf16 output layer): each side's three kernels on one
// vocabulary slice. The maxima are exact; the sums of exponentials as for the fp32 kernels;
// the bf16 dlogits within one bf16 ulp (2^-8 relative), as the GPU's exponentials and sums
// differ from the CPU's in the last fp32 bits before the rounding.
void cross_entropy_bf16_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t N, Vl, valid, begin;
  };
  for (S s : {S{37, 108, 100, 0}, S{5, 25152, 25105, 25152}, S{6, 96, 0, 96}})
    t.push_back({"vocab_parallel_ce_bf16", shape_name({{"N", s.N}, {"Vl", s.Vl}, {"valid", s.valid}, {"begin", s.begin}}),
                 {1.0 / 128, 1e-12}, [s](const OpCase& c) {
      const OpCase exact{c.op, c.shape, {0.0, 0.0}, nullptr};
      const OpCase sum_tol{c.op, c.shape, {1e-6, 0.0}, nullptr};
      const size_t n = size_t(s.N * s.Vl);
      const auto f = rand_floats(n, 44, -8.0f, 8.0f);
      std::vector<uint16_t> x(n);
      cast_fp32_to_bf16(x.data(), f.data(), int64_t(n));
      auto targets = rand_ints(size_t(s.N), 45, int32_t(s.begin), int32_t(s.begin + std::max<int64_t>(s.valid, 1)));
      targets[0] = int32_t(s.begin + s.Vl + 3);  // another slice's
      std::vector<float> mask(size_t(s.N), 1.0f);
      mask[1 % s.N] = 0.0f;
      auto gx = upload(x), gt = upload(targets), gm = upload(mask);
      std::vector<float> m(size_t(s.N));
      vocab_parallel_ce_max_bf16(m.data(), x.data(), s.N, s.valid, s.Vl);
      DeviceBuffer gmax(size_t(s.N) * 4), gstats(size_t(2 * s.N) * 8);
      cuda::vocab_parallel_ce_max_bf16(gmax.as<float>(), gx.as<uint16_t>(), s.N, s.valid, s.Vl);
      expect_close(exact, "row_max", m, download<float>(gmax, m.size()));
      std::vector<double> st(size_t(2 * s.N));
      vocab_parallel_ce_partials_bf16(st.data(), x.data(), m.data(), targets.data(), s.begin, s.N, s.valid, s.Vl);
      cuda::vocab_parallel_ce_partials_bf16(gstats.as<double>(), gx.as<uint16_t>(), gmax.as<float>(), gt.as<int32_t>(),
                                            s.begin, s.N, s.valid, s.Vl);
      expect_close(sum_tol, "stats", st, download<double>(gstats, st.size()));
      if (s.valid == 0) return;  // (no sum to divide by)
      vocab_parallel_ce_backward_bf16(x.data(), m.data(), st.data(), targets.data(), mask.data(), 0.5f, s.begin, s.N,
                                      s.valid, s.Vl);
      cuda::vocab_parallel_ce_backward_bf16(gx.as<uint16_t>(), gmax.as<float>(), gstats.as<double>(), gt.as<int32_t>(),
                                            gm.as<float>(), 0.5f, s.begin, s.N, s.valid, s.Vl);
      std::vector<float> d(n), gd(n);
      cast_bf16_to_fp32(d.data(), x.data(), int64_t(n));
      const auto g16 = download<uint16_t>(gx, n);
      cast_bf16_to_fp32(gd.data(), g16.data(), int64_t(n));
      expect_close(c, "dlogits", d, gd);
    }});
  // The whole vocabulary on one rank: the fused pass against the GPU's four kernels, bit for
  // bit (also without the backward, as in evaluation), and against the CPU as above.
  for (S s : {S{37, 108, 100, 0}, S{5, 50304, 50257, 0}, S{3, 96, 1, 0}})
    for (bool backward : {true, false})
      t.push_back({std::string("vocab_parallel_ce_fused_bf16") + (backward ? "" : "_forward"),
                   shape_name({{"N", s.N}, {"Vl", s.Vl}, {"valid", s.valid}}), {1.0 / 128, 1e-12},
                   [s, backward](const OpCase& c) {
        const OpCase sum_tol{c.op, c.shape, {1e-6, 0.0}, nullptr};
        const OpCase loss_tol{c.op, c.shape, {1e-6, 1e-6}, nullptr};
        const size_t n = size_t(s.N * s.Vl);
        std::vector<uint16_t> x(n);
        cast_fp32_to_bf16(x.data(), rand_floats(n, 46, -8.0f, 8.0f).data(), int64_t(n));
        auto targets = rand_ints(size_t(s.N), 47, 0, int32_t(s.valid));
        targets[0] = int32_t(s.Vl + 3);  // outside the vocabulary: no target logit
        std::vector<float> mask(size_t(s.N), 1.0f);
        mask[1 % s.N] = 0.0f;
        const size_t N = size_t(s.N);
        // The CPU.
        std::vector<float> m(N), loss(N);
        std::vector<double> st(2 * N);
        std::vector<uint16_t> cx = x;
        vocab_parallel_ce_fused_bf16(loss.data(), cx.data(), m.data(), st.data(), targets.data(), backward, mask.data(),
                                     0.5f, s.N, s.valid, s.Vl);
        // The GPU, fused and as the four kernels.
        auto gx = upload(x), rx = upload(x), gt = upload(targets), gm = upload(mask);
        DeviceBuffer gmax(N * 4), gstats(2 * N * 8), gloss(N * 4), rmax(N * 4), rstats(2 * N * 8), rloss(N * 4);
        cuda::vocab_parallel_ce_fused_bf16(gloss.as<float>(), gx.as<uint16_t>(), gmax.as<float>(), gstats.as<double>(),
                                           gt.as<int32_t>(), backward, gm.as<float>(), 0.5f, s.N, s.valid, s.Vl);
        cuda::vocab_parallel_ce_max_bf16(rmax.as<float>(), rx.as<uint16_t>(), s.N, s.valid, s.Vl);
        cuda::vocab_parallel_ce_partials_bf16(rstats.as<double>(), rx.as<uint16_t>(), rmax.as<float>(),
                                              gt.as<int32_t>(), 0, s.N, s.valid, s.Vl);
        cuda::vocab_parallel_ce_loss(rloss.as<float>(), rstats.as<double>(), rmax.as<float>(), s.N);
        if (backward)
          cuda::vocab_parallel_ce_backward_bf16(rx.as<uint16_t>(), rmax.as<float>(), rstats.as<double>(),
                                                gt.as<int32_t>(), gm.as<float>(), 0.5f, 0, s.N, s.valid, s.Vl);
        const auto got_max = download<float>(gmax, N), got_loss = download<float>(gloss, N);
        const auto got_stats = download<double>(gstats, 2 * N);
        const auto got_x = download<uint16_t>(gx, n);
        expect_bits(c, "row_max (against the four kernels)", download<float>(rmax, N), got_max);
        expect_bits(c, "losses (against the four kernels)", download<float>(rloss, N), got_loss);
        const auto want_stats = download<double>(rstats, 2 * N);
        EXPECT_EQ(0, std::memcmp(want_stats.data(), got_stats.data(), 2 * N * 8))
            << c.op << " " << c.shape << ": stats against the four kernels";
        EXPECT_EQ(download<uint16_t>(rx, n), got_x) << c.op << " " << c.shape << ": dlogits against the four kernels";
        expect_bits(c, "row_max", m, got_max);
        expect_close(sum_tol, "stats", st, got_stats);
        expect_close(loss_tol, "losses", loss, got_loss);
        if (!backward) {
          EXPECT_EQ(x, got_x) << c.op << " " << c.shape << ": the forward wrote the logits";
          return;
        }
        std::vector<float> d(n), gd(n);
        cast_bf16_to_fp32(d.data(), cx.data(), int64_t(n));
        cast_bf16_to_fp32(gd.data(), got_x.data(), int64_t(n));
        expect_close(c, "dlogits", d, gd);
      }});
}

// ---------------------------------------------------------------- optimizer

void optimizer_cases(std::vector<OpCase>& t) {
  struct A {
    float beta1;
    int64_t step;
  };
  // The same per-element step and the same float scalars (kernels/optimizer_math.h); only
  // FMA contraction differs: ~1 ulp of p, m, v.
  for (A a : {A{0.9f, 1}, A{0.9f, 7}, A{0.3f, 3}}) {  // beta1 0.3: the other lerp form
    t.push_back({"adamw_update", shape_name({{"n", 100003}, {"beta1_pct", int64_t(a.beta1 * 100)}, {"step", a.step}}),
                 {2e-6, 1e-12}, [a](const OpCase& c) {
      const int64_t n = 100003;
      auto p = rand_floats(static_cast<size_t>(n), 44), m = rand_floats(static_cast<size_t>(n), 45, -0.1f, 0.1f);
      auto v = rand_floats(static_cast<size_t>(n), 46, 0.0f, 0.01f);
      const auto g = rand_floats(static_cast<size_t>(n), 47);
      auto gp = upload(p), gm = upload(m), gv = upload(v), gg = upload(g);
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, a.beta1, 0.95f, 1e-8f, 0.1f, a.step);
      cuda::adamw_update(gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(), n, 1e-3f, a.beta1, 0.95f,
                         1e-8f, 0.1f, a.step);
      expect_close(c, "p", p, download<float>(gp, p.size()));
      expect_close(c, "m", m, download<float>(gm, m.size()));
      expect_close(c, "v", v, download<float>(gv, v.size()));
    }});
  }
  // Several ranges of one buffer in one launch: ranges smaller than a block's chunk, larger,
  // empty, out of order, with gaps and their own learning rates and weight decays; state at
  // other offsets. On the GPU the bits of adamw_update range by range; near the CPU's.
  t.push_back({"adamw_update_ranges", "n20000_ranges6", {2e-6, 1e-12}, [](const OpCase& c) {
    const int64_t n = 20000;
    const std::vector<AdamwRange> ranges = {{5000, 7001, 0, 1e-3f, 0.1f},   {0, 3, 7001, 2e-3f, 0.0f},
                                            {3, 0, 7004, 1e-3f, 0.1f},      {12001, 1024, 7004, 5e-4f, 0.0f},
                                            {13025, 1, 8028, 1e-3f, 0.2f},  {17000, 2999, 8029, 3e-3f, 0.05f}};
    const int64_t states = 8029 + 2999;
    auto p = rand_floats(static_cast<size_t>(n), 48), g = rand_floats(static_cast<size_t>(n), 49);
    auto m = rand_floats(static_cast<size_t>(states), 50, -0.1f, 0.1f);
    auto v = rand_floats(static_cast<size_t>(states), 51, 0.0f, 0.01f);
    auto gp = upload(p), gm = upload(m), gv = upload(v), gg = upload(g);
    auto rp = upload(p), rm = upload(m), rv = upload(v);
    adamw_update_ranges(p.data(), g.data(), m.data(), v.data(), ranges.data(), int64_t(ranges.size()), 0.9f, 0.95f,
                        1e-8f, 4, 0.5f);
    cuda::adamw_update_ranges(gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(), ranges.data(),
                              int64_t(ranges.size()), 0.9f, 0.95f, 1e-8f, 4, 0.5f);
    for (const AdamwRange& r : ranges)
      cuda::adamw_update(rp.as<float>() + r.begin, gg.as<float>() + r.begin, rm.as<float>() + r.state_offset,
                         rv.as<float>() + r.state_offset, r.n, r.lr, 0.9f, 0.95f, 1e-8f, r.weight_decay, 4, 0.5f);
    const auto got_p = download<float>(gp, p.size()), got_m = download<float>(gm, m.size());
    const auto got_v = download<float>(gv, v.size());
    expect_bits(c, "p (against range by range)", download<float>(rp, p.size()), got_p);
    expect_bits(c, "m (against range by range)", download<float>(rm, m.size()), got_m);
    expect_bits(c, "v (against range by range)", download<float>(rv, v.size()), got_v);
    expect_close(c, "p", p, got_p);
    expect_close(c, "m", m, got_m);
    expect_close(c, "v", v, got_v);
  }});
  // bf16 moments (--exp-avg-dtype/--exp-avg-sq-dtype bf16): the parameters near the GPU's fp32
  // kernel's (the same step; the compiler may contract it otherwise) and the CPU's, the moments
  // that kernel's rounded to bf16, within one bf16 ulp (a last-bit difference of the fp32 moment
  // can cross a rounding boundary).
  t.push_back({"adamw_update_ranges_bf16_moments", "n20000_ranges3", {2e-6, 1e-12}, [](const OpCase& c) {
    const int64_t n = 20000;
    const std::vector<AdamwRange> ranges = {{0, 9000, 0, 1e-3f, 0.1f}, {9000, 5, 9000, 2e-3f, 0.0f},
                                            {12000, 8000, 9005, 5e-4f, 0.05f}};
    const int64_t states = 9005 + 8000;
    auto p = rand_floats(static_cast<size_t>(n), 60), g = rand_floats(static_cast<size_t>(n), 61);
    std::vector<float> m32 = rand_floats(static_cast<size_t>(states), 62, -0.1f, 0.1f);
    std::vector<float> v32 = rand_floats(static_cast<size_t>(states), 63, 0.0f, 0.01f);
    std::vector<uint16_t> m16(m32.size()), v16(v32.size());
    for (size_t i = 0; i < m32.size(); ++i) {  // moments that bf16 holds exactly, so both paths start alike
      m16[i] = math::fp32_to_bf16(m32[i]), m32[i] = math::bf16_to_fp32(m16[i]);
      v16[i] = math::fp32_to_bf16(v32[i]), v32[i] = math::bf16_to_fp32(v16[i]);
    }
    std::vector<float> cpu_p = p;
    std::vector<uint16_t> cpu_m = m16, cpu_v = v16;
    adamw_update_ranges(cpu_p.data(), g.data(), AdamwMoments{cpu_m.data(), cpu_v.data(), true, true}, ranges.data(),
                        int64_t(ranges.size()), 0.9f, 0.95f, 1e-8f, 3, 0.5f);
    auto gp = upload(p), gg = upload(g), gm = upload(m16), gv = upload(v16);
    auto rp = upload(p), rm = upload(m32), rv = upload(v32);
    cuda::adamw_update_ranges(gp.as<float>(), gg.as<float>(), AdamwMoments{gm.data(), gv.data(), true, true},
                              ranges.data(), int64_t(ranges.size()), 0.9f, 0.95f, 1e-8f, 3, 0.5f);
    cuda::adamw_update_ranges(rp.as<float>(), gg.as<float>(), rm.as<float>(), rv.as<float>(), ranges.data(),
                              int64_t(ranges.size()), 0.9f, 0.95f, 1e-8f, 3, 0.5f);
    const auto got_p = download<float>(gp, p.size());
    expect_close(c, "p (against the fp32 moments)", download<float>(rp, p.size()), got_p);
    const auto want_m = download<float>(rm, m32.size()), want_v = download<float>(rv, v32.size());
    const auto got_m = download<uint16_t>(gm, m16.size()), got_v = download<uint16_t>(gv, v16.size());
    std::vector<float> wm(want_m.size()), gm32(want_m.size()), wv(want_v.size()), gv32(want_v.size());
    for (size_t i = 0; i < wm.size(); ++i) {
      wm[i] = math::round_bf16(want_m[i]), gm32[i] = math::bf16_to_fp32(got_m[i]);
      wv[i] = math::round_bf16(want_v[i]), gv32[i] = math::bf16_to_fp32(got_v[i]);
    }
    for (size_t i = 0; i < wm.size(); ++i) {
      ASSERT_LE(std::fabs(gm32[i] - wm[i]), std::ldexp(std::fabs(wm[i]), -7)) << c.op << ": m[" << i << "]";
      ASSERT_LE(std::fabs(gv32[i] - wv[i]), std::ldexp(std::fabs(wv[i]), -7)) << c.op << ": v[" << i << "]";
    }
    expect_close(c, "p", cpu_p, got_p);
  }});
  // Gradient clipping's coefficient applied as the update reads g: near the CPU's, and on the
  // GPU the bits of scale_inplace followed by the unscaled update, with g unchanged.
  t.push_back({"adamw_update_grad_scale", "n100003", {2e-6, 1e-12}, [](const OpCase& c) {
    const int64_t n = 100003;
    const float scale = 0.3719f;
    auto p = rand_floats(static_cast<size_t>(n), 44), m = rand_floats(static_cast<size_t>(n), 45, -0.1f, 0.1f);
    auto v = rand_floats(static_cast<size_t>(n), 46, 0.0f, 0.01f);
    const auto g = rand_floats(static_cast<size_t>(n), 47);
    auto gp = upload(p), gm = upload(m), gv = upload(v), gg = upload(g);
    auto gp2 = upload(p), gm2 = upload(m), gv2 = upload(v), gg2 = upload(g);
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, scale);
    cuda::adamw_update(gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                       0.1f, 3, scale);
    expect_close(c, "p", p, download<float>(gp, p.size()));
    expect_close(c, "m", m, download<float>(gm, m.size()));
    expect_close(c, "v", v, download<float>(gv, v.size()));
    expect_bits(c, "g (unchanged)", g, download<float>(gg, g.size()));
    cuda::scale_inplace(gg2.as<float>(), scale, n);
    cuda::adamw_update(gp2.as<float>(), gg2.as<float>(), gm2.as<float>(), gv2.as<float>(), n, 1e-3f, 0.9f, 0.95f,
                       1e-8f, 0.1f, 3);
    expect_bits(c, "p (against scale_inplace)", download<float>(gp2, p.size()), download<float>(gp, p.size()));
    expect_bits(c, "m (against scale_inplace)", download<float>(gm2, m.size()), download<float>(gm, m.size()));
    expect_bits(c, "v (against scale_inplace)", download<float>(gv2, v.size()), download<float>(gv, v.size()));
  }});
  struct S {
    const char* name;
    float momentum;
    bool first;
  };
  for (S s : {S{"sgd_update_no_momentum", 0.0f, false}, S{"sgd_update_momentum_first_step", 0.9f, true},
              S{"sgd_update_momentum", 0.9f, false}})
    t.push_back({s.name, "n37", {2e-6, 1e-12}, [s](const OpCase& c) {
      const int64_t n = 37;
      auto p = rand_floats(static_cast<size_t>(n), 48), buf = rand_floats(static_cast<size_t>(n), 49);
      const auto g = rand_floats(static_cast<size_t>(n), 50);
      auto gp = upload(p), gbuf = upload(buf), gg = upload(g);
      const bool has_buf = s.momentum != 0.0f;
      sgd_update(p.data(), g.data(), has_buf ? buf.data() : nullptr, n, 0.01f, s.momentum, 0.1f, s.first);
      cuda::sgd_update(gp.as<float>(), gg.as<float>(), has_buf ? gbuf.as<float>() : nullptr, n, 0.01f, s.momentum,
                       0.1f, s.first);
      expect_close(c, "p", p, download<float>(gp, p.size()));
      expect_close(c, "momentum_buf", buf, download<float>(gbuf, buf.size()));
    }});
  // Double sums of float squares in another order: ~1e-15 relative.
  for (int64_t n : {int64_t(37), int64_t(1000003)})
    t.push_back({"sum_of_squares", shape_name({{"n", n}}), {1e-12, 0.0}, [n](const OpCase& c) {
      const auto x = rand_floats(static_cast<size_t>(n), 51, -3.0f, 3.0f);
      auto gx = upload(x);
      const double cpu = sum_of_squares(x.data(), n);
      const double gpu = cuda::sum_of_squares(gx.as<float>(), n);
      expect_close(c, "sum", std::vector<double>{cpu}, std::vector<double>{gpu});
      const double again = cuda::sum_of_squares(gx.as<float>(), n);
      EXPECT_EQ(gpu, again) << c.op << " " << c.shape << ": not deterministic";
    }});
  // A count: exact. Zeros of both signs, scattered, plus a run at the end.
  for (int64_t n : {int64_t(37), int64_t(1000003)})
    t.push_back({"count_zeros", shape_name({{"n", n}}), {0.0, 0.0}, [n](const OpCase& c) {
      auto x = rand_floats(static_cast<size_t>(n), 59, -3.0f, 3.0f);
      int64_t want = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (i % 7 == 3 || i >= n - 5) x[static_cast<size_t>(i)] = (i % 2) ? -0.0f : 0.0f;
        want += x[static_cast<size_t>(i)] == 0.0f;
      }
      auto gx = upload(x);
      EXPECT_EQ(count_zeros(x.data(), n), want) << c.op << " " << c.shape << ": CPU kernel";
      EXPECT_EQ(cuda::count_zeros(gx.as<float>(), n), want) << c.op << " " << c.shape;
    }});
  // A yes/no answer: exact. The bad element sits in the middle and at the last index.
  for (int64_t n : {int64_t(37), int64_t(1000003)})
    for (const char* special : {"finite", "inf", "nan", "last_inf"})
      t.push_back({std::string("any_non_finite_") + special, shape_name({{"n", n}}), {0.0, 0.0},
                   [n, special](const OpCase& c) {
        auto x = rand_floats(static_cast<size_t>(n), 58, -3.0f, 3.0f);
        const std::string sp = special;
        if (sp == "inf") x[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
        if (sp == "nan") x[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
        if (sp == "last_inf") x[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::infinity();
        auto gx = upload(x);
        const bool cpu = any_non_finite(x.data(), n), gpu = cuda::any_non_finite(gx.as<float>(), n);
        EXPECT_EQ(cpu, sp != "finite") << c.op << " " << c.shape << ": CPU kernel";
        EXPECT_EQ(gpu, cpu) << c.op << " " << c.shape << ": cpu " << cpu << " gpu " << gpu;
      }});
}

// ---------------------------------------------------------------- cast

void cast_cases(std::vector<OpCase>& t) {
  // Bit manipulation with the shared functions (kernels/cast_math.h): the same bits.
  for (int64_t n : {int64_t(37), int64_t(100003)}) {
    const std::string shape = shape_name({{"n", n}});
    t.push_back({"cast_fp32_to_bf16", shape, {0.0, 0.0}, [n](const OpCase& c) {
      const auto in = cast_inputs(static_cast<size_t>(n), 52);
      std::vector<uint16_t> out(in.size());
      cast_fp32_to_bf16(out.data(), in.data(), n);
      auto gin = upload(in);
      DeviceBuffer gout(out.size() * 2);
      cuda::cast_fp32_to_bf16(gout.as<uint16_t>(), gin.as<float>(), n);
      const auto got = download<uint16_t>(gout, out.size());
      size_t bad = 0;
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i] != got[i] && bad++ < 5)
          ADD_FAILURE() << c.op << " " << c.shape << ": [" << i << "] in " << in[i] << " cpu 0x" << std::hex
                        << out[i] << " gpu 0x" << got[i];
      EXPECT_EQ(bad, 0u) << c.op << " " << c.shape << ": bf16 bits differ";
    }});
    t.push_back({"cast_bf16_to_fp32", shape, {0.0, 0.0}, [n](const OpCase& c) {
      std::vector<uint16_t> in(static_cast<size_t>(n));
      std::mt19937 gen(53);
      for (auto& h : in) h = uint16_t(gen());
      std::vector<float> out(in.size());
      cast_bf16_to_fp32(out.data(), in.data(), n);
      auto gin = upload(in);
      DeviceBuffer gout(out.size() * 4);
      cuda::cast_bf16_to_fp32(gout.as<float>(), gin.as<uint16_t>(), n);
      expect_bits(c, "out", out, download<float>(gout, out.size()));
    }});
    t.push_back({"round_to_bf16", shape, {0.0, 0.0}, [n](const OpCase& c) {
      const auto in = cast_inputs(static_cast<size_t>(n), 54);
      std::vector<float> out(in.size());
      round_to_bf16(out.data(), in.data(), n);
      auto gin = upload(in);
      DeviceBuffer gout(out.size() * 4);
      cuda::round_to_bf16(gout.as<float>(), gin.as<float>(), n);
      expect_bits(c, "out", out, download<float>(gout, out.size()));
      cuda::round_to_bf16(gin.as<float>(), gin.as<float>(), n);  // in place
      expect_bits(c, "out (in place)", out, download<float>(gin, out.size()));
    }});
    t.push_back({"round_to_fp16", shape, {0.0, 0.0}, [n](const OpCase& c) {
      const auto in = cast_inputs(static_cast<size_t>(n), 55);
      std::vector<float> out(in.size());
      round_to_fp16(out.data(), in.data(), n);
      auto gin = upload(in);
      DeviceBuffer gout(out.size() * 4);
      cuda::round_to_fp16(gout.as<float>(), gin.as<float>(), n);
      expect_bits(c, "out", out, download<float>(gout, out.size()));
    }});
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (float scale : {1.0f, 0.37f})
        t.push_back({std::string("quantize_fp8_to_bf16_") + (f == Fp8Format::e4m3 ? "e4m3" : "e5m2"),
                     shape + "_scale_pct" + std::to_string(int(scale * 100)), {0.0, 0.0}, [n, f, scale](const OpCase& c) {
          const auto in = cast_inputs(static_cast<size_t>(n), 56);
          auto gin = upload(in);
          std::vector<uint16_t> packed(in.size());
          quantize_fp8_to_bf16(packed.data(), in.data(), n, scale, f);
          DeviceBuffer gpacked(packed.size() * 2);
          cuda::quantize_fp8_to_bf16(gpacked.as<uint16_t>(), gin.as<float>(), n, scale, f);
          EXPECT_EQ(packed, download<uint16_t>(gpacked, packed.size())) << "quantize_fp8_to_bf16 " << c.shape;
        }});
    // Block-scaled fp8 (--fp8-recipe blockwise / mxfp8): every block shape the recipes use, on a
    // [rows, cols] view of the input with partial last blocks, and a NaN in one block.
    for (Fp8Blocks b : {Fp8Blocks{1, 32, Fp8BlockScale::e8m0}, Fp8Blocks{32, 1, Fp8BlockScale::e8m0},
                        Fp8Blocks{1, 128, Fp8BlockScale::pow2}, Fp8Blocks{128, 1, Fp8BlockScale::pow2},
                        Fp8Blocks{128, 128, Fp8BlockScale::pow2}})
      t.push_back({"quantize_fp8_blocks", shape + "_blocks" + std::to_string(b.rows) + "x" + std::to_string(b.cols),
                   {0.0, 0.0}, [n, b](const OpCase& c) {
        const int64_t cols = n >= 300 ? 150 : 7, rows = n / cols;
        auto in = rand_floats(static_cast<size_t>(rows * cols), 58, -5.0f, 3.0f);
        for (size_t i = 0; i < in.size(); i += 37) in[i] *= 1e-5f;  // blocks of other magnitudes
        in[in.size() / 2] = std::numeric_limits<float>::quiet_NaN();
        for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
          std::vector<uint16_t> out(in.size());
          quantize_fp8_blocks(out.data(), in.data(), rows, cols, b, f);
          auto gin = upload(in);
          DeviceBuffer gout(out.size() * 2);
          cuda::quantize_fp8_blocks(gout.as<uint16_t>(), gin.as<float>(), rows, cols, b, f);
          EXPECT_EQ(out, download<uint16_t>(gout, out.size())) << c.shape << " " << (f == Fp8Format::e4m3 ? "e4m3" : "e5m2");
        }
      }});
    for (const char* special : {"finite", "inf", "nan"})
      t.push_back({std::string("abs_max_") + special, shape, {0.0, 0.0}, [n, special](const OpCase& c) {
        auto in = rand_floats(static_cast<size_t>(n), 57, -5.0f, 3.0f);
        if (std::string(special) == "inf") in[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
        if (std::string(special) == "nan") in[static_cast<size_t>(n - 1)] = std::numeric_limits<float>::quiet_NaN();
        auto gin = upload(in);
        const float cpu = abs_max(in.data(), n), gpu = cuda::abs_max(gin.as<float>(), n);
        expect_bits(c, "max", std::vector<float>{cpu}, std::vector<float>{gpu});
      }});
  }
}

// KV-cache decoding: append the new tokens' keys and values (a copy: bit-identical), then their
// cached attention. The GPU sums each dot product and the output over the keys in the same
// order as the CPU but exponentiates with expf (CPU: std::exp) and may contract to FMA:
// ~1e-6 relative. G < H: grouped-query attention, a cache row per group.
void decode_attention_cases(std::vector<OpCase>& t) {
  // The last: 13002 scores (52 KB) exceed the 48 KiB of shared memory a launch gets by default.
  // Then sliding windows (--window-size), each query's keys past + r - W .. past + r, and attention
  // sinks (sink 1: --softmax-type's per-head logits in the softmax).
  for (auto [n, past, H, G, D, W, sink] : std::vector<std::array<int64_t, 7>>{{1, 0, 2, 2, 16, -1, 0},
                                                                             {1, 37, 3, 3, 64, -1, 0},
                                                                             {5, 20, 2, 2, 40, -1, 0},
                                                                             {2, 13000, 1, 1, 8, -1, 0},
                                                                             {3, 30, 8, 2, 64, -1, 0},
                                                                             {1, 9, 4, 1, 32, -1, 0},
                                                                             {1, 37, 3, 3, 64, 10, 0},
                                                                             {5, 20, 4, 2, 32, 0, 0},
                                                                             {2, 13000, 1, 1, 8, 4096, 0},
                                                                             {3, 30, 8, 2, 64, -1, 1},
                                                                             {2, 40, 4, 2, 32, 7, 1}}) {
    const int64_t Tmax = past + n + 3;
    const QkvLayout L{H, G, D};
    const std::string shape = shape_name({{"n", n}, {"past", past}, {"H", H}, {"G", G}, {"D", D}}) +
                              (W >= 0 ? "_W" + std::to_string(W) : "") + (sink ? "_sink" : "");
    t.push_back({"decode_attention", shape, {1e-5, 1e-6},
                 [=](const OpCase& c) {
      const auto qkv = rand_floats(static_cast<size_t>(n * L.width()), 71);
      auto kc = rand_floats(static_cast<size_t>(G * Tmax * D), 72), vc = rand_floats(kc.size(), 73);
      auto gq = upload(qkv), gk = upload(kc), gv = upload(vc);
      kv_cache_append(kc.data(), vc.data(), qkv.data(), n, past, L, Tmax);
      cuda::kv_cache_append(gk.as<float>(), gv.as<float>(), gq.as<float>(), n, past, L, Tmax);
      expect_bits(c, "k_cache", kc, download<float>(gk, kc.size()));
      expect_bits(c, "v_cache", vc, download<float>(gv, vc.size()));
      std::vector<float> out(static_cast<size_t>(n * H * D));
      const auto offsets = rand_floats(static_cast<size_t>(H), 74);
      auto g_offsets = upload(offsets);
      cached_attention_forward(out.data(), qkv.data(), kc.data(), vc.data(), n, past, L, Tmax, W,
                               sink ? offsets.data() : nullptr);
      DeviceBuffer gout(out.size() * 4);
      cuda::cached_attention_forward(gout.as<float>(), gq.as<float>(), gk.as<float>(), gv.as<float>(), n, past, L,
                                     Tmax, W, sink ? g_offsets.as<float>() : nullptr);
      expect_close(c, "out", out, download<float>(gout, out.size()));
    }});
  }
}

// ---------------------------------------------------------------- rotary embedding

// The table made on the host (the CPU's), then uploaded for the GPU: both rotate with the same
// cos and sin. Each pair's rotation is two products and a sum; nvcc and the host compiler may
// contract them into fused multiply-adds differently: a few ulp of the larger term.
// The MoE gather and combines: the same bits (one thread per output element, the same order of
// the k terms); the probability gradients are dot products of C terms summed in another order
// (a shuffle tree against the CPU's loop): within 1e-7 C absolute (|terms| <= 1).
void moe_cases(std::vector<OpCase>& t) {
  for (auto [N, k, C] : {std::array<int64_t, 3>{37, 2, 96}, std::array<int64_t, 3>{5, 3, 1000}}) {
    t.push_back({"moe_gather_combine", shape_name({{"N", N}, {"k", k}, {"C", C}}), {1e-5, 1e-7 * double(C)}, [N, k, C](const OpCase& c) {
      const int64_t S = N * k;
      std::vector<int32_t> slot_of(static_cast<size_t>(S)), rows(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) {
        const int32_t s = int32_t(i * 7 % S);  // 7 is prime to S here: a permutation
        slot_of[size_t(i)] = s;
        rows[size_t(s)] = int32_t(i / k);
      }
      for (int64_t i = 3; i < S; i += 5) slot_of[size_t(i)] = -1;  // dropped pairs (a capacity)
      const auto x = rand_floats(size_t(N * C), 91), ye = rand_floats(size_t(S * C), 92);
      const auto w = rand_floats(size_t(S), 93), dout = rand_floats(size_t(N * C), 94);
      std::vector<float> xe(static_cast<size_t>(S * C)), out(static_cast<size_t>(N * C)), d_ye(static_cast<size_t>(S * C)),
          d_w(static_cast<size_t>(S));
      moe_gather_rows(xe.data(), x.data(), rows.data(), S, C);
      moe_combine(out.data(), ye.data(), slot_of.data(), w.data(), N, k, C, false);
      moe_combine_backward(d_ye.data(), d_w.data(), dout.data(), ye.data(), w.data(), rows.data(), S, C);
      auto gx = upload(x), gye = upload(ye), gw = upload(w), gd = upload(dout), grows = upload(rows), gslot = upload(slot_of);
      DeviceBuffer gxe(xe.size() * 4), gout(out.size() * 4), gdye(d_ye.size() * 4), gdw(d_w.size() * 4);
      cuda::moe_gather_rows(gxe.as<float>(), gx.as<float>(), grows.as<int32_t>(), S, C);
      cuda::moe_combine(gout.as<float>(), gye.as<float>(), gslot.as<int32_t>(), gw.as<float>(), N, k, C, false);
      cuda::moe_combine_backward(gdye.as<float>(), gdw.as<float>(), gd.as<float>(), gye.as<float>(), gw.as<float>(),
                                 grows.as<int32_t>(), S, C);
      expect_bits(c, "xe", xe, download<float>(gxe, xe.size()));
      expect_bits(c, "out", out, download<float>(gout, out.size()));
      expect_bits(c, "d_ye", d_ye, download<float>(gdye, d_ye.size()));
      expect_close(c, "d_w", d_w, download<float>(gdw, d_w.size()));
    }});
  }
}

void rope_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t N, T, pos0, H, D;
    double percent;
    bool interleaved;
    int64_t G = 0;  // query groups (0: H)
    bool gated = false;  // the attention output gates among the slots (QkvLayout::gated)
  };
  for (S s : {S{64, 32, 0, 12, 64, 1.0, false}, S{21, 7, 0, 3, 80, 0.5, true}, S{5, 5, 40, 2, 16, 1.0, false},
              S{32, 16, 0, 8, 64, 1.0, false, 2}, S{6, 6, 20, 4, 32, 0.5, true, 1}, S{16, 8, 0, 8, 64, 1.0, false, 2, true},
              S{12, 6, 0, 3, 32, 0.5, true, 0, true}}) {
    const QkvLayout L{s.H, s.G > 0 ? s.G : s.H, s.D, s.gated};
    const std::string shape = shape_name({{"N", s.N}, {"T", s.T}, {"pos0", s.pos0}, {"H", s.H}, {"G", L.G}, {"D", s.D}}) +
                              (s.percent < 1.0 ? "_partial" : "") + (s.interleaved ? "_interleaved" : "") +
                              (s.gated ? "_gated" : "");
    t.push_back({"rope_forward_backward", shape, {1e-6, 1e-7}, [s, L](const OpCase& c) {
      TransformerConfig cfg;
      cfg.num_layers = 1;
      cfg.num_attention_heads = s.H;
      cfg.hidden_size = s.H * s.D;
      cfg.vocab_size = 64;
      cfg.max_position_embeddings = s.pos0 + s.T;
      cfg.position_embedding_type = "rope";
      cfg.rotary_percent = s.percent;
      cfg.rotary_interleaved = s.interleaved;
      cfg.finalize();
      const RotaryEmbedding host(cfg, cfg.max_position_embeddings);
      const RopeTable& ht = host.table();
      const size_t entries = size_t(ht.positions * ht.half);
      auto gcos = upload(std::vector<float>(ht.cos, ht.cos + entries));
      auto gsin = upload(std::vector<float>(ht.sin, ht.sin + entries));
      RopeTable gt = ht;
      gt.cos = gcos.as<float>();
      gt.sin = gsin.as<float>();
      auto x = rand_floats(static_cast<size_t>(s.N * L.width()), 81);
      auto gx = upload(x);
      rope_forward(x.data(), ht, s.N, s.T, s.pos0, L);
      cuda::rope_forward(gx.as<float>(), gt, s.N, s.T, s.pos0, L);
      expect_close(c, "qkv", x, download<float>(gx, x.size()));
      if (s.pos0 != 0) return;  // the backward serves training: positions from 0
      auto g = rand_floats(x.size(), 82);
      auto gg = upload(g);
      rope_backward(g.data(), ht, s.N, s.T, L);
      cuda::rope_backward(gg.as<float>(), gt, s.N, s.T, L);
      expect_close(c, "dqkv", g, download<float>(gg, g.size()));
    }});
  }
}

// The attention output gate (kernels/attention_gate.h): forward and backward, grouped and not, the
// backward's other qkv slots left as they were (the same random values on both devices).
void attention_gate_cases(std::vector<OpCase>& t) {
  struct S {
    int64_t N, H, G, D;
  };
  for (S s : {S{48, 4, 4, 64}, S{33, 8, 2, 128}, S{7, 3, 1, 24}}) {
    const QkvLayout L{s.H, s.G, s.D, true};
    t.push_back({"attention_output_gate", shape_name({{"N", s.N}, {"H", s.H}, {"G", s.G}, {"D", s.D}}), {1e-6, 1e-7},
                 [s, L](const OpCase& c) {
                   const size_t n_out = size_t(s.N * s.H * s.D), n_qkv = size_t(s.N * L.width());
                   const auto o = rand_floats(n_out, 91), qkv = rand_floats(n_qkv, 92), dy = rand_floats(n_out, 93);
                   auto dqkv = rand_floats(n_qkv, 94);
                   auto go = upload(o), gqkv = upload(qkv), gdy = upload(dy), gdqkv = upload(dqkv);
                   std::vector<float> y(n_out), d_o(n_out);
                   DeviceBuffer gyb(n_out * 4), gdo(n_out * 4);
                   attention_output_gate_forward(y.data(), o.data(), qkv.data(), s.N, L);
                   cuda::attention_output_gate_forward(gyb.as<float>(), go.as<float>(), gqkv.as<float>(), s.N, L);
                   expect_close(c, "y", y, download<float>(gyb, n_out));
                   attention_output_gate_backward(d_o.data(), dqkv.data(), dy.data(), o.data(), qkv.data(), s.N, L);
                   cuda::attention_output_gate_backward(gdo.as<float>(), gdqkv.as<float>(), gdy.as<float>(),
                                                        go.as<float>(), gqkv.as<float>(), s.N, L);
                   expect_close(c, "d_o", d_o, download<float>(gdo, n_out));
                   expect_close(c, "dqkv", dqkv, download<float>(gdqkv, n_qkv));
                 }});
  }
}

// Gated DeltaNet (kernels/gated_delta_net.h): the forward chain (convolution, gates, the delta rule with
// checkpoints) and the backward chain as the model runs them, every output of each kernel compared; three
// chunks of the sequence (the last one short), more columns and rows than a warp, Dk != Dv; and the same with
// documents (--reset-attention-mask's ids, the state and the convolution restarting at each).
void gated_delta_net_case(const OpCase& c, const GdnShape& s, const std::vector<int32_t>& documents) {
  auto gdocs = upload(documents);
  GdnShape cs = s, gs = s;  // the CPU's and the GPU's, with their document ids
  cs.documents = documents.empty() ? nullptr : documents.data();
  gs.documents = documents.empty() ? nullptr : gdocs.as<int32_t>();
  const int64_t N = s.N();
  const size_t nx = size_t(N * s.width()), nu = size_t(N * s.conv()), nqk = size_t(N * s.qk()), nh = size_t(N * s.Hv),
               no = size_t(N * s.v()), nst = size_t(s.B * s.Hv * s.state()),
               nck = size_t(s.B * s.Hv * s.chunks() * s.state()), nqv = size_t(N * s.Hv * s.Dk),
               nw = size_t(gdn_delta_rule_work(s));
  const auto x = rand_floats(nx, 111), w = rand_floats(size_t(s.conv() * s.K), 112), A = rand_floats(size_t(s.Hv), 113),
             dt = rand_floats(size_t(s.Hv), 114), d_o = rand_floats(no, 115), dy = rand_floats(no, 116),
             nrm = rand_floats(no, 117);
  auto gx = upload(x), gw = upload(w), gA = upload(A), gdt = upload(dt), gdo = upload(d_o), gdy = upload(dy),
       gnrm = upload(nrm);
  std::vector<float> u(nu), q(nqk), k(nqk), g(nh), beta(nh), o(no), st(nst), ck(nck);
  DeviceBuffer gu(nu * 4), gq(nqk * 4), gk(nqk * 4), gg(nh * 4), gb(nh * 4), go(no * 4), gst(nst * 4), gck(nck * 4);
  gdn_conv_forward(u.data(), x.data(), w.data(), cs);
  cuda::gdn_conv_forward(gu.as<float>(), gx.as<float>(), gw.as<float>(), gs);
  expect_close(c, "u", u, download<float>(gu, nu));
  gdn_gates_forward(q.data(), k.data(), g.data(), beta.data(), u.data(), x.data(), A.data(), dt.data(), cs);
  cuda::gdn_gates_forward(gq.as<float>(), gk.as<float>(), gg.as<float>(), gb.as<float>(), gu.as<float>(),
                          gx.as<float>(), gA.as<float>(), gdt.as<float>(), gs);
  expect_close(c, "q", q, download<float>(gq, nqk));
  expect_close(c, "g", g, download<float>(gg, nh));
  expect_close(c, "beta", beta, download<float>(gb, nh));
  gdn_delta_rule_forward(o.data(), st.data(), ck.data(), q.data(), k.data(), u.data(), g.data(), beta.data(), cs);
  cuda::gdn_delta_rule_forward(go.as<float>(), gst.as<float>(), gck.as<float>(), gq.as<float>(), gk.as<float>(),
                               gu.as<float>(), gg.as<float>(), gb.as<float>(), gs);
  expect_close(c, "o", o, download<float>(go, no));
  expect_close(c, "checkpoints", ck, download<float>(gck, nck));
  expect_close(c, "final state", st, download<float>(gst, nst));
  {  // from a carried state (decoding's), no checkpoints kept: o and the final states
    std::vector<float> st2 = rand_floats(nst, 118, -0.5f, 0.5f), o2(no);
    auto gst2 = upload(st2);
    DeviceBuffer go2(no * 4);
    gdn_delta_rule_forward(o2.data(), st2.data(), nullptr, q.data(), k.data(), u.data(), g.data(), beta.data(), cs,
                           true);
    cuda::gdn_delta_rule_forward(go2.as<float>(), gst2.as<float>(), nullptr, gq.as<float>(), gk.as<float>(),
                                 gu.as<float>(), gg.as<float>(), gb.as<float>(), gs, true);
    expect_close(c, "o (carried state)", o2, download<float>(go2, no));
    expect_close(c, "final state (carried)", st2, download<float>(gst2, nst));
  }
  // The backward on the CPU's forward values (uploaded), each kernel's outputs compared.
  auto gu2 = upload(u), gq2 = upload(q), gk2 = upload(k), gg2 = upload(g), gb2 = upload(beta), gck2 = upload(ck);
  std::vector<float> dqv(nqv), dkv(nqv), du(nu, 0.0f), dg(nh), dbeta(nh), work(nw);
  DeviceBuffer gdqv(nqv * 4), gdkv(nqv * 4), gdu(nu * 4), gdg(nh * 4), gdbeta(nh * 4), gwork(nw * 4);
  gdn_delta_rule_backward(dqv.data(), dkv.data(), du.data(), dg.data(), dbeta.data(), work.data(), d_o.data(),
                          ck.data(), q.data(), k.data(), u.data(), g.data(), beta.data(), cs);
  cuda::gdn_delta_rule_backward(gdqv.as<float>(), gdkv.as<float>(), gdu.as<float>(), gdg.as<float>(),
                                gdbeta.as<float>(), gwork.as<float>(), gdo.as<float>(), gck2.as<float>(),
                                gq2.as<float>(), gk2.as<float>(), gu2.as<float>(), gg2.as<float>(), gb2.as<float>(),
                                gs);
  expect_close(c, "dq_v", dqv, download<float>(gdqv, nqv));
  expect_close(c, "dk_v", dkv, download<float>(gdkv, nqv));
  expect_close(c, "dg", dg, download<float>(gdg, nh));
  expect_close(c, "dbeta", dbeta, download<float>(gdbeta, nh));
  std::vector<float> dq(nqk);
  DeviceBuffer gdq(nqk * 4);
  gdn_sum_key_heads(dq.data(), dqv.data(), cs);
  auto gdqv2 = upload(dqv);
  cuda::gdn_sum_key_heads(gdq.as<float>(), gdqv2.as<float>(), gs);
  expect_close(c, "dq", dq, download<float>(gdq, nqk));
  // The gates' and the convolution's backward from the CPU's gradients.
  auto gdq2 = upload(dq), gdk2 = upload(dq), gdg2 = upload(dg), gdbeta2 = upload(dbeta);
  std::vector<float> dx(nx, 0.0f), dA(size_t(s.Hv), 0.0f), ddt(size_t(s.Hv), 0.0f), dw(size_t(s.conv() * s.K), 0.0f);
  auto gdu2 = upload(du), gdx = upload(dx), gdA = upload(dA), gddt = upload(ddt), gdw = upload(dw);
  gdn_gates_backward(du.data(), dx.data(), dA.data(), ddt.data(), dq.data(), dq.data(), dg.data(), dbeta.data(),
                     u.data(), x.data(), A.data(), dt.data(), cs);
  cuda::gdn_gates_backward(gdu2.as<float>(), gdx.as<float>(), gdA.as<float>(), gddt.as<float>(), gdq2.as<float>(),
                           gdk2.as<float>(), gdg2.as<float>(), gdbeta2.as<float>(), gu2.as<float>(), gx.as<float>(),
                           gA.as<float>(), gdt.as<float>(), gs);
  expect_close(c, "du", du, download<float>(gdu2, nu));
  expect_close(c, "dA_log", dA, download<float>(gdA, dA.size()));
  expect_close(c, "d_dt_bias", ddt, download<float>(gddt, ddt.size()));
  gdn_conv_backward(dx.data(), dw.data(), du.data(), x.data(), w.data(), cs);
  cuda::gdn_conv_backward(gdx.as<float>(), gdw.as<float>(), gdu2.as<float>(), gx.as<float>(), gw.as<float>(), gs);
  expect_close(c, "dx", dx, download<float>(gdx, nx));
  expect_close(c, "dw", dw, download<float>(gdw, dw.size()));
  // The output gate.
  std::vector<float> y(no), dn(no);
  DeviceBuffer gy(no * 4), gdn(no * 4);
  gdn_output_gate_forward(y.data(), nrm.data(), x.data(), cs);
  cuda::gdn_output_gate_forward(gy.as<float>(), gnrm.as<float>(), gx.as<float>(), gs);
  expect_close(c, "y", y, download<float>(gy, no));
  gdn_output_gate_backward(dn.data(), dx.data(), dy.data(), nrm.data(), x.data(), cs);
  cuda::gdn_output_gate_backward(gdn.as<float>(), gdx.as<float>(), gdy.as<float>(), gnrm.as<float>(), gx.as<float>(),
                                 gs);
  expect_close(c, "dn", dn, download<float>(gdn, no));
  expect_close(c, "dx (z slot)", dx, download<float>(gdx, nx));
}

void gated_delta_net_cases(std::vector<OpCase>& t) {
  GdnShape s;
  s.B = 2;
  s.T = 70;
  s.Hk = 2;
  s.Hv = 4;
  s.Dk = 40;
  s.Dv = 36;
  s.K = 4;
  s.chunk = 32;
  const std::string shape = shape_name({{"B", s.B}, {"T", s.T}, {"Hv", s.Hv}, {"Dk", s.Dk}, {"Dv", s.Dv}});
  t.push_back({"gated_delta_net", shape, {2e-5, 1e-6}, [s](const OpCase& c) { gated_delta_net_case(c, s, {}); }});
  // Sequence 0's documents start at tokens 20, 32 (a chunk's first) and 50, sequence 1's at its last token.
  std::vector<int32_t> documents(size_t(s.N()), 0);
  for (int64_t t0 : {20, 32, 50})
    for (int64_t t1 = t0; t1 < s.T; ++t1) ++documents[size_t(t1)];
  documents[size_t(s.N() - 1)] = 1;
  t.push_back({"gated_delta_net_documents", shape, {2e-5, 1e-6}, [s, documents](const OpCase& c) {
                 gated_delta_net_case(c, s, documents);
               }});
}

// Mamba-2 (kernels/mamba.h): the forward chain (convolution, dt, the scan with checkpoints, the gated norm)
// and the backward chain as the model runs them, every output of each kernel compared: three chunks of each
// sequence (the last one short), two heads a group. The outputs the kernels write start from other values
// (the same on both devices), the gradients they accumulate into from nonzero ones; the backward runs on
// the CPU's forward values. With documents the state and the convolution restart at each.
void mamba_case(const OpCase& c, const MambaShape& s, const std::vector<int32_t>& documents) {
  auto gdocs = upload(documents);
  MambaShape cs = s, gs = s;  // the CPU's and the GPU's, with their document ids
  cs.documents = documents.empty() ? nullptr : documents.data();
  gs.documents = documents.empty() ? nullptr : gdocs.as<int32_t>();
  const int64_t R = s.rows();
  const size_t nx = size_t(R * s.width()), nu = size_t(R * s.conv()), nh = size_t(R * s.H), ny = size_t(R * s.inner()),
               nr = size_t(R * s.G), nck = size_t(s.B * s.H * s.chunks() * s.state()), nw = size_t(mamba_scan_work(s)),
               ncw = size_t(s.conv() * s.K), nc = size_t(s.conv()), nH = size_t(s.H), nI = size_t(s.inner());
  const auto x = rand_floats(nx, 121), cw = rand_floats(ncw, 122, -0.5f, 0.5f), cb = rand_floats(nc, 123),
             dt_bias = rand_floats(nH, 124), A_log = rand_floats(nH, 125), D = rand_floats(nH, 126),
             nw_w = rand_floats(nI, 127, 0.5f, 1.5f), dout = rand_floats(ny, 128);
  auto gx = upload(x), gcw = upload(cw), gcb = upload(cb), gdtb = upload(dt_bias), gA = upload(A_log), gD = upload(D),
       gnw = upload(nw_w), gdout = upload(dout);
  // The forward, each GPU kernel on the GPU's previous outputs.
  std::vector<float> u(nu), dt(nh), y(ny), ck(nck), out(ny), rstd(nr);
  DeviceBuffer gu(nu * 4), gdt(nh * 4), gy(ny * 4), gck(nck * 4), gout(ny * 4), grstd(nr * 4);
  mamba_conv_forward(u.data(), x.data(), cw.data(), cb.data(), cs);
  cuda::mamba_conv_forward(gu.as<float>(), gx.as<float>(), gcw.as<float>(), gcb.as<float>(), gs);
  expect_close(c, "u", u, download<float>(gu, nu));
  mamba_dt_forward(dt.data(), x.data(), dt_bias.data(), cs);
  cuda::mamba_dt_forward(gdt.as<float>(), gx.as<float>(), gdtb.as<float>(), gs);
  expect_close(c, "dt", dt, download<float>(gdt, nh));
  mamba_scan_forward(y.data(), ck.data(), u.data(), dt.data(), A_log.data(), D.data(), cs);
  cuda::mamba_scan_forward(gy.as<float>(), gck.as<float>(), gu.as<float>(), gdt.as<float>(), gA.as<float>(),
                           gD.as<float>(), gs);
  expect_close(c, "y", y, download<float>(gy, ny));
  expect_close(c, "checkpoints", ck, download<float>(gck, nck));
  {  // from a carried state (decoding's): y and the final states
    const size_t ns = size_t(s.B * s.H * s.state());
    std::vector<float> state = rand_floats(ns, 136), ys(ny);
    auto gstate = upload(state);
    DeviceBuffer gys(ny * 4);
    mamba_scan_forward(ys.data(), nullptr, u.data(), dt.data(), A_log.data(), D.data(), cs, state.data());
    cuda::mamba_scan_forward(gys.as<float>(), nullptr, gu.as<float>(), gdt.as<float>(), gA.as<float>(),
                             gD.as<float>(), gs, gstate.as<float>());
    expect_close(c, "y (carried state)", ys, download<float>(gys, ny));
    expect_close(c, "final state", state, download<float>(gstate, ns));
  }
  mamba_gated_norm_forward(out.data(), rstd.data(), y.data(), x.data(), nw_w.data(), cs);
  cuda::mamba_gated_norm_forward(gout.as<float>(), grstd.as<float>(), gy.as<float>(), gx.as<float>(),
                                 gnw.as<float>(), gs);
  expect_close(c, "out", out, download<float>(gout, ny));
  expect_close(c, "rstd", rstd, download<float>(grstd, nr));
  // The backward from the CPU's forward values (uploaded).
  auto gu2 = upload(u), gdt2 = upload(dt), gy2 = upload(y), gck2 = upload(ck), grstd2 = upload(rstd);
  // The gated norm: dy written, dx's z columns written, its weight's gradient accumulated.
  std::vector<float> dx = rand_floats(nx, 129), dy = rand_floats(ny, 130), dnw = rand_floats(nI, 131);
  auto gdx = upload(dx), gdy = upload(dy), gdnw = upload(dnw);
  mamba_gated_norm_backward(dy.data(), dx.data(), dnw.data(), dout.data(), y.data(), x.data(), nw_w.data(),
                            rstd.data(), cs);
  cuda::mamba_gated_norm_backward(gdy.as<float>(), gdx.as<float>(), gdnw.as<float>(), gdout.as<float>(),
                                  gy2.as<float>(), gx.as<float>(), gnw.as<float>(), grstd2.as<float>(), gs);
  expect_close(c, "dy", dy, download<float>(gdy, ny));
  expect_close(c, "dx (z columns)", dx, download<float>(gdx, nx));
  expect_close(c, "norm dw", dnw, download<float>(gdnw, nI));
  // The scan: du (every column) and d_dt written, dA_log and dD accumulated.
  auto gdy2 = upload(dy);
  std::vector<float> du = rand_floats(nu, 132), d_dt = rand_floats(nh, 133), dA = rand_floats(nH, 134),
                     dD = rand_floats(nH, 135);
  const std::vector<float> dA0 = dA, dD0 = dD;
  auto gdu = upload(du), gd_dt = upload(d_dt), gdA = upload(dA), gdD = upload(dD);
  DeviceBuffer gwork(nw * 4);
  mamba_scan_backward(du.data(), d_dt.data(), dA.data(), dD.data(), nullptr, dy.data(), ck.data(), u.data(), dt.data(),
                      A_log.data(), D.data(), cs);
  cuda::mamba_scan_backward(gdu.as<float>(), gd_dt.as<float>(), gdA.as<float>(), gdD.as<float>(), gwork.as<float>(),
                            gdy2.as<float>(), gck2.as<float>(), gu2.as<float>(), gdt2.as<float>(), gA.as<float>(),
                            gD.as<float>(), gs);
  expect_close(c, "du", du, download<float>(gdu, nu));
  expect_close(c, "d_dt", d_dt, download<float>(gd_dt, nh));
  expect_close(c, "dA_log", dA, download<float>(gdA, nH));
  expect_close(c, "dD", dD, download<float>(gdD, nH));
  {  // run to run the same bits
    auto gdu_r = upload(du), gd_dt_r = upload(d_dt), gdA_r = upload(dA0), gdD_r = upload(dD0);
    cuda::mamba_scan_backward(gdu_r.as<float>(), gd_dt_r.as<float>(), gdA_r.as<float>(), gdD_r.as<float>(),
                              gwork.as<float>(), gdy2.as<float>(), gck2.as<float>(), gu2.as<float>(), gdt2.as<float>(),
                              gA.as<float>(), gD.as<float>(), gs);
    expect_bits(c, "du (rerun)", download<float>(gdu, nu), download<float>(gdu_r, nu));
    expect_bits(c, "d_dt (rerun)", download<float>(gd_dt, nh), download<float>(gd_dt_r, nh));
    expect_bits(c, "dA_log (rerun)", download<float>(gdA, nH), download<float>(gdA_r, nH));
    expect_bits(c, "dD (rerun)", download<float>(gdD, nH), download<float>(gdD_r, nH));
  }
  // dt: dx's dt columns written, d_dt_bias accumulated (from the CPU's d_dt).
  auto gd_dt2 = upload(d_dt);
  std::vector<float> d_dt_bias = rand_floats(nH, 136);
  auto gd_dt_bias = upload(d_dt_bias);
  mamba_dt_backward(dx.data(), d_dt_bias.data(), d_dt.data(), x.data(), dt_bias.data(), cs);
  cuda::mamba_dt_backward(gdx.as<float>(), gd_dt_bias.as<float>(), gd_dt2.as<float>(), gx.as<float>(),
                          gdtb.as<float>(), gs);
  expect_close(c, "dx (dt columns)", dx, download<float>(gdx, nx));
  expect_close(c, "d_dt_bias", d_dt_bias, download<float>(gd_dt_bias, nH));
  // The convolution: dx's x, B, C columns written, its weight's and bias's gradients accumulated (from the
  // CPU's du).
  auto gdu2 = upload(du);
  std::vector<float> dcw = rand_floats(ncw, 137), dcb = rand_floats(nc, 138);
  auto gdcw = upload(dcw), gdcb = upload(dcb);
  mamba_conv_backward(dx.data(), dcw.data(), dcb.data(), du.data(), x.data(), cw.data(), cb.data(), cs);
  cuda::mamba_conv_backward(gdx.as<float>(), gdcw.as<float>(), gdcb.as<float>(), gdu2.as<float>(), gx.as<float>(),
                            gcw.as<float>(), gcb.as<float>(), gs);
  expect_close(c, "dx", dx, download<float>(gdx, nx));
  expect_close(c, "conv dw", dcw, download<float>(gdcw, ncw));
  expect_close(c, "conv dbias", dcb, download<float>(gdcb, nc));
}

void mamba_cases(std::vector<OpCase>& t) {
  MambaShape s;
  s.B = 2;
  s.T = 37;
  s.H = 4;
  s.P = 8;
  s.G = 2;
  s.N = 6;
  s.K = 4;
  s.chunk = 16;
  const auto name = [](const MambaShape& m) {
    return shape_name({{"B", m.B}, {"T", m.T}, {"H", m.H}, {"P", m.P}, {"G", m.G}, {"N", m.N}});
  };
  // Measured under the SIMT emulation: up to 2e-5 relative where sums over the rows cancel (the weights'
  // gradients), 6e-6 absolute on values up to 20.
  const Tol tol{5e-5, 5e-6};
  t.push_back({"mamba", name(s), tol, [s](const OpCase& c) { mamba_case(c, s, {}); }});
  // Sequence 0's documents start at tokens 2 (inside the convolution's first window), 16 (a chunk's first)
  // and 21, sequence 1's at token 30 (in its short last chunk).
  std::vector<int32_t> documents(size_t(s.rows()), 0);
  for (int64_t t0 : {2, 16, 21})
    for (int64_t t1 = t0; t1 < s.T; ++t1) ++documents[size_t(t1)];
  for (int64_t t1 = 30; t1 < s.T; ++t1) documents[size_t(s.T + t1)] = 1;
  t.push_back({"mamba_documents", name(s), tol, [s, documents](const OpCase& c) { mamba_case(c, s, documents); }});
  // A state of 50 KiB (P N floats), more rows than a scan block has threads (its loops over p and the
  // product tiles' edges), one group, chunks of 4 tokens (the last one short). dD and B's and C's gradients are sums of ~10^4 terms of order
  // one that cancel (measured: 5e-5 apart from the CPU's sequential sums).
  MambaShape big;
  big.B = 1;
  big.T = 9;
  big.H = 2;
  big.P = 1040;
  big.G = 1;
  big.N = 12;
  big.K = 3;
  big.chunk = 4;
  t.push_back({"mamba_large_state", name(big), {1e-4, 2e-4}, [big](const OpCase& c) { mamba_case(c, big, {}); }});
}

// Muon (kernels/muon.h, optim/muon.h): the momentum (plain, Nesterov, with a clipping scale), the
// normalizing division and the update, element by element; and the Newton-Schulz iteration through
// the GEMM facade and those kernels, wide and tall.
void muon_cases(std::vector<OpCase>& t) {
  const int64_t n = 70001;
  t.push_back({"muon_momentum_apply", shape_name({{"n", n}}), {1e-6, 1e-7}, [n](const OpCase& c) {
                 for (bool nesterov : {false, true}) {
                   auto m = rand_floats(size_t(n), 101), g = rand_floats(size_t(n), 102),
                        p = rand_floats(size_t(n), 103);
                   std::vector<float> u(static_cast<size_t>(n));
                   auto gm = upload(m), gg = upload(g), gp = upload(p);
                   DeviceBuffer gu(size_t(n) * 4);
                   muon_momentum(m.data(), u.data(), g.data(), n, 0.05f, 0.95f, nesterov, 0.7f);
                   cuda::muon_momentum(gm.as<float>(), gu.as<float>(), gg.as<float>(), n, 0.05f, 0.95f, nesterov, 0.7f);
                   expect_close(c, "m", m, download<float>(gm, size_t(n)));
                   expect_close(c, "u", u, download<float>(gu, size_t(n)));
                   divide_inplace(u.data(), 3.7f, n);
                   cuda::divide_inplace(gu.as<float>(), 3.7f, n);
                   expect_close(c, "u / norm", u, download<float>(gu, size_t(n)));
                   muon_apply(p.data(), u.data(), n, -0.001f, 1.7f, 0.2f, -0.01f);
                   cuda::muon_apply(gp.as<float>(), gu.as<float>(), n, -0.001f, 1.7f, 0.2f, -0.01f);
                   expect_close(c, "p", p, download<float>(gp, size_t(n)));
                 }
               }});
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{96, 160}, {160, 96}, {64, 64}}) {
    t.push_back({"newton_schulz", shape_name({{"rows", rows}, {"cols", cols}}), {1e-4, 1e-5}, [rows, cols](const OpCase& c) {
      const std::vector<NsCoefficients> steps = newton_schulz_coefficients("quintic", 5);
      auto x = rand_floats(size_t(rows * cols), 104);
      auto gx = upload(x);
      {
        MuonWorkspace ws(rows * cols, std::min(rows, cols) * std::min(rows, cols));  // host
        newton_schulz(x.data(), rows, cols, steps, ws);
      }
      const Device before = current_device();  // the GEMMs and kernels on the GPU for this part
      set_device(Device::cuda, 0);
      {
        MuonWorkspace gws(rows * cols, std::min(rows, cols) * std::min(rows, cols));
        newton_schulz(gx.as<float>(), rows, cols, steps, gws);
      }
      set_device(before, 0);
      expect_close(c, "orthogonalized", x, download<float>(gx, x.size()));
    }});
  }
}

// ---------------------------------------------------------------- odd offsets

// Views that start one element into their buffers (a slice of a flat buffer at an odd
// offset): kernels must not assume more than the element's own alignment.
void odd_offset_cases(std::vector<OpCase>& t) {
  const int64_t n = 100003;
  t.push_back({"add_forward_odd_offset", shape_name({{"n", n}}), {0.0, 0.0}, [n](const OpCase& c) {
    const auto a = rand_floats(static_cast<size_t>(n + 1), 61), b = rand_floats(static_cast<size_t>(n + 1), 62);
    std::vector<float> out(static_cast<size_t>(n));
    add_forward(out.data(), a.data() + 1, b.data() + 1, n);
    auto ga = upload(a), gb = upload(b);
    DeviceBuffer gout(static_cast<size_t>(n + 1) * 4);
    cuda::add_forward(gout.as<float>() + 1, ga.as<float>() + 1, gb.as<float>() + 1, n);
    const auto got = download<float>(gout, static_cast<size_t>(n + 1));
    expect_bits(c, "out", out, std::vector<float>(got.begin() + 1, got.end()));
  }});
  t.push_back({"gelu_forward_odd_offset", shape_name({{"n", n}}), {1e-5, 1e-6}, [n](const OpCase& c) {
    const auto x = rand_floats(static_cast<size_t>(n + 1), 63, -6.0f, 6.0f);
    std::vector<float> out(static_cast<size_t>(n));
    gelu_forward(out.data(), x.data() + 1, n, GeluKind::tanh);
    auto gx = upload(x);
    DeviceBuffer gout(static_cast<size_t>(n + 1) * 4);
    cuda::gelu_forward(gout.as<float>() + 1, gx.as<float>() + 1, n, GeluKind::tanh);
    const auto got = download<float>(gout, static_cast<size_t>(n + 1));
    expect_close(c, "out", out, std::vector<float>(got.begin() + 1, got.end()));
  }});
  t.push_back({"cast_fp32_to_bf16_odd_offset", shape_name({{"n", n}}), {0.0, 0.0}, [n](const OpCase& c) {
    const auto in = cast_inputs(static_cast<size_t>(n + 1), 64);
    std::vector<uint16_t> out(static_cast<size_t>(n));
    cast_fp32_to_bf16(out.data(), in.data() + 1, n);
    auto gin = upload(in);
    DeviceBuffer gout(static_cast<size_t>(n + 1) * 2);
    cuda::cast_fp32_to_bf16(gout.as<uint16_t>() + 1, gin.as<float>() + 1, n);
    const auto got = download<uint16_t>(gout, static_cast<size_t>(n + 1));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), got.begin() + 1)) << c.op << " " << c.shape << ": bf16 bits differ";
  }});
  // Rows of 50257 logits (an odd row length: every other row starts at an odd offset).
  t.push_back({"cross_entropy_forward_backward_odd_rows", shape_name({{"N", 7}, {"V", 50257}, {"Vp", 50257}}),
               {1e-5, 1e-9}, [](const OpCase& c) {
    const int64_t N = 7, V = 50257;
    auto logits = rand_floats(static_cast<size_t>(N * V), 65, -8.0f, 8.0f);
    const auto targets = rand_ints(static_cast<size_t>(N), 66, 0, int32_t(V));
    auto gl = upload(logits), gt = upload(targets);
    std::vector<float> losses(static_cast<size_t>(N));
    DeviceBuffer gloss(losses.size() * 4);
    cross_entropy_forward_backward(logits.data(), losses.data(), targets.data(), nullptr, 0.5f, N, V, V);
    cuda::cross_entropy_forward_backward(gl.as<float>(), gloss.as<float>(), gt.as<int32_t>(), nullptr, 0.5f, N, V, V);
    const OpCase loss_tol{c.op, c.shape, {1e-5, 1e-5}, nullptr};
    expect_close(loss_tol, "losses", losses, download<float>(gloss, losses.size()));
    expect_close(c, "dlogits", logits, download<float>(gl, logits.size()));
  }});
}

std::vector<OpCase> op_table() {
  std::vector<OpCase> t;
  layernorm_cases(t);
  gelu_cases(t);
  swiglu_cases(t);
  dropout_cases(t);
  elementwise_cases(t);
  embedding_cases(t);
  cross_entropy_cases(t);
  cross_entropy_bf16_cases(t);
  optimizer_cases(t);
  cast_cases(t);
  decode_attention_cases(t);
  rope_cases(t);
  attention_gate_cases(t);
  gated_delta_net_cases(t);
  mamba_cases(t);
  muon_cases(t);
  moe_cases(t);
  odd_offset_cases(t);
  return t;
}

class CudaOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaOps, MatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  const OpCase& c = GetParam();
  c.run(c);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaOps, ::testing::ValuesIn(op_table()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           return info.param.op + "_" + info.param.shape;
                         });

// The chunked scans keep a chunk's [chunk, chunk] products in shared memory: a longer chunk is refused in one
// line naming the kernel and the limit (the model's chunks are at most 64 tokens), before anything runs.
TEST(CudaChunkedScans, ChunksAbove64AreRefused) {
  LATTICE_REQUIRE_CUDA();
  // Whether f fails with a message holding `want` (the message, or "no error", printed when not).
  const auto refused = [](const std::function<void()>& f, const std::string& want) -> testing::AssertionResult {
    std::string got = "no error";
    try {
      f();
    } catch (const Error& e) {
      got = e.what();
    }
    if (got.find(want) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "expected '" << want << "', got: " << got;
  };
  MambaShape m;
  m.B = 1;
  m.T = 130;
  m.H = m.G = 1;
  m.P = m.N = 4;
  m.chunk = 65;
  DeviceBuffer buf(size_t(1) << 20);
  float* p = buf.as<float>();
  EXPECT_TRUE(refused([&] { cuda::mamba_scan_forward(p, p, p, p, p, p, m); },
                      "mamba_scan_forward (CUDA): scan chunk 65 (at most 64)"));
  EXPECT_TRUE(refused([&] { cuda::mamba_scan_backward(p, p, p, p, p, p, p, p, p, p, p, m); },
                      "mamba_scan_backward (CUDA): scan chunk 65 (at most 64)"));
  GdnShape g;
  g.B = 1;
  g.T = 130;
  g.Hk = g.Hv = 1;
  g.Dk = g.Dv = 4;
  g.chunk = 65;
  EXPECT_TRUE(refused([&] { cuda::gdn_delta_rule_forward(p, p, p, p, p, p, p, p, g); },
                      "gdn_delta_rule_forward (CUDA): chunk 65 (at most 64)"));
  EXPECT_TRUE(refused([&] { cuda::gdn_delta_rule_backward(p, p, p, p, p, p, p, p, p, p, p, p, p, g); },
                      "gdn_delta_rule_backward (CUDA): chunk 65 (at most 64)"));
}

}  // namespace
}  // namespace lattice
