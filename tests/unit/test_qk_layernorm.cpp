// --qk-layernorm's norm of every query and key head (model/qk_layernorm.h): the forward
// against a double-precision per-head norm written here, straight from Megatron's definition
// (each head's D values normalized, q_layernorm's parameters on the queries, k_layernorm's on
// the keys, the values untouched), and the backward (the input gradient and the four
// parameter gradients) against finite differences of that reference, for LayerNorm and
// RMSNorm, with and without grouped-query attention.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels_test_util.h"
#include "model/qk_layernorm.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

struct Case {
  int64_t N, H, G, D;
  Normalization kind;
  QkvLayout layout() const { return {H, G, D}; }
  size_t size() const { return size_t(N * layout().width()); }
  std::string name() const {
    return "N" + std::to_string(N) + " H" + std::to_string(H) + " G" + std::to_string(G) + " D" + std::to_string(D) +
           (kind == Normalization::rmsnorm ? " rmsnorm" : " layernorm");
  }
};

const Case kCases[] = {{3, 4, 4, 8, Normalization::layernorm},
                       {3, 4, 2, 8, Normalization::layernorm},
                       {2, 6, 2, 5, Normalization::rmsnorm},
                       {4, 2, 1, 16, Normalization::rmsnorm}};
constexpr float kEps = 1e-5f;

// The parameters as one vector [q_w | q_b | k_w | k_b], D each.
struct Params {
  std::vector<float> v;
  explicit Params(int64_t D, uint32_t seed) : v(random_floats(size_t(4 * D), seed, -1.5f, 1.5f)) {}
  QkNormParams view(int64_t D) const { return {v.data(), v.data() + D, v.data() + 2 * D, v.data() + 3 * D}; }
};

// qkv [N, G, R + 2, D] with each query and key vector normalized in double; p as Params::v.
std::vector<double> reference(const Case& c, std::vector<double> x, const std::vector<double>& p) {
  const int64_t D = c.D, R = c.H / c.G;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t g = 0; g < c.G; ++g)
      for (int64_t s = 0; s <= R; ++s) {  // the group's R queries, then its key
        double* v = x.data() + ((n * c.G + g) * (R + 2) + s) * D;
        const double* w = p.data() + (s < R ? 0 : 2 * D);
        const double* b = w + D;
        double mean = 0, sq = 0;
        for (int64_t d = 0; d < D; ++d) mean += v[d];
        mean = c.kind == Normalization::rmsnorm ? 0.0 : mean / double(D);
        for (int64_t d = 0; d < D; ++d) sq += (v[d] - mean) * (v[d] - mean);
        const double rstd = 1.0 / std::sqrt(sq / double(D) + double(kEps));
        for (int64_t d = 0; d < D; ++d)
          v[d] = (v[d] - mean) * rstd * w[d] + (c.kind == Normalization::rmsnorm ? 0.0 : b[d]);
      }
  return x;
}

struct Buffers {
  std::vector<float> raw, mean, rstd, tmp, dx;
  explicit Buffers(const Case& c) {
    const size_t rows = size_t(qk_norm_rows(c.N, c.layout()));
    raw.resize(rows * size_t(c.D));
    tmp.resize(raw.size());
    dx.resize(raw.size());
    mean.resize(rows);
    rstd.resize(rows);
  }
};

// RMSNorm has no bias: the kernels get zeros (as the model passes them).
Params params_for(const Case& c, uint32_t seed) {
  Params p(c.D, seed);
  if (c.kind == Normalization::rmsnorm)
    for (int64_t d = 0; d < c.D; ++d) p.v[size_t(c.D + d)] = p.v[size_t(3 * c.D + d)] = 0.0f;
  return p;
}

TEST(QkLayerNorm, ForwardNormalizesEachQueryAndKeyHeadAndLeavesTheValues) {
  for (const Case& c : kCases) {
    const Params p = params_for(c, 3);
    const std::vector<float> x = random_floats(c.size(), 1, -2.0f, 3.0f);
    std::vector<float> y = x;
    Buffers b(c);
    qk_layernorm_forward(y.data(), b.raw.data(), b.mean.data(), b.rstd.data(), b.tmp.data(), p.view(c.D), c.N,
                         c.layout(), kEps, c.kind);
    const std::vector<double> want = reference(c, to_double(x), to_double(p.v));
    expect_close(y, want, 1e-5, "qk_layernorm_forward " + c.name());
    // The values are copied through bit for bit, and raw keeps the queries and keys as they were.
    const QkvLayout L = c.layout();
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t s = 0; s < L.slots(); ++s) {
        if (L.query_or_key(s)) continue;
        for (int64_t d = 0; d < c.D; ++d) {
          const size_t i = size_t((n * L.slots() + s) * c.D + d);
          ASSERT_EQ(y[i], x[i]) << c.name() << ": value slot " << s << " changed";
        }
      }
    double raw_sum = 0, qk_sum = 0;
    for (float v : b.raw) raw_sum += v;
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t s = 0; s < L.slots(); ++s)
        if (L.query_or_key(s))
          for (int64_t d = 0; d < c.D; ++d) qk_sum += x[size_t((n * L.slots() + s) * c.D + d)];
    EXPECT_NEAR(raw_sum, qk_sum, 1e-4) << c.name() << ": raw is not the queries and keys";
  }
}

// sum(R * f(x, p)) has the gradients qk_layernorm_backward makes from R: with respect to the
// queries and keys (the values' R passes through unchanged) and to the four parameters (which
// accumulate onto what the gradients held).
TEST(QkLayerNorm, BackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    const Params p = params_for(c, 5);
    const std::vector<float> x = random_floats(c.size(), 6, -2.0f, 3.0f), R = random_floats(c.size(), 7);
    std::vector<float> y = x;
    Buffers b(c);
    qk_layernorm_forward(y.data(), b.raw.data(), b.mean.data(), b.rstd.data(), b.tmp.data(), p.view(c.D), c.N,
                         c.layout(), kEps, c.kind);
    const std::vector<float> g0 = random_floats(size_t(4 * c.D), 8);  // gradients already held
    std::vector<float> g = g0, dqkv = R;
    const int64_t D = c.D;
    qk_layernorm_backward(dqkv.data(), QkNormGrads{g.data(), g.data() + D, g.data() + 2 * D, g.data() + 3 * D},
                          b.raw.data(), b.mean.data(), b.rstd.data(), p.view(D), b.tmp.data(), b.dx.data(), c.N,
                          c.layout(), c.kind);
    const std::vector<double> pd = to_double(p.v), xd = to_double(x);
    const std::vector<double> want_dx =
        numeric_grad([&](const std::vector<double>& v) { return project(reference(c, v, pd), R); }, xd);
    expect_close(dqkv, want_dx, 1e-5, "qk_layernorm_backward dqkv " + c.name());
    std::vector<double> want_g =
        numeric_grad([&](const std::vector<double>& v) { return project(reference(c, xd, v), R); }, pd);
    for (size_t i = 0; i < want_g.size(); ++i) want_g[i] += g0[i];
    if (c.kind == Normalization::rmsnorm)  // no biases: their gradients (a sink in the model) are not compared
      for (int64_t d = 0; d < D; ++d) want_g[size_t(D + d)] = g[size_t(D + d)], want_g[size_t(3 * D + d)] = g[size_t(3 * D + d)];
    expect_close(g, want_g, 1e-5, "qk_layernorm_backward parameter gradients " + c.name());
  }
}

TEST(QkLayerNorm, AnImpossibleLayoutIsRefused) {
  std::vector<float> x(64), raw(64), mean(8), rstd(8), tmp(64);
  const Params p(4, 1);
  EXPECT_THROW(qk_layernorm_forward(x.data(), raw.data(), mean.data(), rstd.data(), tmp.data(), p.view(4), 1,
                                    QkvLayout{3, 2, 4}, kEps, Normalization::layernorm),
               Error);
}

}  // namespace
}  // namespace lattice
