// The attention output gate (--attention-output-gate, kernels/attention_gate.h) and the gated QKV
// layout (kernels/qkv_layout.h): the gate's forward against its definition in double and its backward
// against finite differences; and every kernel that reads the fused qkv (attention forward and
// backward, the rotary embedding, the query/key norms, the KV cache) computing on a gated qkv exactly
// what it computes on the same queries, keys and values without gates, never touching the gates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/attention_gate.h"
#include "kernels/rope.h"
#include "kernels_test_util.h"
#include "model/qk_layernorm.h"
#include "model/rotary_embedding.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::project;
using kernel_test::random_floats;
using kernel_test::to_double;

TEST(QkvLayout, GatedGroupsHoldTheirQueriesGatesKeyAndValue) {
  const QkvLayout L{4, 2, 8, true};  // per group: q q gate gate k v
  EXPECT_EQ(L.group_slots(), 6);
  EXPECT_EQ(L.slots(), 12);
  EXPECT_EQ(L.width(), 96);
  const int64_t query[4] = {0, 1, 6, 7}, gate[4] = {2, 3, 8, 9}, key[4] = {4, 4, 10, 10};
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_EQ(L.slot(h, 0), query[h]) << h;
    EXPECT_EQ(L.gate_slot(h), gate[h]) << h;
    EXPECT_EQ(L.slot(h, 1), key[h]) << h;
    EXPECT_EQ(L.slot(h, 2), key[h] + 1) << h;
  }
  const bool rotated[12] = {true, true, false, false, true, false, true, true, false, false, true, false};
  for (int64_t s = 0; s < 12; ++s) EXPECT_EQ(L.query_or_key(s), rotated[s]) << s;
  const int64_t rope[6] = {0, 1, 4, 6, 7, 10};  // the H + G rotated vectors
  for (int64_t v = 0; v < 6; ++v) EXPECT_EQ(rope_slot(L, v), rope[v]) << v;
  // Without grouping: q, gate, k, v per head.
  const QkvLayout M{3, 3, 4, true};
  EXPECT_EQ(M.width(), 48);
  for (int64_t h = 0; h < 3; ++h) {
    EXPECT_EQ(M.slot(h, 0), 4 * h);
    EXPECT_EQ(M.gate_slot(h), 4 * h + 1);
    EXPECT_EQ(M.slot(h, 1), 4 * h + 2);
    EXPECT_EQ(M.slot(h, 2), 4 * h + 3);
    EXPECT_EQ(rope_slot(M, 2 * h), 4 * h);
    EXPECT_EQ(rope_slot(M, 2 * h + 1), 4 * h + 2);
  }
  // Without gates the layout is as before: q q k v per group.
  const QkvLayout U{4, 2, 8};
  EXPECT_EQ(U.width(), 64);
  EXPECT_EQ(U.slot(2, 0), 4);
  EXPECT_EQ(U.kv_slot(1, 2), 7);
}

// y = o sigmoid(g) in double, for the attention output o [N, H, D] and the gates of qkv.
std::vector<double> reference_gate(const std::vector<double>& o, const std::vector<double>& qkv, int64_t N,
                                   const QkvLayout& L) {
  std::vector<double> y(o.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < L.H; ++h)
      for (int64_t d = 0; d < L.D; ++d) {
        const double g = qkv[size_t(n * L.width() + L.gate_slot(h) * L.D + d)];
        const size_t at = size_t((n * L.H + h) * L.D + d);
        y[at] = o[at] / (1.0 + std::exp(-g));
      }
  return y;
}

struct GateCase {
  int64_t N, H, G, D;
  QkvLayout layout() const { return {H, G, D, true}; }
  std::string name() const {
    return "N" + std::to_string(N) + "_H" + std::to_string(H) + "_G" + std::to_string(G) + "_D" + std::to_string(D);
  }
};
const GateCase kGateCases[] = {{3, 4, 2, 5}, {2, 3, 3, 4}, {5, 4, 1, 3}};

TEST(AttentionOutputGate, ForwardIsTheOutputTimesTheSigmoidOfItsGate) {
  for (const GateCase& c : kGateCases) {
    const QkvLayout L = c.layout();
    const std::vector<float> o = random_floats(size_t(c.N * c.H * c.D), 1, -3.0f, 3.0f);
    const std::vector<float> qkv = random_floats(size_t(c.N * L.width()), 2, -6.0f, 6.0f);
    std::vector<float> y(o.size());
    attention_output_gate_forward(y.data(), o.data(), qkv.data(), c.N, L);
    expect_close(y, reference_gate(to_double(o), to_double(qkv), c.N, L), 1e-6, "gate forward " + c.name());
    std::vector<float> in_place = o;  // y may alias o
    attention_output_gate_forward(in_place.data(), in_place.data(), qkv.data(), c.N, L);
    EXPECT_TRUE(kernel_test::same_bits(in_place, y)) << c.name();
  }
}

TEST(AttentionOutputGate, BackwardMatchesFiniteDifferencesAndLeavesTheOtherSlots) {
  for (const GateCase& c : kGateCases) {
    const QkvLayout L = c.layout();
    const size_t n_out = size_t(c.N * c.H * c.D), n_qkv = size_t(c.N * L.width());
    const std::vector<float> o = random_floats(n_out, 3, -2.0f, 2.0f), qkv = random_floats(n_qkv, 4, -3.0f, 3.0f);
    const std::vector<float> dy = random_floats(n_out, 5), sentinel = random_floats(n_qkv, 6);
    std::vector<float> d_o(n_out), dqkv = sentinel;
    attention_output_gate_backward(d_o.data(), dqkv.data(), dy.data(), o.data(), qkv.data(), c.N, L);
    const std::vector<double> od = to_double(o), qd = to_double(qkv);
    const std::vector<double> want_do = numeric_grad(
        [&](const std::vector<double>& v) { return project(reference_gate(v, qd, c.N, L), dy); }, od);
    expect_close(d_o, want_do, 1e-5, "gate backward d_o " + c.name());
    const std::vector<double> want_dqkv = numeric_grad(
        [&](const std::vector<double>& v) { return project(reference_gate(od, v, c.N, L), dy); }, qd);
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t s = 0; s < L.slots(); ++s)
        for (int64_t d = 0; d < c.D; ++d) {
          const size_t at = size_t((n * L.slots() + s) * c.D + d);
          const bool gate = s % L.group_slots() >= L.R() && s % L.group_slots() < 2 * L.R();
          if (gate)
            EXPECT_NEAR(dqkv[at], want_dqkv[at], 1e-5 * (1 + std::fabs(want_dqkv[at]))) << c.name() << " " << at;
          else
            EXPECT_EQ(std::memcmp(&dqkv[at], &sentinel[at], sizeof(float)), 0) << c.name() << " slot " << s;
        }
    std::vector<float> in_place = dy, dqkv2 = sentinel;  // d_o may alias dy
    attention_output_gate_backward(in_place.data(), dqkv2.data(), in_place.data(), o.data(), qkv.data(), c.N, L);
    EXPECT_TRUE(kernel_test::same_bits(in_place, d_o)) << c.name();
    EXPECT_TRUE(kernel_test::same_bits(dqkv2, dqkv)) << c.name();
  }
}

TEST(AttentionOutputGate, AQkvWithoutGatesIsRefused) {
  std::vector<float> y(16), o(16), qkv(64), dqkv(64);
  EXPECT_THROW(attention_output_gate_forward(y.data(), o.data(), qkv.data(), 1, QkvLayout{2, 2, 8}), Error);
  EXPECT_THROW(
      attention_output_gate_backward(y.data(), dqkv.data(), o.data(), o.data(), qkv.data(), 1, QkvLayout{2, 2, 8}),
      Error);
}

// The same queries, keys and values with and without gates: plain [N, G, R + 2, D] and gated
// [N, G, 2R + 2, D] whose gates are random.
struct TwoLayouts {
  QkvLayout plain, gated;
  int64_t N;
  std::vector<float> x, xg;
  TwoLayouts(int64_t N_, int64_t H, int64_t G, int64_t D, uint32_t seed)
      : plain{H, G, D}, gated{H, G, D, true}, N(N_) {
    x = random_floats(size_t(N * plain.width()), seed, -2.0f, 2.0f);
    xg = random_floats(size_t(N * gated.width()), seed + 100, -2.0f, 2.0f);
    xg = to_gated(x, xg);
  }
  // Each (token, group) of a plain buffer copied into a gated one's query, key and value slots (its
  // gates kept).
  std::vector<float> to_gated(const std::vector<float>& p, std::vector<float> g) const {
    const int64_t R = plain.R(), D = plain.D;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t grp = 0; grp < plain.G; ++grp) {
        const float* src = p.data() + n * plain.width() + grp * plain.group_slots() * D;
        float* dst = g.data() + n * gated.width() + grp * gated.group_slots() * D;
        std::memcpy(dst, src, size_t(R * D) * sizeof(float));
        std::memcpy(dst + gated.kv_slot(0, 1) * D, src + plain.kv_slot(0, 1) * D, size_t(2 * D) * sizeof(float));
      }
    return g;
  }
};

TEST(GatedQkv, AttentionReadsAndWritesOnlyTheQueriesKeysAndValues) {
  const int64_t B = 2, T = 7, H = 4, G = 2, D = 8;
  const TwoLayouts q(B * T, H, G, D, 11);
  for (const int64_t window : {int64_t(-1), int64_t(3)}) {
    AttentionShape s{B, T, H, D, G, window};
    const AttentionDropout drop{0.2f, PhiloxStream{7, 3}};
    std::vector<float> out(size_t(B * T * H * D)), lse(size_t(B * H * T)), out_g(out.size()), lse_g(lse.size());
    attention_forward(out.data(), lse.data(), q.x.data(), s, drop);
    AttentionShape sg = s;
    sg.gated = true;
    attention_forward(out_g.data(), lse_g.data(), q.xg.data(), sg, drop);
    EXPECT_TRUE(kernel_test::same_bits(out, out_g)) << "window " << window;
    EXPECT_TRUE(kernel_test::same_bits(lse, lse_g)) << "window " << window;
    const std::vector<float> dout = random_floats(out.size(), 12);
    const std::vector<float> sentinel = random_floats(q.xg.size(), 13);
    std::vector<float> dqkv(q.x.size()), dqkv_g = sentinel;
    attention_backward(dqkv.data(), dout.data(), q.x.data(), out.data(), lse.data(), s, drop);
    attention_backward(dqkv_g.data(), dout.data(), q.xg.data(), out.data(), lse.data(), sg, drop);
    // The gradients in the query, key and value slots; the gates' slots as they were.
    EXPECT_TRUE(kernel_test::same_bits(q.to_gated(dqkv, sentinel), dqkv_g)) << "window " << window;
    std::vector<float> dbias(size_t(q.gated.width()));
    EXPECT_THROW(attention_backward(dqkv_g.data(), dout.data(), q.xg.data(), out.data(), lse.data(), sg, drop,
                                    nullptr, AttentionMath::fp32, nullptr, dbias.data()),
                 Error);
  }
}

TransformerConfig rope_config(int64_t H, int64_t D) {
  TransformerConfig cfg;
  cfg.num_layers = 1;
  cfg.num_attention_heads = H;
  cfg.hidden_size = H * D;
  cfg.vocab_size = 64;
  cfg.max_position_embeddings = 16;
  cfg.position_embedding_type = "rope";
  cfg.finalize();
  return cfg;
}

TEST(GatedQkv, TheRotaryEmbeddingTurnsOnlyQueriesAndKeys) {
  const int64_t B = 2, T = 5, H = 4, G = 2, D = 8;
  const TwoLayouts q(B * T, H, G, D, 21);
  const RotaryEmbedding rope(rope_config(H, D), 16);
  std::vector<float> x = q.x, xg = q.xg;
  rope_forward(x.data(), rope.table(), B * T, T, 0, q.plain);
  rope_forward(xg.data(), rope.table(), B * T, T, 0, q.gated);
  EXPECT_TRUE(kernel_test::same_bits(q.to_gated(x, q.xg), xg));
  rope_backward(x.data(), rope.table(), B * T, T, q.plain);
  rope_backward(xg.data(), rope.table(), B * T, T, q.gated);
  EXPECT_TRUE(kernel_test::same_bits(q.to_gated(x, q.xg), xg));
}

TEST(GatedQkv, TheQueryAndKeyNormsNormalizeOnlyQueriesAndKeys) {
  const int64_t N = 6, H = 4, G = 2, D = 8;
  const TwoLayouts q(N, H, G, D, 31);
  const std::vector<float> p = random_floats(size_t(4 * D), 32, -1.5f, 1.5f);
  const QkNormParams params{p.data(), p.data() + D, p.data() + 2 * D, p.data() + 3 * D};
  const size_t rows = size_t(qk_norm_rows(N, q.plain));
  struct Run {
    std::vector<float> raw, mean, rstd, tmp, dx, grads;
  };
  auto buffers = [&] {
    return Run{std::vector<float>(rows * D), std::vector<float>(rows), std::vector<float>(rows),
               std::vector<float>(rows * D), std::vector<float>(rows * D), std::vector<float>(size_t(4 * D))};
  };
  Run a = buffers(), b = buffers();
  std::vector<float> x = q.x, xg = q.xg;
  qk_layernorm_forward(x.data(), a.raw.data(), a.mean.data(), a.rstd.data(), a.tmp.data(), params, N, q.plain, 1e-5f,
                       Normalization::layernorm);
  qk_layernorm_forward(xg.data(), b.raw.data(), b.mean.data(), b.rstd.data(), b.tmp.data(), params, N, q.gated, 1e-5f,
                       Normalization::layernorm);
  EXPECT_TRUE(kernel_test::same_bits(q.to_gated(x, q.xg), xg));
  std::vector<float> dx = random_floats(q.x.size(), 33), dxg = q.to_gated(dx, q.xg);
  auto grads = [](Run& r, int64_t d) {
    return QkNormGrads{r.grads.data(), r.grads.data() + d, r.grads.data() + 2 * d, r.grads.data() + 3 * d};
  };
  qk_layernorm_backward(dx.data(), grads(a, D), a.raw.data(), a.mean.data(), a.rstd.data(), params, a.tmp.data(),
                        a.dx.data(), N, q.plain, Normalization::layernorm);
  qk_layernorm_backward(dxg.data(), grads(b, D), b.raw.data(), b.mean.data(), b.rstd.data(), params, b.tmp.data(),
                        b.dx.data(), N, q.gated, Normalization::layernorm);
  EXPECT_TRUE(kernel_test::same_bits(q.to_gated(dx, q.xg), dxg));
  EXPECT_TRUE(kernel_test::same_bits(a.grads, b.grads));
}

TEST(GatedQkv, TheKvCacheKeepsTheKeysAndValuesAndAttendsAsWithout) {
  const int64_t H = 4, G = 2, D = 8, Tmax = 12, n = 5;
  const TwoLayouts q(n, H, G, D, 41);
  std::vector<float> k(size_t(G * Tmax * D)), v(k.size()), kg(k.size()), vg(k.size());
  kv_cache_append(k.data(), v.data(), q.x.data(), n, 2, q.plain, Tmax);
  kv_cache_append(kg.data(), vg.data(), q.xg.data(), n, 2, q.gated, Tmax);
  EXPECT_TRUE(kernel_test::same_bits(k, kg));
  EXPECT_TRUE(kernel_test::same_bits(v, vg));
  std::vector<float> out(size_t(n * H * D)), out_g(out.size());
  cached_attention_forward(out.data(), q.x.data(), k.data(), v.data(), n, 2, q.plain, Tmax);
  cached_attention_forward(out_g.data(), q.xg.data(), kg.data(), vg.data(), n, 2, q.gated, Tmax);
  EXPECT_TRUE(kernel_test::same_bits(out, out_g));
}

}  // namespace
}  // namespace lattice
