// The tensor-parallel kernels on one process: the vocabulary (or the heads) cut into P
// slices as P ranks hold them, with the group's reductions done by hand, against the
// whole-matrix kernels. Vocab-parallel cross entropy, vocab-parallel embedding and its
// backward, and attention dropout on a head range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels_test_util.h"

namespace lattice {
namespace {

using kernel_test::expect_close;
using kernel_test::numeric_grad;
using kernel_test::random_floats;
using kernel_test::to_double;

// Rank r of P holds the vocabulary columns [begin, begin + Vl) of Vp, `valid` of them real.
struct VocabSlice {
  int64_t begin, Vl, valid;
};

VocabSlice vocab_slice(int64_t r, int64_t P, int64_t V, int64_t Vp) {
  const int64_t Vl = Vp / P, begin = r * Vl;
  return {begin, Vl, std::clamp<int64_t>(V - begin, 0, Vl)};
}

// ---------------------------------------------------------------- cross entropy

// losses in double over the first V of Vp columns.
std::vector<double> ce_ref(const std::vector<double>& logits, const std::vector<int32_t>& t, int64_t N,
                           int64_t V, int64_t Vp) {
  std::vector<double> loss(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[n * Vp + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[n * Vp + v] - mx);
    loss[n] = std::log(s) + mx - logits[n * Vp + t[n]];
  }
  return loss;
}

struct CeResult {
  std::vector<float> losses;   // [N] (from the backward pass, store_exp)
  std::vector<float> dlogits;  // [N, Vp] the slices put back side by side
  std::vector<float> forward_losses;  // [N] from the forward-only pass (store_exp false)
};

// The three passes on each of P slices of logits [N, Vp]; the group's all-reduces (MAX
// of row_max, SUM of stats) done here in rank order.
CeResult vocab_parallel_ce(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                           const float* mask, float grad_scale, int64_t N, int64_t V, int64_t Vp, int64_t P) {
  std::vector<VocabSlice> sl;
  std::vector<std::vector<float>> local;  // P x [N, Vl]
  for (int64_t r = 0; r < P; ++r) {
    sl.push_back(vocab_slice(r, P, V, Vp));
    std::vector<float> x(static_cast<size_t>(N * sl[r].Vl));
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(&x[n * sl[r].Vl], &logits[n * Vp + sl[r].begin], size_t(sl[r].Vl) * sizeof(float));
    local.push_back(std::move(x));
  }
  // 1. row max, all-reduced MAX.
  std::vector<float> row_max(static_cast<size_t>(N), -INFINITY), part(static_cast<size_t>(N));
  for (int64_t r = 0; r < P; ++r) {
    vocab_parallel_ce_max(part.data(), local[r].data(), N, sl[r].valid, sl[r].Vl);
    for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], part[n]);
  }
  // 2. sum of exponentials and target logit, all-reduced SUM; forward-only and
  //    store_exp variants.
  std::vector<double> stats(static_cast<size_t>(2 * N), 0.0), fstats(stats), p2(stats);
  for (int64_t r = 0; r < P; ++r) {
    std::vector<float> copy = local[r];
    vocab_parallel_ce_partials(p2.data(), copy.data(), row_max.data(), targets.data(), sl[r].begin, N,
                               sl[r].valid, sl[r].Vl, false);
    EXPECT_EQ(copy, local[r]) << "store_exp = false must leave the logits alone";
    for (int64_t i = 0; i < 2 * N; ++i) fstats[i] += p2[i];
    vocab_parallel_ce_partials(p2.data(), local[r].data(), row_max.data(), targets.data(), sl[r].begin, N,
                               sl[r].valid, sl[r].Vl, true);
    for (int64_t i = 0; i < 2 * N; ++i) stats[i] += p2[i];
  }
  // 3. losses, then each slice's dlogits.
  CeResult res{std::vector<float>(static_cast<size_t>(N)), std::vector<float>(static_cast<size_t>(N * Vp)),
               std::vector<float>(static_cast<size_t>(N))};
  vocab_parallel_ce_loss(res.losses.data(), stats.data(), row_max.data(), N);
  vocab_parallel_ce_loss(res.forward_losses.data(), fstats.data(), row_max.data(), N);
  for (int64_t r = 0; r < P; ++r) {
    vocab_parallel_ce_backward(local[r].data(), stats.data(), targets.data(), mask, grad_scale, sl[r].begin, N,
                               sl[r].valid, sl[r].Vl);
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(&res.dlogits[n * Vp + sl[r].begin], &local[r][n * sl[r].Vl], size_t(sl[r].Vl) * sizeof(float));
  }
  return res;
}

struct CeCase {
  int64_t N, V, Vp;  // Vp divisible by 1, 2, 3 and 4
};

void PrintTo(const CeCase& c, std::ostream* os) { *os << "N=" << c.N << " V=" << c.V << " Vp=" << c.Vp; }

class KernelVocabParallelCrossEntropy : public ::testing::TestWithParam<CeCase> {};

// With V < Vp the padding lies in the last slices; some slices hold no real column
// (valid = 0: V=13 of Vp=24 and V=700 of Vp=1056 at P=3 and 4).
TEST_P(KernelVocabParallelCrossEntropy, SlicesMatchTheFusedKernelAndFiniteDifferences) {
  const auto [N, V, Vp] = GetParam();
  auto logits = random_floats(size_t(N * Vp), 41, -4.0f, 4.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V; v < Vp; ++v) logits[n * Vp + v] = 1e30f;  // padding must not matter
  logits[0] = 80.0f;                                               // large logit: stability
  logits[Vp + V - 1] = 60.0f;  // row 1's maximum in the last real column (a later slice)
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) targets[n] = int32_t((n * 31 + 7) % V);
  targets[2] = int32_t(V - 1);  // a target in the last real column
  std::vector<float> mask(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) mask[n] = n % 3 == 0 ? 0.0f : 1.0f;
  const float grad_scale = 0.25f;

  std::vector<float> fused = logits, fused_losses(static_cast<size_t>(N));
  cross_entropy_forward_backward(fused.data(), fused_losses.data(), targets.data(), mask.data(), grad_scale, N,
                                 V, Vp);

  // d/dlogits of sum_n loss_n * mask_n * grad_scale in double, at sampled coordinates.
  const std::vector<size_t> which = kernel_test::sample_indices(size_t(N * Vp), 400, 5);
  auto expected = numeric_grad(
      [&](const std::vector<double>& x) {
        auto l = ce_ref(x, targets, N, V, Vp);
        double s = 0.0;
        for (int64_t n = 0; n < N; ++n) s += l[n] * mask[n] * grad_scale;
        return s;
      },
      to_double(logits), which, 1e-4);
  for (size_t i : which)
    if (int64_t(i) % Vp >= V) expected[i] = 0.0;  // 1e30 padding: the gradient is 0
  const auto ref_losses = ce_ref(to_double(logits), targets, N, V, Vp);

  for (int64_t P : {1, 2, 3, 4}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    const CeResult r = vocab_parallel_ce(logits, targets, mask.data(), grad_scale, N, V, Vp, P);
    expect_close(r.losses, to_double(fused_losses), 1e-6, "losses vs fused");
    expect_close(r.dlogits, to_double(fused), 1e-6, "dlogits vs fused");
    EXPECT_EQ(r.forward_losses, r.losses) << "forward-only and store_exp passes";
    expect_close(r.losses, ref_losses, 2e-6, "losses vs double reference");
    expect_close(r.dlogits, expected, 1e-6, "dlogits vs finite differences", which);
    if (P == 1) {  // one rank runs the fused kernel's arithmetic
      EXPECT_EQ(r.losses, fused_losses);
      EXPECT_EQ(r.dlogits, fused);
    }
    for (int64_t n = 0; n < N; ++n) {
      double row = 0.0;
      for (int64_t v = 0; v < Vp; ++v) {
        const float d = r.dlogits[n * Vp + v];
        if (v >= V) ASSERT_EQ(d, 0.0f) << "padded column " << v << " of row " << n;
        if (mask[n] == 0.0f) ASSERT_EQ(d, 0.0f) << "masked row " << n;
        row += d;
      }
      EXPECT_NEAR(row, 0.0, 1e-6) << "softmax gradient row " << n << " sums to 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, KernelVocabParallelCrossEntropy,
                         ::testing::Values(CeCase{7, 13, 24}, CeCase{5, 23, 24}, CeCase{6, 700, 1056}));

TEST(KernelVocabParallelCrossEntropySlices, EmptySliceContributesNothing) {
  const int64_t N = 3, Vl = 8;
  auto x = random_floats(size_t(N * Vl), 42);
  std::vector<int32_t> targets = {0, 5, 2};
  std::vector<float> rmax(static_cast<size_t>(N));
  vocab_parallel_ce_max(rmax.data(), x.data(), N, 0, Vl);
  for (float m : rmax) EXPECT_EQ(m, -INFINITY);
  // Another rank's maximum; this rank (columns [16, 24), all padding) adds 0 to both sums.
  const std::vector<float> group_max = {1.0f, 2.0f, 3.0f};
  std::vector<double> stats(static_cast<size_t>(2 * N), 9.0);
  vocab_parallel_ce_partials(stats.data(), x.data(), group_max.data(), targets.data(), 16, N, 0, Vl, true);
  for (double s : stats) EXPECT_EQ(s, 0.0);
  const std::vector<double> group_stats = {2.0, 0.5, 3.0, 1.0, 4.0, -1.0};
  vocab_parallel_ce_backward(x.data(), group_stats.data(), targets.data(), nullptr, 1.0f, 16, N, 0, Vl);
  for (float d : x) EXPECT_EQ(d, 0.0f);
}

// ---------------------------------------------------------------- embedding

TEST(KernelVocabParallelEmbedding, SlicesSumToTheWholeLookup) {
  const int64_t V = 13, Vp = 24, C = 20, Pos = 9, N = 40;
  auto wte = random_floats(size_t(Vp * C), 51), wpe = random_floats(size_t(Pos * C), 52);
  std::vector<int32_t> tokens(static_cast<size_t>(N)), positions(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = int32_t((n * 7 + 3) % V);  // repeated tokens, every slice with real rows hit
    positions[n] = int32_t(n % Pos);
  }
  std::vector<float> whole(static_cast<size_t>(N * C));
  embedding_forward(whole.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);

  for (int64_t P : {1, 2, 3, 4}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    std::vector<float> sum(static_cast<size_t>(N * C), 0.0f), out(static_cast<size_t>(N * C), 7.0f);
    for (int64_t r = 0; r < P; ++r) {
      const VocabSlice s = vocab_slice(r, P, V, Vp);
      vocab_parallel_embedding_forward(out.data(), tokens.data(), wte.data() + s.begin * C, s.begin, s.Vl, N, C);
      for (int64_t n = 0; n < N; ++n) {
        const bool mine = tokens[n] >= s.begin && tokens[n] < s.begin + s.Vl;
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(out[n * C + c], mine ? wte[tokens[n] * C + c] : 0.0f)
              << "rank " << r << " row " << n << " (token " << tokens[n] << ")";
      }
      for (int64_t i = 0; i < N * C; ++i) sum[i] += out[i];  // the group's all-reduce
    }
    position_embedding_add(sum.data(), positions.data(), wpe.data(), N, C);
    EXPECT_EQ(sum, whole);
  }
}

TEST(KernelVocabParallelEmbedding, BackwardFillsEachSlicesRowsOfTheWholeGradient) {
  const int64_t V = 13, Vp = 24, C = 70, Pos = 9, N = 40;
  auto dout = random_floats(size_t(N * C), 53);
  std::vector<int32_t> tokens(static_cast<size_t>(N)), positions(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    tokens[n] = int32_t((n * n + 5) % V);
    positions[n] = int32_t(n % Pos);
  }
  // Accumulates: both start from the same values.
  const auto init_te = random_floats(size_t(Vp * C), 54), init_pe = random_floats(size_t(Pos * C), 55);
  std::vector<float> whole_te = init_te, whole_pe = init_pe;
  embedding_backward(whole_te.data(), whole_pe.data(), dout.data(), tokens.data(), positions.data(), N, C);

  const float guard = -123.0f;
  for (int64_t P : {1, 2, 3, 4}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    for (int64_t r = 0; r < P; ++r) {
      const VocabSlice s = vocab_slice(r, P, V, Vp);
      // [guard row, Vl rows, guard row]: nothing outside the slice's rows is written.
      std::vector<float> te(static_cast<size_t>((s.Vl + 2) * C), guard);
      std::copy(init_te.begin() + s.begin * C, init_te.begin() + (s.begin + s.Vl) * C, te.begin() + C);
      std::vector<float> pe = init_pe;
      embedding_backward(te.data() + C, pe.data(), dout.data(), tokens.data(), positions.data(), N, C, s.begin,
                         s.Vl);
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_EQ(te[c], guard) << "rank " << r << " wrote before its rows";
        ASSERT_EQ(te[(s.Vl + 1) * C + c], guard) << "rank " << r << " wrote after its rows";
      }
      const std::vector<float> mine(te.begin() + C, te.begin() + (s.Vl + 1) * C);
      const std::vector<float> want(whole_te.begin() + s.begin * C, whole_te.begin() + (s.begin + s.Vl) * C);
      EXPECT_EQ(mine, want) << "rank " << r << " rows [" << s.begin << ", " << s.begin + s.Vl << ")";
      EXPECT_EQ(pe, whole_pe) << "every rank gets the whole position gradient";
    }
  }
}

// ---------------------------------------------------------------- attention heads

// Heads [h0, h0 + Hl) of qkv [B, T, H, 3, D] (or of out [B, T, H, D] with per_head = D).
std::vector<float> head_slice(const std::vector<float>& x, int64_t BT, int64_t H, int64_t per_head, int64_t h0,
                              int64_t Hl) {
  std::vector<float> y(static_cast<size_t>(BT * Hl * per_head));
  for (int64_t i = 0; i < BT; ++i)
    std::memcpy(&y[i * Hl * per_head], &x[(i * H + h0) * per_head], size_t(Hl * per_head) * sizeof(float));
  return y;
}

// lse [B, H, T] -> heads [h0, h0 + Hl).
std::vector<float> lse_slice(const std::vector<float>& lse, int64_t B, int64_t H, int64_t T, int64_t h0, int64_t Hl) {
  std::vector<float> y(static_cast<size_t>(B * Hl * T));
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(&y[b * Hl * T], &lse[(b * H + h0) * T], size_t(Hl * T) * sizeof(float));
  return y;
}

TEST(KernelAttentionHeadOffset, HeadRangeWithDropoutMatchesTheWholeHeads) {
  const int64_t B = 2, T = 70, H = 4, D = 8;
  const AttentionShape whole{B, T, H, D};
  AttentionDropout drop;
  drop.p = 0.2f;
  drop.stream = PhiloxStream{2024, fnv1a32("attention-dropout"), 3, 1};
  drop.first_index = 5;
  const int64_t n_qkv = B * T * H * 3 * D, n_out = B * T * H * D;
  auto qkv = random_floats(size_t(n_qkv), 61, -1.5f, 1.5f), dout = random_floats(size_t(n_out), 62);
  std::vector<float> out(static_cast<size_t>(n_out)), lse(static_cast<size_t>(B * H * T)),
      dqkv(static_cast<size_t>(n_qkv));
  attention_forward(out.data(), lse.data(), qkv.data(), whole, drop);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), whole, drop);
  {  // The dropout is on: without it the output differs.
    std::vector<float> plain(static_cast<size_t>(n_out)), plain_lse(lse.size());
    attention_forward(plain.data(), plain_lse.data(), qkv.data(), whole, AttentionDropout{});
    EXPECT_NE(plain, out);
  }

  for (int64_t Hl : {1, 2}) {
    for (int64_t h0 = 0; h0 < H; h0 += Hl) {
      SCOPED_TRACE("heads [" + std::to_string(h0) + ", " + std::to_string(h0 + Hl) + ")");
      const AttentionShape part{B, T, Hl, D};
      const auto q = head_slice(qkv, B * T, H, 3 * D, h0, Hl), g = head_slice(dout, B * T, H, D, h0, Hl);
      AttentionDropout d = drop;
      d.total_heads = H;
      d.head_offset = h0;
      std::vector<float> o(static_cast<size_t>(B * T * Hl * D)), l(static_cast<size_t>(B * Hl * T)),
          dq(q.size(), 7.0f);
      attention_forward(o.data(), l.data(), q.data(), part, d);
      attention_backward(dq.data(), g.data(), q.data(), o.data(), l.data(), part, d);
      EXPECT_EQ(o, head_slice(out, B * T, H, D, h0, Hl)) << "out";
      EXPECT_EQ(l, lse_slice(lse, B, H, T, h0, Hl)) << "lse";
      EXPECT_EQ(dq, head_slice(dqkv, B * T, H, 3 * D, h0, Hl)) << "dqkv";
      if (h0 > 0) {  // without the offset the range draws another head's mask
        std::vector<float> wrong(o.size()), wl(l.size());
        attention_forward(wrong.data(), wl.data(), q.data(), part, drop);
        EXPECT_NE(wrong, o) << "total_heads/head_offset must change the mask";
      }
    }
  }
}

}  // namespace
}  // namespace lattice
