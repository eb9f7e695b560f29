// CUDA flash attention against the CPU kernel on the same inputs: forward (out, lse) and
// backward (dqkv), with and without dropout (tensor-parallel head numbering) and
// document masks, for tile-aligned and ragged T, and D from 16 to 256 (1 to 8 warp chunks; 192: the
// multi-latent attention's fused heads, DeepSeek-V3's Dn + Dr).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "../attention_test_data.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/ops.h"

namespace lattice {
namespace {

using cuda_test::download;
using cuda_test::upload;
using namespace attention_test;

// Tolerance. Both sides compute in fp32; they differ in the order of every reduction
// (tiles of 64 vs 32 keys, dot products and row sums split differently) and in exp
// (the CPU's polynomial vs expf, a few ulp each). Those are rounding differences of
// ~1e-7 relative per term, accumulated over at most T=128 keys and D=128 products, well
// under 1e-5 of the row's scale. A wrong mask, a wrong dropout draw or a missed tile
// changes an element by a whole probability term (>= 1e-3 of the row here).
constexpr double kTol = 1e-5;

struct Case {
  int64_t B, T, H, D;
  int64_t G = 0;        // query groups (grouped-query attention); 0: H
  int64_t window = -1;  // sliding window (AttentionShape::window); -1: none
};

enum class Variant { kPlain, kDropout, kDocuments, kDocumentsDropout };

struct Param {
  Case c;
  Variant v;
};

std::string name_of(const ::testing::TestParamInfo<Param>& info) {
  const Case& c = info.param.c;
  const char* v[] = {"plain", "dropout", "docs", "docs_dropout"};
  std::ostringstream os;
  os << "B" << c.B << "_T" << c.T << "_H" << c.H << (c.G ? "_G" + std::to_string(c.G) : "") << "_D" << c.D
     << (c.window >= 0 ? "_W" + std::to_string(c.window) : "") << "_" << v[int(info.param.v)];
  return os.str();
}

// Compares a [rows, D] tensor (rows = the product of the leading dims) element by
// element: |cuda - cpu| <= kTol * (1 + max |cpu| over the element's row of D). Prints
// the first failures with their coordinates; NaN (an unwritten element) fails.
void expect_rows_close(const std::vector<float>& cuda_v, const std::vector<float>& cpu_v,
                       int64_t D, const std::string& what,
                       const std::function<std::string(int64_t row)>& describe_row) {
  ASSERT_EQ(cuda_v.size(), cpu_v.size()) << what;
  const int64_t rows = int64_t(cpu_v.size()) / D;
  int failures = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double row_max = 0.0;
    for (int64_t d = 0; d < D; ++d) row_max = std::max(row_max, std::fabs(double(cpu_v[size_t(r * D + d)])));
    const double tol = kTol * (1.0 + row_max);
    for (int64_t d = 0; d < D; ++d) {
      const double a = cuda_v[size_t(r * D + d)], e = cpu_v[size_t(r * D + d)];
      const double err = std::fabs(a - e);
      if (err / tol > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err / tol;
      if (!(err <= tol) && ++failures <= 5)
        ADD_FAILURE() << what << " " << describe_row(r) << " d=" << d << ": cuda " << a << " cpu "
                      << e << " |diff| " << err << " > tol " << tol;
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " elements out of tolerance (worst "
                         << worst << " x tol)";
}

// The CUDA attention on the host inputs: forward (out, lse) and, from the CPU's out and lse
// (so it is checked on its own), backward twice (dqkv and dqkv_again: a deterministic
// kernel gives the same bits). Outputs start as NaN bytes, so an element left unwritten fails.
struct GpuAttention {
  std::vector<float> out, lse, dqkv, dqkv_again;
};
GpuAttention run_on_gpu(const std::vector<float>& qkv, const std::vector<float>& dout,
                        const std::vector<float>& cpu_out, const std::vector<float>& cpu_lse,
                        const std::vector<int32_t>& docs, const AttentionShape& s, const AttentionDropout& drop,
                        AttentionMath math) {
  auto d_qkv = upload(qkv);
  auto d_dout = upload(dout);
  const cuda::DeviceBuffer d_docs = docs.empty() ? cuda::DeviceBuffer() : upload(docs);
  const int32_t* doc = docs.empty() ? nullptr : d_docs.as<int32_t>();
  cuda::DeviceBuffer d_out(cpu_out.size() * sizeof(float)), d_lse(cpu_lse.size() * sizeof(float));
  cuda::DeviceBuffer d_dqkv(qkv.size() * sizeof(float));
  cuda::memset_device(d_out.data(), 0xff, d_out.size());
  cuda::memset_device(d_lse.data(), 0xff, d_lse.size());
  GpuAttention g;
  cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), s, drop, doc, math);
  g.out = download<float>(d_out, cpu_out.size());
  g.lse = download<float>(d_lse, cpu_lse.size());
  auto d_out_cpu = upload(cpu_out);
  auto d_lse_cpu = upload(cpu_lse);
  for (std::vector<float>* dqkv : {&g.dqkv, &g.dqkv_again}) {
    cuda::memset_device(d_dqkv.data(), 0xff, d_dqkv.size());
    cuda::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), d_out_cpu.as<float>(),
                             d_lse_cpu.as<float>(), s, drop, doc, math);
    *dqkv = download<float>(d_dqkv, qkv.size());
  }
  return g;
}

void expect_same_bits(const std::vector<float>& again, const std::vector<float>& first) {
  size_t differ = 0;
  for (size_t k = 0; k < first.size(); ++k) differ += std::memcmp(&again[k], &first[k], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "dqkv differs between two identical backward runs in " << differ << " elements";
}

class CudaAttention : public ::testing::TestWithParam<Param> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  LATTICE_REQUIRE_CUDA();
  const Case c = GetParam().c;
  const Variant v = GetParam().v;
  const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
  AttentionDropout drop;
  if (v == Variant::kDropout || v == Variant::kDocumentsDropout) drop = tensor_parallel_rank1_dropout(c.H);
  std::vector<int32_t> docs;
  if (v == Variant::kDocuments || v == Variant::kDocumentsDropout) docs = document_ids(c.B, c.T, 5);
  const int32_t* docs_cpu = docs.empty() ? nullptr : docs.data();

  const size_t n_qkv = size_t(c.B * c.T * s.layout().width()), n_out = size_t(c.B * c.T * c.H * c.D);
  const size_t n_lse = size_t(c.B * c.H * c.T);
  const auto qkv = random_floats(n_qkv, 11, -1.5f, 1.5f);
  const auto dout = random_floats(n_out, 12, -1.0f, 1.0f);

  // CPU reference.
  std::vector<float> out(n_out), lse(n_lse), dqkv(n_qkv);
  attention_forward(out.data(), lse.data(), qkv.data(), s, drop, docs_cpu);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop, docs_cpu);

  const GpuAttention g = run_on_gpu(qkv, dout, out, lse, docs, s, drop, AttentionMath::fp32);
  const std::vector<float>&g_out = g.out, &g_lse = g.lse, &g_dqkv = g.dqkv;

  const auto out_row = [&](int64_t r) {  // r over [B,T,H]
    std::ostringstream os;
    os << "(b=" << r / (c.T * c.H) << " t=" << (r / c.H) % c.T << " h=" << r % c.H << ")";
    return os.str();
  };
  const auto lse_row = [&](int64_t r) {  // r over [B,H,T]
    std::ostringstream os;
    os << "(b=" << r / (c.H * c.T) << " h=" << (r / c.T) % c.H << " t=" << r % c.T << ")";
    return os.str();
  };
  const QkvLayout L = s.layout();
  const auto qkv_row = [&](int64_t r) {  // r over [B,T,G,R+2]
    const int64_t slot = r % L.slots(), R = L.R(), in_group = slot % (R + 2);
    std::ostringstream os;
    os << (in_group < R ? "dq" : in_group == R ? "dk" : "dv") << " (b=" << r / (c.T * L.slots())
       << " t=" << (r / L.slots()) % c.T << " group=" << slot / (R + 2) << " slot=" << in_group << ")";
    return os.str();
  };
  expect_rows_close(g_out, out, c.D, "out", out_row);
  expect_rows_close(g_lse, lse, 1, "lse", lse_row);
  expect_rows_close(g_dqkv, dqkv, c.D, "dqkv", qkv_row);

  expect_same_bits(g.dqkv_again, g.dqkv);
}

std::vector<Param> params() {
  const Case cases[] = {
      {2, 37, 3, 16},  // ragged T (one full tile and a partial one), D in one warp chunk
      {1, 128, 4, 64}, // the 124M/350M head dim, tile-aligned T
      {2, 1, 2, 64},   // T = 1
      {1, 70, 2, 128}, // the tensor cores' largest D, three tiles
      {1, 45, 2, 192}, // DeepSeek-V3's MLA heads (Dn 128 + Dr 64), six warp chunks
      {1, 33, 1, 256}, // the largest D, eight warp chunks
      {1, 45, 1, 40},  // one head, D not a multiple of 32
      {1, 33, 2, 80},  // three warp chunks of D (2560 hidden / 32 heads), the last half used
      {2, 37, 4, 16, 2},  // grouped-query attention: 2 groups of 2 heads
      {1, 70, 6, 64, 1},  // multi-query: one key and value for 6 heads
      // sliding windows (--window-size): inside a tile, across tiles (whole tiles skipped), self only
      {2, 37, 4, 16, 2, 5},
      {1, 150, 2, 64, 0, 40},
      {1, 70, 3, 32, 1, 0},
  };
  std::vector<Param> ps;
  for (const Case& c : cases)
    for (Variant v : {Variant::kPlain, Variant::kDropout, Variant::kDocuments,
                      Variant::kDocumentsDropout})
      ps.push_back({c, v});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(params()), name_of);

// ---------------------------------------------------------------------------------------
// The tensor-core kernels (AttentionMath bf16 / fp16). Their definition: q, k, v and dO
// rounded to the format, the products' other operands (P, dS) rounded where they enter a
// product, fp32 sums. The reference is the CPU's fp32 kernel on q, k, v, dO rounded to
// the format first, so what is left is the rounding of P and dS: a relative error of at
// most u (the unit roundoff: bf16 2^-8, fp16 2^-11) per term, about u/sqrt(3) rms, which
// the norm of each tensor's error averages over thousands of elements. The bound on
// |gpu - ref| / |ref| (Frobenius norms, per tensor) is 2u; a wrong fragment layout, mask,
// tile or dropout draw moves whole terms (errors of 10% and more). lse comes from fp32
// scores of the rounded inputs: within the fp32 tolerance kTol of the reference.
enum class Format { kBf16, kFp16 };

struct MmaParam {
  Case c;
  Variant v;
  Format f;
};

std::string mma_name_of(const ::testing::TestParamInfo<MmaParam>& info) {
  const Case& c = info.param.c;
  const char* v[] = {"plain", "dropout", "docs", "docs_dropout"};
  std::ostringstream os;
  os << (info.param.f == Format::kBf16 ? "bf16" : "fp16") << "_B" << c.B << "_T" << c.T << "_H" << c.H
     << (c.G ? "_G" + std::to_string(c.G) : "") << "_D" << c.D << (c.window >= 0 ? "_W" + std::to_string(c.window) : "")
     << "_" << v[int(info.param.v)];
  return os.str();
}

class CudaAttentionMma : public ::testing::TestWithParam<MmaParam> {};

TEST_P(CudaAttentionMma, ForwardAndBackwardMatchRoundedCpu) {
  LATTICE_REQUIRE_CUDA();
  const Case c = GetParam().c;
  const Variant v = GetParam().v;
  const Format f = GetParam().f;
  const AttentionMath math = f == Format::kBf16 ? AttentionMath::bf16 : AttentionMath::fp16;
  const double u = f == Format::kBf16 ? 1.0 / 256 : 1.0 / 2048;
  const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
  AttentionDropout drop;
  if (v == Variant::kDropout || v == Variant::kDocumentsDropout) drop = tensor_parallel_rank1_dropout(c.H);
  std::vector<int32_t> docs;
  if (v == Variant::kDocuments || v == Variant::kDocumentsDropout) docs = document_ids(c.B, c.T, 5);
  const int32_t* docs_cpu = docs.empty() ? nullptr : docs.data();

  const size_t n_qkv = size_t(c.B * c.T * s.layout().width()), n_out = size_t(c.B * c.T * c.H * c.D);
  const auto qkv = random_floats(n_qkv, 21, -1.5f, 1.5f);
  const auto dout = random_floats(n_out, 22, -1.0f, 1.0f);
  const RoundedReference ref = rounded_reference(qkv, dout, s, drop, docs_cpu, f == Format::kFp16);
  const std::vector<float>&out = ref.out, &lse = ref.lse;

  {
    auto d_qkv = upload(qkv);
    ASSERT_TRUE(cuda::attention_mma_supported(s, d_qkv.data(), d_qkv.data(), d_qkv.data()))
        << "the tensor-core kernels do not take D=" << c.D << " on this GPU";
  }
  // Unrounded inputs: the kernels round.
  const GpuAttention g = run_on_gpu(qkv, dout, out, lse, docs, s, drop, math);
  const std::vector<float>&g_out = g.out, &g_lse = g.lse, &g_dqkv = g.dqkv;

  const Errors err = errors(g_out, g_dqkv, ref, s.layout());
  const double e_out = err.out, e_dq = err.dq, e_dk = err.dk, e_dv = err.dv;
  std::printf("[ info ] attention mma %s: relative error out %.2e dq %.2e dk %.2e dv %.2e (bound %.2e)\n",
              mma_name_of({GetParam(), 0}).c_str(), e_out, e_dq, e_dk, e_dv, 2 * u);
  EXPECT_LE(e_out, 2 * u) << "out";
  if (c.T == 1) {
    // One key per query: P = 1, dS = P (dP - dO . o) = 0 since o = v, so dq and dk are zero
    // in exact arithmetic and both sides' values are rounding noise (the reference's is not
    // a scale to measure against): they must be negligible against dv, the layer's gradient.
    const auto part_norm = [&](const std::vector<float>& x, int which) {
      const auto in_part = part_of(s.layout(), which);
      double s2 = 0.0;
      for (size_t k = 0; k < x.size(); ++k)
        if (in_part(k)) s2 += double(x[k]) * double(x[k]);
      return std::sqrt(s2);
    };
    const double dv_norm = part_norm(ref.dqkv, 2);
    EXPECT_LE(part_norm(g_dqkv, 0), 2 * u * dv_norm) << "dq, zero in exact arithmetic for T = 1";
    EXPECT_LE(part_norm(g_dqkv, 1), 2 * u * dv_norm) << "dk, zero in exact arithmetic for T = 1";
  } else {
    EXPECT_LE(e_dq, 2 * u) << "dq";
    EXPECT_LE(e_dk, 2 * u) << "dk";
  }
  EXPECT_LE(e_dv, 2 * u) << "dv";
  const auto lse_row = [&](int64_t r) {
    std::ostringstream os;
    os << "(b=" << r / (c.H * c.T) << " h=" << (r / c.T) % c.H << " t=" << r % c.T << ")";
    return os.str();
  };
  expect_rows_close(g_lse, lse, 1, "lse", lse_row);
  // Every element written (the outputs started as NaN).
  EXPECT_EQ(std::count_if(g_out.begin(), g_out.end(), [](float x) { return std::isnan(x); }), 0) << "out";
  EXPECT_EQ(std::count_if(g_dqkv.begin(), g_dqkv.end(), [](float x) { return std::isnan(x); }), 0) << "dqkv";

  expect_same_bits(g.dqkv_again, g.dqkv);
}

std::vector<MmaParam> mma_params() {
  const Case cases[] = {
      {2, 37, 3, 64},   // ragged T inside one 64-row tile
      {1, 128, 4, 64},  // two tiles, aligned
      {2, 1, 2, 64},    // T = 1
      {1, 200, 2, 128}, // the largest D, four tiles, the last ragged
      {1, 97, 1, 128},  // one head; key tiles of 32 and 64 both ragged
      {2, 70, 8, 64, 2},   // grouped-query attention: 2 groups of 4 heads
      {1, 97, 3, 128, 1},  // multi-query, ragged tiles
      // sliding windows: the forward and dQ start at the window's key tile, dK/dV stop after it
      {1, 300, 2, 64, 0, 70},
      {2, 70, 8, 64, 2, 20},
      {1, 200, 1, 128, 0, 100},
  };
  std::vector<MmaParam> ps;
  for (Format f : {Format::kBf16, Format::kFp16})
    for (const Case& c : cases)
      for (Variant v : {Variant::kPlain, Variant::kDropout, Variant::kDocuments, Variant::kDocumentsDropout})
        ps.push_back({c, v, f});
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionMma, ::testing::ValuesIn(mma_params()), mma_name_of);

// Head dims the tensor-core kernels do not take fall back to the fp32 kernels: bf16 math
// with D=40 gives the CPU's fp32 result (to kTol).
TEST(CudaAttentionMmaFallback, OtherHeadDimsRunInFp32) {
  LATTICE_REQUIRE_CUDA();
  const Case c{1, 45, 2, 40};
  const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
  const size_t n_qkv = size_t(c.B * c.T * s.layout().width()), n_out = size_t(c.B * c.T * c.H * c.D);
  const size_t n_lse = size_t(c.B * c.H * c.T);
  const auto qkv = random_floats(n_qkv, 31, -1.5f, 1.5f);
  std::vector<float> out(n_out), lse(n_lse);
  attention_forward(out.data(), lse.data(), qkv.data(), s, AttentionDropout{});
  auto d_qkv = upload(qkv);
  EXPECT_FALSE(cuda::attention_mma_supported(s, d_qkv.data(), d_qkv.data(), d_qkv.data()));
  cuda::DeviceBuffer d_out(n_out * sizeof(float)), d_lse(n_lse * sizeof(float));
  cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), s, AttentionDropout{}, nullptr,
                          AttentionMath::bf16);
  const auto g_out = download<float>(d_out, n_out);
  expect_rows_close(g_out, out, c.D, "out", [](int64_t r) { return "row " + std::to_string(r); });
}

// bf16 operands (the QKV layer's GEMM result y with its bias, AttentionOperand::packed, and
// a bf16 output gradient) give the bits of their fp32 values (y + bias) in every kernel: the
// fp32 ones (math fp32, and bf16 with D = 40) and the tensor-core ones; with dropout and
// documents, with and without bias. The optional bf16 dqkv is the cast of the fp32 one.
TEST(CudaAttentionPacked, SameBitsAsTheFp32Input) {
  LATTICE_REQUIRE_CUDA();
  for (AttentionMath math : {AttentionMath::fp32, AttentionMath::bf16, AttentionMath::fp16})
    for (const Case& c : {Case{2, 37, 3, 64}, Case{1, 45, 2, 40}, Case{1, 97, 1, 128}, Case{2, 37, 4, 64, 2}})
      for (bool with_bias : {true, false}) {
        const std::string what = "math " + std::to_string(int(math)) + " B" + std::to_string(c.B) + " T" +
                                 std::to_string(c.T) + " H" + std::to_string(c.H) + " D" + std::to_string(c.D) +
                                 (with_bias ? "" : " no bias");
        const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
        const AttentionDropout drop = tensor_parallel_rank1_dropout(c.H);
        const auto docs = document_ids(c.B, c.T, 5);
        const size_t n_qkv = size_t(c.B * c.T * s.layout().width()), n_out = size_t(c.B * c.T * c.H * c.D);
        const size_t n_lse = size_t(c.B * c.H * c.T), row = size_t(s.layout().width());
        std::vector<uint16_t> y(n_qkv);
        cast_fp32_to_bf16(y.data(), random_floats(n_qkv, 41, -1.5f, 1.5f).data(), int64_t(n_qkv));
        const auto bias = random_floats(row, 42, -0.5f, 0.5f);
        std::vector<float> wide(n_qkv);
        for (size_t k = 0; k < n_qkv; ++k) wide[k] = bf16_to_fp32(y[k]) + (with_bias ? bias[k % row] : 0.0f);
        std::vector<uint16_t> dout16(n_out);
        cast_fp32_to_bf16(dout16.data(), random_floats(n_out, 43, -1.0f, 1.0f).data(), int64_t(n_out));
        std::vector<float> dout(n_out);
        cast_bf16_to_fp32(dout.data(), dout16.data(), int64_t(n_out));
        auto d_wide = upload(wide), d_y = upload(y), d_bias = upload(bias), d_dout = upload(dout), d_docs = upload(docs);
        auto d_dout16 = upload(dout16);
        const AttentionOperand packed = AttentionOperand::packed(d_y.as<uint16_t>(), with_bias ? d_bias.as<float>() : nullptr);
        std::vector<float> results[2][3];
        cuda::DeviceBuffer d_dqkv16(n_qkv * 2), d_out16(n_out * 2);
        for (int k = 0; k < 2; ++k) {
          const AttentionOperand in = k == 0 ? AttentionOperand(d_wide.as<float>()) : packed;
          const AttentionOperand d =
              k == 0 ? AttentionOperand(d_dout.as<float>()) : AttentionOperand::in_bf16(d_dout16.as<uint16_t>());
          cuda::DeviceBuffer d_out(n_out * 4), d_lse(n_lse * 4), d_dqkv(n_qkv * 4);
          cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), in, s, drop, d_docs.as<int32_t>(), math,
                                  k == 1 ? d_out16.as<uint16_t>() : nullptr);
          cuda::attention_backward(d_dqkv.as<float>(), d, in, d_out.as<float>(), d_lse.as<float>(), s, drop,
                                   d_docs.as<int32_t>(), math, k == 1 ? d_dqkv16.as<uint16_t>() : nullptr);
          results[k][0] = download<float>(d_out, n_out);
          results[k][1] = download<float>(d_lse, n_lse);
          results[k][2] = download<float>(d_dqkv, n_qkv);
        }
        // The bf16 output gradient the second run also wrote: the cast of its fp32 one.
        std::vector<uint16_t> want16(n_qkv);
        cast_fp32_to_bf16(want16.data(), results[1][2].data(), int64_t(n_qkv));
        const auto got16 = download<uint16_t>(d_dqkv16, n_qkv);
        EXPECT_EQ(0, std::memcmp(got16.data(), want16.data(), n_qkv * 2)) << what << ": the bf16 dqkv";
        // And the bf16 output the forward wrote: the cast of its fp32 output.
        std::vector<uint16_t> want_out16(n_out);
        cast_fp32_to_bf16(want_out16.data(), results[1][0].data(), int64_t(n_out));
        const auto got_out16 = download<uint16_t>(d_out16, n_out);
        EXPECT_EQ(0, std::memcmp(got_out16.data(), want_out16.data(), n_out * 2)) << what << ": the bf16 out";
        const char* names[] = {"out", "lse", "dqkv"};
        for (int t = 0; t < 3; ++t)
          EXPECT_EQ(0, std::memcmp(results[0][t].data(), results[1][t].data(), results[0][t].size() * 4))
              << what << ": " << names[t] << " differs between the packed and the fp32 input";
      }
}

// The QKV bias gradient summed by the backward (dbias): the column sums of the fp32 dqkv a
// backward without it writes. The fp32 kernels (math fp32, and D = 40) write dqkv and sum it
// with bias_backward: the same bits. The tensor-core kernels sum each 64-row tile as they
// finish it and never store dqkv: the same sums in another order, within the float bound of
// a sum of that many terms (rows x 2^-24 x the column's sum of magnitudes; a missing or extra
// row is off by about 1/rows of it). The bf16 dqkv is unchanged; T spans one to three tiles.
TEST(CudaAttentionBiasGrad, SumsTheFp32Gradient) {
  LATTICE_REQUIRE_CUDA();
  for (AttentionMath math : {AttentionMath::fp32, AttentionMath::bf16, AttentionMath::fp16})
    for (const Case& c : {Case{2, 37, 3, 64}, Case{1, 45, 2, 40}, Case{1, 97, 1, 128}, Case{2, 150, 2, 64},
                          Case{2, 150, 6, 64, 2}, Case{1, 45, 4, 40, 1}, Case{2, 150, 2, 64, 0, 30}}) {
      const std::string what = "math " + std::to_string(int(math)) + " B" + std::to_string(c.B) + " T" +
                               std::to_string(c.T) + " H" + std::to_string(c.H) + " D" + std::to_string(c.D);
      const AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
      const AttentionDropout drop = tensor_parallel_rank1_dropout(c.H);
      const auto docs = document_ids(c.B, c.T, 5);
      const int64_t rows = c.B * c.T, cols = s.layout().width();
      const size_t n_qkv = size_t(rows * cols), n_out = size_t(c.B * c.T * c.H * c.D), n_lse = size_t(c.B * c.H * c.T);
      auto d_qkv = upload(random_floats(n_qkv, 51, -1.5f, 1.5f)), d_dout = upload(random_floats(n_out, 52, -1.0f, 1.0f));
      auto d_docs = upload(docs);
      cuda::DeviceBuffer d_out(n_out * 4), d_lse(n_lse * 4), d_dqkv(n_qkv * 4), d_dqkv16(n_qkv * 2),
          d_dqkv16_b(n_qkv * 2);
      cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), s, drop, d_docs.as<int32_t>(),
                              math);
      cuda::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), d_out.as<float>(),
                               d_lse.as<float>(), s, drop, d_docs.as<int32_t>(), math, d_dqkv16.as<uint16_t>());
      const auto dqkv = download<float>(d_dqkv, n_qkv);
      const auto db0 = random_floats(size_t(cols), 53, -1.0f, 1.0f);
      auto d_db_ref = upload(db0), d_db = upload(db0);
      cuda::bias_backward(d_db_ref.as<float>(), d_dqkv.as<float>(), rows, cols);
      cuda::DeviceBuffer d_scratch(n_qkv * 4);
      cuda::attention_backward(d_scratch.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), d_out.as<float>(),
                               d_lse.as<float>(), s, drop, d_docs.as<int32_t>(), math, d_dqkv16_b.as<uint16_t>(),
                               d_db.as<float>());
      const auto db_ref = download<float>(d_db_ref, size_t(cols)), db = download<float>(d_db, size_t(cols));
      const auto g16 = download<uint16_t>(d_dqkv16, n_qkv), g16_b = download<uint16_t>(d_dqkv16_b, n_qkv);
      EXPECT_EQ(0, std::memcmp(g16.data(), g16_b.data(), n_qkv * 2)) << what << ": the bf16 dqkv";
      const bool tensor_cores = math != AttentionMath::fp32 && (c.D == 64 || c.D == 128);
      if (!tensor_cores) {
        EXPECT_EQ(0, std::memcmp(db.data(), db_ref.data(), db.size() * 4)) << what << ": dbias";
        continue;
      }
      int bad = 0;
      for (int64_t j = 0; j < cols; ++j) {
        double magnitude = std::fabs(db0[size_t(j)]);
        for (int64_t r = 0; r < rows; ++r) magnitude += std::fabs(dqkv[size_t(r * cols + j)]);
        if (std::fabs(double(db[size_t(j)]) - double(db_ref[size_t(j)])) > double(rows) * 0x1p-24 * magnitude &&
            bad++ < 3)
          ADD_FAILURE() << what << ": dbias[" << j << "] " << db[size_t(j)] << ", column sum " << db_ref[size_t(j)];
      }
      EXPECT_EQ(bad, 0) << what;
      // The sums have a term per row: a wrong tile or row count shows far above that bound.
      EXPECT_NE(0, std::memcmp(db.data(), db0.data(), db.size() * 4)) << what;
    }
}

// Context parallelism (ContextKeys): rank r of P attends its two chunks' queries to the whole
// sequence's gathered keys and values; the GPU's out, lse, query gradients and key/value gradients
// against the CPU kernel's on the same split, with dropout and grouped-query attention, in every
// math (the tensor-core paths hand context-parallel calls to the fp32 kernels).
TEST(CudaAttentionContext, EveryRankMatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  struct CpCase {
    int64_t B, Tk, H, G, D;
    int P;
    int64_t window = -1;
    bool documents = false;  // --reset-attention-mask: the queries' ids and the whole sequence's keys'
  };
  for (const CpCase c : {CpCase{2, 96, 4, 2, 32, 2}, CpCase{1, 200, 2, 2, 64, 4}, CpCase{2, 64, 3, 1, 16, 4},
                         CpCase{1, 200, 2, 1, 32, 2, 45}, CpCase{2, 128, 4, 2, 32, 2, -1, true},
                         CpCase{1, 200, 2, 1, 16, 4, 30, true}})
    for (int r = 0; r < c.P; ++r) {
      const int64_t chunk = c.Tk / (2 * c.P), T = 2 * chunk;
      const AttentionShape s{c.B, T, c.H, c.D, c.G, c.window};
      const QkvLayout L = s.layout();
      const std::string what = "B" + std::to_string(c.B) + " Tk" + std::to_string(c.Tk) + " P" +
                               std::to_string(c.P) + " window " + std::to_string(c.window) +
                               (c.documents ? " documents" : "") + " rank " + std::to_string(r);
      const AttentionDropout drop = tensor_parallel_rank1_dropout(c.H);
      const auto qkv = random_floats(size_t(c.B * T * L.width()), 21 + uint32_t(r), -1.5f, 1.5f);
      const auto kv = random_floats(size_t(c.B * c.Tk * 2 * L.G * c.D), 31, -1.5f, 1.5f);
      const auto dout = random_floats(size_t(c.B * T * c.H * c.D), 41 + uint32_t(r), -1.0f, 1.0f);
      std::vector<float> out(dout.size()), lse(size_t(c.B * c.H * T)), dqkv(qkv.size(), 0.0f), dkv(kv.size());
      ContextKeys keys;
      keys.Tk = c.Tk;
      keys.split = chunk;
      keys.shift[0] = r * chunk;
      keys.shift[1] = (2 * c.P - 1 - r) * chunk - chunk;
      keys.kv = kv.data();
      keys.dkv = dkv.data();
      // Document ids: the whole sequence's for the keys, each local row's at its position for the queries.
      const std::vector<int32_t> key_ids = c.documents ? document_ids(c.B, c.Tk, 47) : std::vector<int32_t>{};
      std::vector<int32_t> query_ids;
      for (int64_t b = 0; c.documents && b < c.B; ++b)
        for (int64_t i = 0; i < T; ++i) query_ids.push_back(key_ids[size_t(b * c.Tk + keys.position(i))]);
      const int32_t* doc = c.documents ? query_ids.data() : nullptr;
      keys.key_document_ids = c.documents ? key_ids.data() : nullptr;
      attention_forward(out.data(), lse.data(), qkv.data(), s, drop, doc, AttentionMath::fp32, nullptr, &keys);
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, drop, doc,
                         AttentionMath::fp32, nullptr, nullptr, &keys);
      for (AttentionMath math : {AttentionMath::fp32, AttentionMath::bf16}) {
        auto d_qkv = upload(qkv), d_kv = upload(kv), d_dout = upload(dout), d_out_cpu = upload(out),
             d_lse_cpu = upload(lse), d_dqkv = upload(std::vector<float>(qkv.size(), 0.0f));
        cuda::DeviceBuffer d_out(out.size() * sizeof(float)), d_lse(lse.size() * sizeof(float)),
            d_dkv(dkv.size() * sizeof(float));
        cuda::memset_device(d_dkv.data(), 0xff, d_dkv.size());  // every element written
        ContextKeys dk = keys;
        dk.kv = d_kv.as<float>();
        dk.dkv = d_dkv.as<float>();
        const cuda::DeviceBuffer d_key_ids = c.documents ? upload(key_ids) : cuda::DeviceBuffer(),
                                 d_query_ids = c.documents ? upload(query_ids) : cuda::DeviceBuffer();
        dk.key_document_ids = c.documents ? d_key_ids.as<int32_t>() : nullptr;
        const int32_t* d_doc = c.documents ? d_query_ids.as<int32_t>() : nullptr;
        cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), s, drop, d_doc, math,
                                nullptr, &dk);
        cuda::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), d_out_cpu.as<float>(),
                                 d_lse_cpu.as<float>(), s, drop, d_doc, math, nullptr, nullptr, &dk);
        const auto row = [&](int64_t k) { return what + " row " + std::to_string(k); };
        expect_rows_close(download<float>(d_out, out.size()), out, c.D, "out", row);
        expect_rows_close(download<float>(d_lse, lse.size()), lse, 1, "lse", row);
        expect_rows_close(download<float>(d_dqkv, qkv.size()), dqkv, c.D, "dq (key/value slots untouched)", row);
        expect_rows_close(download<float>(d_dkv, dkv.size()), dkv, c.D, "dkv", row);
      }
    }
}

// Attention sinks (AttentionShape::softmax_offset, --softmax-type): the fp32 kernels against the
// CPU's to kTol, the tensor-core kernels against the CPU on inputs rounded to the format (2u of each
// tensor's norm, as above), with and without a window and dropout; the sinks' gradient (computed
// apart from the kernels, the same for both) against the CPU's.
TEST(CudaAttentionSink, MatchesCpu) {
  LATTICE_REQUIRE_CUDA();
  struct SinkCase {
    int64_t B, T, H, D, G, window;
    bool dropout;
  };
  for (const SinkCase c : {SinkCase{2, 37, 4, 16, 2, -1, true}, SinkCase{1, 150, 2, 64, 0, 40, false},
                           SinkCase{2, 97, 4, 64, 2, -1, true}, SinkCase{1, 130, 2, 128, 1, 30, true}})
    for (AttentionMath math : {AttentionMath::fp32, AttentionMath::bf16}) {
      if (math == AttentionMath::bf16 && c.D != 64 && c.D != 128) continue;
      const std::string what = "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " D" + std::to_string(c.D) +
                               " window " + std::to_string(c.window) + (math == AttentionMath::bf16 ? " bf16" : " fp32");
      const std::vector<float> sink = random_floats(size_t(c.H), 81, -1.0f, 1.5f);
      AttentionShape s{c.B, c.T, c.H, c.D, c.G, c.window};
      s.softmax_offset = sink.data();
      const AttentionDropout drop = c.dropout ? tensor_parallel_rank1_dropout(c.H) : AttentionDropout{};
      const auto qkv = random_floats(size_t(c.B * c.T * s.layout().width()), 82, -1.5f, 1.5f);
      const auto dout = random_floats(size_t(c.B * c.T * c.H * c.D), 83, -1.0f, 1.0f);
      const bool bf16 = math == AttentionMath::bf16;
      const auto qkv_ref = bf16 ? rounded(qkv, false) : qkv, dout_ref = bf16 ? rounded(dout, false) : dout;
      std::vector<float> out(dout.size()), lse(size_t(c.B * c.H * c.T)), dqkv(qkv.size()), dsink(size_t(c.H), 0.25f);
      attention_forward(out.data(), lse.data(), qkv_ref.data(), s, drop);
      attention_backward(dqkv.data(), dout_ref.data(), qkv_ref.data(), out.data(), lse.data(), s, drop, nullptr,
                         AttentionMath::fp32, nullptr, nullptr, nullptr, dsink.data());

      auto d_qkv = upload(qkv), d_dout = upload(dout), d_sink = upload(sink), d_out_cpu = upload(out),
           d_lse_cpu = upload(lse), d_dsink = upload(std::vector<float>(size_t(c.H), 0.25f));
      cuda::DeviceBuffer d_out(out.size() * sizeof(float)), d_lse(lse.size() * sizeof(float)),
          d_dqkv(qkv.size() * sizeof(float));
      AttentionShape ds = s;
      ds.softmax_offset = d_sink.as<float>();
      cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_qkv.as<float>(), ds, drop, nullptr, math);
      cuda::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), d_out_cpu.as<float>(),
                               d_lse_cpu.as<float>(), ds, drop, nullptr, math, nullptr, nullptr, nullptr,
                               d_dsink.as<float>());
      const auto g_out = download<float>(d_out, out.size()), g_lse = download<float>(d_lse, lse.size());
      const auto g_dqkv = download<float>(d_dqkv, qkv.size()), g_dsink = download<float>(d_dsink, dsink.size());
      const auto row = [&](int64_t k) { return what + " row " + std::to_string(k); };
      expect_rows_close(g_lse, lse, 1, "lse", row);
      if (bf16) {  // the products' other operands rounded too: 2u of each tensor's norm
        const double u = 1.0 / 256;
        EXPECT_LE(relative_error(g_out, out, [](size_t) { return true; }), 2 * u) << what << ": out";
        EXPECT_LE(relative_error(g_dqkv, dqkv, [](size_t) { return true; }), 2 * u) << what << ": dqkv";
        EXPECT_LE(relative_error(g_dsink, dsink, [](size_t) { return true; }), 2 * u) << what << ": d softmax_offset";
      } else {
        expect_rows_close(g_out, out, c.D, "out", row);
        expect_rows_close(g_dqkv, dqkv, c.D, "dqkv", row);
        expect_rows_close(g_dsink, dsink, 1, "d softmax_offset", row);
      }
    }
}

// --attention-output-gate's layout (QkvLayout::gated, [B, T, G, 2R + 2, D]): the fp32 and the tensor-core
// kernels compute on it exactly what they compute on the same queries, keys and values without gates
// (the same bits of out, lse and the q, k, v gradients) and never write a gate's slot.
TEST(CudaAttentionGated, GatedQkvGivesTheUngatedResultsAndLeavesTheGates) {
  LATTICE_REQUIRE_CUDA();
  const int64_t B = 2, T = 40, H = 4, G = 2, D = 64;
  const AttentionShape plain{B, T, H, D, G};
  AttentionShape gated = plain;
  gated.gated = true;
  const QkvLayout Lp = plain.layout(), Lg = gated.layout();
  const int64_t N = B * T, R = Lp.R();
  const auto qkv = random_floats(size_t(N * Lp.width()), 61, -1.5f, 1.5f);
  const auto dout = random_floats(size_t(N * H * D), 62, -1.0f, 1.0f);
  const auto sentinel = random_floats(size_t(N * Lg.width()), 63, -1.0f, 1.0f);
  // plain [N, G, R + 2, D] -> gated [N, G, 2R + 2, D] (the rest of `into` kept)
  auto to_gated = [&](const std::vector<float>& p, std::vector<float> into) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) {
        const float* src = p.data() + n * Lp.width() + g * Lp.group_slots() * D;
        float* dst = into.data() + n * Lg.width() + g * Lg.group_slots() * D;
        std::copy(src, src + R * D, dst);
        std::copy(src + R * D, src + (R + 2) * D, dst + Lg.kv_slot(0, 1) * D);
      }
    return into;
  };
  const auto qkv_g = to_gated(qkv, sentinel);
  auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
    size_t n = a.size() == b.size() ? 0 : SIZE_MAX;
    for (size_t k = 0; k < a.size() && k < b.size(); ++k) n += std::memcmp(&a[k], &b[k], sizeof(float)) != 0;
    return n;
  };
  const AttentionDropout drop = tensor_parallel_rank1_dropout(H);
  for (const AttentionMath math : {AttentionMath::fp32, AttentionMath::bf16}) {
    const cuda::DeviceBuffer d_qkv = upload(qkv), d_qkv_g = upload(qkv_g), d_dout = upload(dout);
    cuda::DeviceBuffer out(size_t(N * H * D) * 4), lse(size_t(B * H * T) * 4), out_g(out.size()), lse_g(lse.size());
    cuda::attention_forward(out.as<float>(), lse.as<float>(), d_qkv.as<float>(), plain, drop, nullptr, math);
    cuda::attention_forward(out_g.as<float>(), lse_g.as<float>(), d_qkv_g.as<float>(), gated, drop, nullptr, math);
    const char* what = math == AttentionMath::fp32 ? "fp32" : "bf16";
    EXPECT_EQ(differing(download<float>(out, size_t(N * H * D)), download<float>(out_g, size_t(N * H * D))), 0u)
        << what << ": out";
    EXPECT_EQ(differing(download<float>(lse, size_t(B * H * T)), download<float>(lse_g, size_t(B * H * T))), 0u)
        << what << ": lse";
    cuda::DeviceBuffer d_dqkv = upload(std::vector<float>(qkv.size(), 0.0f)), d_dqkv_g = upload(sentinel);
    cuda::attention_backward(d_dqkv.as<float>(), d_dout.as<float>(), d_qkv.as<float>(), out.as<float>(),
                             lse.as<float>(), plain, drop, nullptr, math);
    cuda::attention_backward(d_dqkv_g.as<float>(), d_dout.as<float>(), d_qkv_g.as<float>(), out.as<float>(),
                             lse.as<float>(), gated, drop, nullptr, math);
    EXPECT_EQ(differing(to_gated(download<float>(d_dqkv, qkv.size()), sentinel),
                        download<float>(d_dqkv_g, sentinel.size())),
              0u)
        << what << ": dqkv (its gate slots must be left as they were)";
  }
}

TEST(CudaAttentionArgs, HeadDimAbove256IsRefused) {
  LATTICE_REQUIRE_CUDA();
  const AttentionShape s{1, 4, 1, 288};
  cuda::DeviceBuffer qkv(size_t(4 * 3 * 288) * sizeof(float)), out(size_t(4 * 288) * sizeof(float)),
      lse(4 * sizeof(float));
  EXPECT_THROW(cuda::attention_forward(out.as<float>(), lse.as<float>(), qkv.as<float>(), s,
                                       AttentionDropout{}),
               Error);
}

}  // namespace
}  // namespace lattice
