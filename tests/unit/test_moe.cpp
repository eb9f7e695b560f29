// The mixture-of-experts pieces (kernels/moe.h, model/moe_layer.h): the gather and combine
// kernels against loops written here, the routing (top-k with its tie rule, the softmax over
// the chosen logits, the slots grouped by expert, the load-balancing loss against its formula),
// the layer's gradients against finite differences, and the configuration's errors. The whole
// model against PyTorch is test_model_vs_torch.cpp's gpt_tiny_nobias_moe4.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/moe.h"
#include "kernels_test_util.h"
#include "model/moe_layer.h"
#include "model/transformer_config.h"

namespace lattice {
namespace {

using kernel_test::random_floats;

TEST(Moe, GatherAndCombineKernelsMatchLoops) {
  const int64_t N = 5, k = 2, C = 7, S = N * k;
  const std::vector<float> x = random_floats(size_t(N * C), 1), ye = random_floats(size_t(S * C), 2);
  const std::vector<float> w = random_floats(size_t(S), 3), dout = random_floats(size_t(N * C), 4);
  // token t's j-th slot: a permutation of the slots
  std::vector<int32_t> slot_of(static_cast<size_t>(S)), rows(static_cast<size_t>(S));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = int32_t((t * k + j) * 3 % S);
      slot_of[size_t(t * k + j)] = s;
      rows[size_t(s)] = int32_t(t);
    }
  std::vector<float> xe(static_cast<size_t>(S * C));
  moe_gather_rows(xe.data(), x.data(), rows.data(), S, C);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(xe[size_t(s * C + c)], x[size_t(rows[size_t(s)] * C + c)]);
  std::vector<float> out(size_t(N * C), 5.0f), acc = out;
  moe_combine(out.data(), ye.data(), slot_of.data(), w.data(), N, k, C, false);
  moe_combine(acc.data(), ye.data(), slot_of.data(), nullptr, N, k, C, true);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float want = 0.0f, want_acc = 5.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t s = slot_of[size_t(t * k + j)];
        want += w[size_t(s)] * ye[size_t(s * C + c)];
        want_acc += ye[size_t(s * C + c)];
      }
      ASSERT_EQ(out[size_t(t * C + c)], want);
      ASSERT_EQ(acc[size_t(t * C + c)], want_acc);
    }
  std::vector<float> d_ye(static_cast<size_t>(S * C)), d_w(static_cast<size_t>(S));
  moe_combine_backward(d_ye.data(), d_w.data(), dout.data(), ye.data(), w.data(), rows.data(), S, C);
  for (int64_t s = 0; s < S; ++s) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      const float d = dout[size_t(rows[size_t(s)] * C + c)];
      ASSERT_EQ(d_ye[size_t(s * C + c)], w[size_t(s)] * d);
      dot += double(d) * ye[size_t(s * C + c)];
    }
    EXPECT_NEAR(d_w[size_t(s)], dot, 1e-6);
  }
  // --moe-apply-probs-on-input's forms: the gather weighted (each product rounded on its own), and
  // the weights' gradient alone (d_ye null: not written).
  std::vector<float> xw(static_cast<size_t>(S * C));
  moe_gather_rows(xw.data(), x.data(), rows.data(), S, C, w.data());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(xw[size_t(s * C + c)], w[size_t(s)] * x[size_t(rows[size_t(s)] * C + c)]);
  std::vector<float> d_w2(static_cast<size_t>(S));
  moe_combine_backward(nullptr, d_w2.data(), dout.data(), ye.data(), nullptr, rows.data(), S, C);
  for (int64_t s = 0; s < S; ++s) EXPECT_NEAR(d_w2[size_t(s)], d_w[size_t(s)], 1e-6) << s;
}

MoeShape shape(int64_t E, int64_t k, float aux = 0.0f) {
  MoeShape s;
  s.E = E;
  s.k = k;
  s.C = 6;
  s.F = 5;
  s.aux_loss_coeff = aux;
  return s;
}

struct Routed {
  std::vector<float> buf;
  MoeState st;
  Routed(const std::vector<float>& logits, int64_t N, const MoeShape& s) : buf(size_t(moe_state_floats(N, s))) {
    moe_state_carve(st, buf.data(), N, s);
    moe_route(st, logits.data(), N, s);
  }
};

// Top-k of the logits, the lower expert first at a tie; softmax over the k chosen; slots by
// expert, tokens in order within one.
TEST(Moe, RoutingPicksTheTopKAndGroupsTheSlotsByExpert) {
  const int64_t N = 3, E = 4, k = 2;
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f,   // a tie: experts 1 then 2
                                     3.0f, 0.0f, 1.0f, 2.5f,    // 0, 3
                                     -2.0f, 1.5f, -3.0f, 0.0f};  // 1, 3
  Routed r(logits, N, shape(E, k));
  EXPECT_EQ(r.st.choice, (std::vector<int32_t>{1, 2, 0, 3, 1, 3}));
  EXPECT_FLOAT_EQ(r.st.gate_host[0], 0.5f);
  EXPECT_FLOAT_EQ(r.st.gate_host[2], 1.0f / (1.0f + std::exp(-0.5f)));
  EXPECT_FLOAT_EQ(r.st.gate_host[4] + r.st.gate_host[5], 1.0f);
  EXPECT_EQ(r.st.offsets, (std::vector<int64_t>{0, 1, 3, 4, 6}));  // counts 1, 2, 1, 2
  const std::vector<int32_t> rows(r.st.rows, r.st.rows + N * k);
  EXPECT_EQ(rows, (std::vector<int32_t>{1, 0, 2, 0, 1, 2}));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = r.st.slot_of[t * k + j];
      EXPECT_EQ(rows[size_t(s)], t);
      EXPECT_EQ(r.st.gate[s], r.st.gate_host[size_t(t * k + j)]);
      EXPECT_TRUE(s >= r.st.offsets[size_t(r.st.choice[size_t(t * k + j)])] &&
                  s < r.st.offsets[size_t(r.st.choice[size_t(t * k + j)]) + 1]);
    }
}

// --moe-router-pre-softmax: the gates are the softmax over all E at the k chosen (the same
// experts), not renormalized; --moe-router-topk-scaling-factor multiplies either kind.
TEST(Moe, PreSoftmaxAndScalingFactorGates) {
  const int64_t N = 2, E = 4, k = 2;
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, -1.0f, 3.0f, 0.0f, 1.0f, 2.5f};
  MoeShape s = shape(E, k);
  s.pre_softmax = true;
  s.scale = 2.5f;
  Routed pre(logits, N, s);
  s.pre_softmax = false;
  Routed post(logits, N, s);
  EXPECT_EQ(pre.st.choice, (std::vector<int32_t>{1, 2, 0, 3}));
  EXPECT_EQ(post.st.choice, pre.st.choice);
  for (int64_t t = 0; t < N; ++t) {
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(logits[size_t(t * E + e)]));
    const double l0 = logits[size_t(t * E + pre.st.choice[size_t(t * k)])];
    const double l1 = logits[size_t(t * E + pre.st.choice[size_t(t * k + 1)])];
    EXPECT_NEAR(pre.st.gate_host[size_t(t * k)], 2.5 * std::exp(l0) / z, 1e-6);
    EXPECT_NEAR(pre.st.gate_host[size_t(t * k + 1)], 2.5 * std::exp(l1) / z, 1e-6);
    EXPECT_NEAR(post.st.gate_host[size_t(t * k)], 2.5 / (1.0 + std::exp(l1 - l0)), 1e-6);
    EXPECT_NEAR(post.st.gate_host[size_t(t * k + 1)], 2.5 / (1.0 + std::exp(l0 - l1)), 1e-6);
  }
}

// --moe-router-score-function sigmoid: the k largest sigmoid scores (with the expert bias added for
// the choice only), their scores normalized to sum 1 as the gates (k = 1: the score itself); the
// load-balancing loss over the scores normalized over all E.
TEST(Moe, SigmoidScoresAndTheExpertBias) {
  const int64_t N = 2, E = 4;
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, -1.0f, 3.0f, 0.0f, 1.0f, 2.5f};
  auto sig = [&](int64_t t, int64_t e) { return 1.0 / (1.0 + std::exp(-double(logits[size_t(t * E + e)]))); };
  MoeShape s = shape(E, 2, 0.1f);
  s.sigmoid = true;
  Routed plain(logits, N, s);
  EXPECT_EQ(plain.st.choice, (std::vector<int32_t>{1, 2, 0, 3}));
  for (int64_t t = 0; t < N; ++t) {
    const int32_t a = plain.st.choice[size_t(2 * t)], b = plain.st.choice[size_t(2 * t + 1)];
    EXPECT_NEAR(plain.st.gate_host[size_t(2 * t)], sig(t, a) / (sig(t, a) + sig(t, b)), 1e-6);
    EXPECT_NEAR(plain.st.gate_host[size_t(2 * t + 1)], sig(t, b) / (sig(t, a) + sig(t, b)), 1e-6);
  }
  double want = 0;  // 0.1 E / (k N^2) sum_e (sum_t sig / sum_e' sig) count_e; counts 1, 1, 1, 1
  for (int64_t t = 0; t < N; ++t) {
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += sig(t, e);
    for (int64_t e = 0; e < E; ++e) want += sig(t, e) / z;
  }
  EXPECT_NEAR(plain.st.aux_loss, want * 0.1 * double(E) / (2.0 * double(N * N)), 1e-6);
  // A bias of +1 on expert 3 and -1 on expert 1: token 0 takes experts 3 and 2, token 1 experts 3
  // and 0; the gates are still the plain scores normalized.
  s.expert_bias = true;
  const std::vector<float> bias = {0.0f, -1.0f, 0.0f, 1.0f};
  std::vector<float> buf(static_cast<size_t>(moe_state_floats(N, s)));
  MoeState st;
  moe_state_carve(st, buf.data(), N, s);
  moe_route(st, logits.data(), N, s, bias.data());
  EXPECT_EQ(st.choice, (std::vector<int32_t>{3, 2, 3, 0}));
  // The load-balancing loss still counts the unbiased top 2 (1 and 2, 0 and 3): Megatron's
  // compute_routing_scores_for_aux_loss. The bias moved no token there.
  EXPECT_EQ(st.counts, (std::vector<double>{1, 1, 1, 1}));
  EXPECT_NEAR(st.aux_loss, plain.st.aux_loss, 1e-12);
  EXPECT_NEAR(st.gate_host[0], sig(0, 3) / (sig(0, 3) + sig(0, 2)), 1e-6);
  EXPECT_NEAR(st.gate_host[3], sig(1, 0) / (sig(1, 3) + sig(1, 0)), 1e-6);
  s.k = 1;  // one expert: its score, not normalized
  Routed one(logits, N, [&] { MoeShape o = s; o.expert_bias = false; return o; }());
  EXPECT_NEAR(one.st.gate_host[0], sig(0, 1), 1e-6);
}

// --moe-expert-capacity-factor 1 with 4 tokens, 2 experts, top-1: each expert keeps ceil(4 / 2) = 2;
// all four choose expert 0. The probs policy keeps the two largest gates (pre-softmax, so the gates
// differ), position the first two; the dropped have slot -1; the load-balancing counts are those
// before the drop.
TEST(Moe, CapacityDropsTokensByPolicy) {
  const int64_t N = 4, E = 2;
  const std::vector<float> logits = {0.1f, 0.0f, 3.0f, 0.0f, 0.5f, 0.0f, 2.0f, 0.0f};
  MoeShape s = shape(E, 1);
  s.pre_softmax = true;
  s.capacity_factor = 1.0;
  Routed probs(logits, N, s);
  EXPECT_EQ(probs.st.offsets, (std::vector<int64_t>{0, 2, 2}));
  EXPECT_EQ(probs.st.slot_of_host, (std::vector<int32_t>{-1, 0, -1, 1}));  // tokens 1 and 3 kept
  EXPECT_EQ(probs.st.counts, (std::vector<double>{4.0, 0.0}));
  s.drop_by_position = true;
  Routed position(logits, N, s);
  EXPECT_EQ(position.st.slot_of_host, (std::vector<int32_t>{0, 1, -1, -1}));
  s.capacity_factor = 2.0;  // room for all
  EXPECT_EQ(Routed(logits, N, s).st.slot_of_host, (std::vector<int32_t>{0, 1, 2, 3}));
}

// Group-limited routing: 8 experts in 4 groups of 2, the top 4 from the best 2 groups, a group
// scoring its 2 largest logits' sum. Plainly the token takes experts 0, 2, 3, 4 (logit 5 in group
// 0); by groups it takes groups 1 (4) and 2 (3) over group 0 (0), so experts 2, 3, 4, 5. The
// load-balancing loss counts the plain choice.
TEST(Moe, GroupLimitedRoutingPicksTheBestGroups) {
  const std::vector<float> logits = {5.0f, -5.0f, 2.0f, 2.0f, 1.5f, 1.4f, 0.0f, 0.0f};
  MoeShape s = shape(8, 4);
  EXPECT_EQ(Routed(logits, 1, s).st.choice, (std::vector<int32_t>{0, 2, 3, 4}));
  s.groups = 4;
  s.group_topk = 2;
  const Routed grouped(logits, 1, s);
  EXPECT_EQ(grouped.st.choice, (std::vector<int32_t>{2, 3, 4, 5}));
  // The load-balancing loss counts the plain top 4 (0, 2, 3, 4), as Megatron's does.
  EXPECT_EQ(grouped.st.counts, (std::vector<double>{1, 0, 1, 1, 1, 0, 0, 0}));
  s.group_topk = 3;  // groups 1, 2 and 0 (0 beats 3 at a tie by its index): experts 0, 2, 3, 4
  EXPECT_EQ(Routed(logits, 1, s).st.choice, (std::vector<int32_t>{0, 2, 3, 4}));
}

// Megatron's sinkhorn(): rows then columns rescaled until the column scales settle (1e-4 mean
// change): each column of the result sums to 1/E (the last update scales the columns) and each row
// to about 1/N (within the last update's change). On logits where one
// expert dominates every token, plain top-1 sends all tokens to it; the balanced choice sends
// one token to each expert.
TEST(Moe, SinkhornBalancesTheChoice) {
  const int64_t N = 4, E = 4;
  std::vector<float> logits(size_t(N * E));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e)  // expert 0 best for every token; token t's second best is expert t
      logits[size_t(t * E + e)] = e == 0 ? 3.0f : (e == t ? 2.0f + 0.1f * float(t) : 0.1f * float(e));
  const std::vector<float> b = sinkhorn(logits.data(), N, E);
  for (int64_t t = 0; t < N; ++t) {
    double row = 0;
    for (int64_t e = 0; e < E; ++e) row += b[size_t(t * E + e)];
    EXPECT_NEAR(row, 1.0 / double(N), 1e-4) << "row " << t;
  }
  for (int64_t e = 0; e < E; ++e) {
    double col = 0;
    for (int64_t t = 0; t < N; ++t) col += b[size_t(t * E + e)];
    EXPECT_NEAR(col, 1.0 / double(E), 1e-6) << "column " << e;
  }
  MoeShape s = shape(E, 1);
  s.sigmoid = true;  // sinkhorn's k = 1 gates: sigmoid of the chosen logit
  EXPECT_EQ(Routed(logits, N, s).st.choice, (std::vector<int32_t>{0, 0, 0, 0}));
  s.sinkhorn = true;
  const Routed balanced(logits, N, s);
  EXPECT_EQ(balanced.st.choice, (std::vector<int32_t>{0, 1, 2, 3}));
  for (int64_t t = 0; t < N; ++t) {
    const float l = logits[size_t(t * E + balanced.st.choice[size_t(t)])];
    EXPECT_NEAR(balanced.st.gate_host[size_t(t)], 1.0 / (1.0 + std::exp(-double(l))), 1e-6) << "token " << t;
  }
}

// E / (k n^2) sum_e (sum_t softmax(l_t)[e]) count_e over the rows [t0, t1) (n of them) of top-1 logits [*, E].
double switch_balance(const std::vector<float>& logits, int64_t t0, int64_t t1, int64_t E) {
  std::vector<double> count(static_cast<size_t>(E), 0.0), psum(static_cast<size_t>(E), 0.0);
  for (int64_t t = t0; t < t1; ++t) {
    double z = 0;
    int64_t best = 0;
    for (int64_t e = 0; e < E; ++e) {
      z += std::exp(double(logits[size_t(t * E + e)]));
      if (logits[size_t(t * E + e)] > logits[size_t(t * E + best)]) best = e;
    }
    for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += std::exp(double(logits[size_t(t * E + e)])) / z;
    count[size_t(best)] += 1;
  }
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += psum[size_t(e)] * count[size_t(e)];
  return sum * double(E) / double((t1 - t0) * (t1 - t0));
}

// Megatron's switch_load_balancing_loss_func: a E / (k N^2) sum_e (sum_t softmax(l_t)[e]) count_e.
TEST(Moe, LoadBalancingLossIsMegatronsFormula) {
  const int64_t N = 4, E = 3, k = 1;
  const std::vector<float> logits = random_floats(size_t(N * E), 9, -2.0f, 2.0f);
  Routed r(logits, N, shape(E, k, 0.1f));
  EXPECT_NEAR(r.st.aux_loss, 0.1 * switch_balance(logits, 0, N, E), 1e-6);
}

// seq_aux_loss (Megatron's sequence_load_balancing_loss_func): the formula over each sequence's rows
// (its own token counts and probabilities, N = T), averaged over the sequences.
TEST(Moe, SequenceLoadBalancingLossIsPerSequence) {
  const int64_t T = 3, Bs = 2, N = T * Bs, E = 3, k = 1;
  const std::vector<float> logits = random_floats(size_t(N * E), 19, -2.0f, 2.0f);
  MoeShape s = shape(E, k);
  s.aux_group = T;
  s.seq_aux_loss_coeff = 0.1f;
  Routed r(logits, N, s);
  double want = 0;
  for (int64_t b = 0; b < Bs; ++b) want += switch_balance(logits, b * T, (b + 1) * T, E) / double(Bs);
  EXPECT_NEAR(r.st.seq_balance, want, 1e-6);
  EXPECT_NEAR(r.st.aux_loss, 0.1 * want, 1e-7);
  // The micro-batch as one: another number, and with both listed their losses add.
  const double whole = switch_balance(logits, 0, N, E);
  EXPECT_NEAR(r.st.balance, whole, 1e-6);
  EXPECT_GT(std::fabs(whole - want), 1e-3);
  s.aux_loss_coeff = 0.02f;
  EXPECT_NEAR(Routed(logits, N, s).st.aux_loss, 0.1 * want + 0.02 * whole, 1e-7);
}

// global_aux_loss (Megatron's global-batch balancing): each micro-batch's loss weighs its
// probabilities by the expert counts of the step's micro-batches so far, averaged (the running sum
// over the micro-batch count), until the step's reset; with one micro-batch, the micro-batch's loss.
TEST(Moe, GlobalLoadBalancingLossAveragesTheStepsCounts) {
  const int64_t N = 4, E = 3, k = 1;
  const MoeShape s = shape(E, k);
  MoeGlobalBalance g;
  std::vector<double> running(static_cast<size_t>(E), 0.0);
  for (int64_t m = 0; m < 4; ++m) {
    if (m == 3) {  // a new step: the counts start again
      g.reset();
      std::fill(running.begin(), running.end(), 0.0);
    }
    const int64_t steps = m == 3 ? 1 : m + 1;
    const std::vector<float> logits = random_floats(size_t(N * E), uint32_t(60 + m), -2.0f, 2.0f);
    const Routed r(logits, N, s);
    std::vector<double> psum(static_cast<size_t>(E), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      int64_t best = 0;
      double z = 0;
      for (int64_t e = 0; e < E; ++e) {
        z += std::exp(double(logits[size_t(t * E + e)]));
        if (logits[size_t(t * E + e)] > logits[size_t(t * E + best)]) best = e;
      }
      running[size_t(best)] += 1.0;
      for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += std::exp(double(logits[size_t(t * E + e)])) / z;
    }
    std::vector<double> avg;
    double tokens = 0;
    const double got = moe_global_balance(avg, tokens, r.st, g, N, s, nullptr, nullptr);
    double want = 0;
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_DOUBLE_EQ(avg[size_t(e)], running[size_t(e)] / double(steps)) << "micro-batch " << m << " expert " << e;
      want += psum[size_t(e)] * running[size_t(e)] / double(steps);
    }
    EXPECT_EQ(tokens, double(N));
    EXPECT_NEAR(got, want * double(E) / double(N * N), 1e-6) << "micro-batch " << m;
    if (steps == 1) EXPECT_NEAR(got, switch_balance(logits, 0, N, E), 1e-6) << "micro-batch " << m;
  }
  EXPECT_EQ(g.steps, 1);
}

// The router z-loss (ST-MoE's, Megatron's z_loss_func): mean over the tokens of logsumexp(logits)^2.
TEST(Moe, ZLossIsTheMeanSquaredLogsumexp) {
  const int64_t N = 5, E = 4;
  const std::vector<float> logits = random_floats(size_t(N * E), 23, -3.0f, 3.0f);
  Routed r(logits, N, shape(E, 2));
  double want = 0;
  for (int64_t t = 0; t < N; ++t) {
    double z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(logits[size_t(t * E + e)]));
    want += std::log(z) * std::log(z) / double(N);
  }
  EXPECT_NEAR(r.st.z, want, 1e-6 * want);
}

TEST(Moe, NonFiniteLogitsAreAnError) {
  std::vector<float> logits = {1.0f, NAN, 0.0f, 2.0f};
  try {
    Routed r(logits, 2, shape(2, 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
}

// The layer's input and weight gradients against central differences of its forward (with the
// load-balancing loss's gradient: the objective is sum(R y) + aux).
TEST(Moe, LayerGradientsMatchFiniteDifferences) {
  struct Variant {
    bool swiglu, pre_softmax;
    float scale;
    int64_t Fs = 0;  // shared experts
    bool gate = false;
    bool sigmoid = false, bias = false;  // sigmoid scores, the expert bias
    int64_t k = 2;
    int64_t aux_group = 0;  // seq_aux_loss: sequences of this many rows
    double capacity = 0;    // --moe-expert-capacity-factor (2 of the 8 pairs per expert kept at 0.5)
    bool by_position = false;
    int64_t groups = 0, group_topk = 0;  // group-limited routing
    float z = 0.0f;                      // --moe-z-loss-coeff
    bool biases = false;                 // the router's and the experts' biases (add_bias_linear)
    GluForm form = {};                   // with swiglu: the gated unit's form
    float global = 0.0f;                 // global_aux_loss's coefficient (fixed averaged counts)
    bool probs_on_input = false;         // --moe-apply-probs-on-input (k = 1)
    float jitter = 0.0f;                 // --moe-input-jitter-eps (a training forward's noise)
    int64_t latent = 0;                  // --moe-latent-size (the experts' rows 4 wide, C 6)
  };
  for (const Variant var : {Variant{false, false, 1.0f}, Variant{true, false, 1.0f}, Variant{false, true, 1.0f},
                            Variant{true, true, 2.5f}, Variant{false, false, 1.5f}, Variant{false, false, 1.0f, 4},
                            Variant{true, true, 1.0f, 3, true}, Variant{false, false, 1.0f, 4, true},
                            Variant{false, false, 1.0f, 0, false, true}, Variant{true, false, 2.0f, 0, false, true, true},
                            Variant{false, false, 1.0f, 0, false, true, false, 1},
                            Variant{true, false, 1.0f, 0, false, false, false, 2, 2},
                            Variant{false, false, 1.0f, 0, false, true, true, 2, 2},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0.5},
                            Variant{true, true, 1.0f, 3, true, false, false, 2, 0, 0.5, true},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 3, 2},
                            Variant{false, false, 1.0f, 0, false, true, true, 2, 0, 0, false, 3, 2},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.3f},
                            Variant{true, false, 1.0f, 0, false, true, true, 2, 0, 0, false, 0, 0, 0.3f},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.0f, true},
                            Variant{true, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.0f, true,
                                    GluForm{kQuickGeluAlpha, 1.0f, 1.3f}},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.4f},
                            Variant{false, false, 1.0f, 0, false, true, true, 2, 2, 0.5, false, 0, 0, 0.0f, false, {},
                                    0.4f},
                            Variant{false, false, 1.0f, 0, false, true, false, 1, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.0f, true},
                            Variant{true, true, 1.0f, 3, true, false, false, 1, 0, 0, false, 0, 0, 0.0f, true, {},
                                    0.0f, true},
                            Variant{false, false, 1.0f, 0, false, true, true, 1, 0, 0.5, false, 0, 0, 0.0f, false, {},
                                    0.0f, true},
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.3f, false, {},
                                    0.0f, false, 0.4f},
                            Variant{true, true, 1.0f, 3, true, true, true, 2, 0, 0, false, 0, 0, 0.0f, true, {},
                                    0.0f, false, 0.3f},
                            Variant{false, false, 1.0f, 0, false, true, false, 1, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.0f, true, 0.5f},
                            // --moe-latent-size: plain; with sigmoid scores, the expert bias and gated shared
                            // experts (Nemotron-3-Super's form); with the gates on the input (k 1) and the
                            // router's jitter; SwiGLU with a capacity.
                            Variant{false, false, 1.0f, 0, false, false, false, 2, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.0f, false, 0.0f, 4},
                            Variant{false, false, 2.5f, 3, true, true, true, 2, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.0f, false, 0.0f, 4},
                            Variant{false, false, 1.0f, 0, false, true, false, 1, 0, 0, false, 0, 0, 0.0f, false, {},
                                    0.0f, true, 0.5f, 4},
                            Variant{true, false, 1.0f, 0, false, false, false, 2, 0, 0.5, false, 0, 0, 0.0f, false, {},
                                    0.0f, false, 0.0f, 3}}) {
    const bool swiglu = var.swiglu;
    MoeShape s = shape(3, var.k, 0.5f);
    s.glu = swiglu;
    s.glu_form = var.form;
    s.sigmoid = var.sigmoid;
    s.expert_bias = var.bias;
    s.aux_group = var.aux_group;
    if (var.aux_group > 0) s.seq_aux_loss_coeff = 0.3f;  // with the micro-batch's: their sum
    s.global_aux_loss_coeff = var.global;
    s.capacity_factor = var.capacity;
    s.groups = var.groups;
    s.group_topk = var.group_topk;
    s.z_loss_coeff = var.z;
    s.drop_by_position = var.by_position;
    const std::vector<float> expert_bias = {0.3f, -0.2f, 0.1f};
    s.pre_softmax = var.pre_softmax;
    s.scale = var.scale;
    s.Fs = var.Fs;
    s.shared_gate = var.gate;
    s.probs_on_input = var.probs_on_input;
    s.input_jitter_eps = var.jitter;
    s.L = var.latent;
    const int64_t N = 4, C = s.C, Ce = s.Ce(), F = s.F, F1 = s.F1(), E = s.E;
    std::vector<float> x = random_floats(size_t(N * C), 11, -1.5f, 1.5f), R = random_floats(size_t(N * C), 12);
    std::vector<float> router = random_floats(size_t(E * C), 13);
    std::vector<float> shared1 = random_floats(size_t(s.Fs1() * C), 14), shared2 = random_floats(size_t(C * s.Fs), 15);
    std::vector<float> sgate = random_floats(size_t(C), 16);
    std::vector<float> router_b = random_floats(size_t(E), 17);
    std::vector<float> latent1 = random_floats(size_t(s.L * C), 18), latent2 = random_floats(size_t(C * s.L), 19);
    std::vector<std::vector<float>> fc1, fc2, fc1_b, fc2_b;
    for (int64_t e = 0; e < E; ++e) {
      fc1.push_back(random_floats(size_t(F1 * Ce), uint32_t(20 + e)));
      fc2.push_back(random_floats(size_t(Ce * F), uint32_t(30 + e)));
      fc1_b.push_back(random_floats(size_t(F1), uint32_t(40 + e)));
      fc2_b.push_back(random_floats(size_t(C), uint32_t(50 + e)));
    }
    auto weights = [&] {
      MoeWeights w;
      w.router = router.data();
      if (var.biases) w.router_bias = router_b.data();
      for (int64_t e = 0; e < E; ++e) {
        w.fc1.push_back(fc1[size_t(e)].data());
        w.fc2.push_back(fc2[size_t(e)].data());
        if (!var.biases) continue;
        w.fc1_bias.push_back(fc1_b[size_t(e)].data());
        w.fc2_bias.push_back(fc2_b[size_t(e)].data());
      }
      w.fc1_site.resize(size_t(E));
      w.fc2_site.resize(size_t(E));
      if (s.Fs > 0) {
        w.shared_fc1 = shared1.data();
        w.shared_fc2 = shared2.data();
      }
      if (s.shared_gate) w.shared_gate = sgate.data();
      if (s.expert_bias) w.expert_bias = expert_bias.data();
      if (s.L > 0) {
        w.latent_fc1 = latent1.data();
        w.latent_fc2 = latent2.data();
      }
      if (var.jitter > 0.0f) {  // two runs of rows, as context parallelism's chunks are
        w.jitter_stream = PhiloxStream{77, 5, 2, 1};
        w.token_runs = {{0, 1, 10}, {1, N - 1, 250}};
      }
      return w;
    };
    std::vector<float> buf(static_cast<size_t>(moe_state_floats(N, s)));
    MoeState st;
    moe_state_carve(st, buf.data(), N, s);
    // global_aux_loss: the step's averaged counts so far (constants to the gradient), the micro-batch's
    // tokens on two data-parallel ranks.
    const std::vector<double> global_counts = {5.5, 7.0, 3.5};
    st.global_counts = global_counts.data();
    st.global_tokens = double(2 * N);
    auto objective = [&] {
      std::vector<float> y(static_cast<size_t>(N * C));
      moe_forward(y.data(), x.data(), st, weights(), N, s);
      double f = st.aux_loss + double(s.z_loss_coeff) * st.z;
      if (s.global_aux_loss_coeff > 0.0f) {  // g E / (k Nt^2) sum_e (sum_t p[t, e]) avg_e, this rank's tokens
        double sum = 0.0;
        for (int64_t t = 0; t < N; ++t)
          for (int64_t e = 0; e < E; ++e) sum += double(st.scores[size_t(t * E + e)]) * global_counts[size_t(e)];
        f += double(s.global_aux_loss_coeff) * double(E) * sum / (double(s.k) * st.global_tokens * st.global_tokens);
      }
      for (size_t i = 0; i < y.size(); ++i) f += double(y[i]) * R[i];
      return f;
    };
    objective();
    if (var.form.clamp > 0) {  // the clamps hold some of the gates and up projections (the CPU's buffers)
      int64_t held = 0;
      for (int64_t i = 0; i < N * s.k * F1; ++i) held += std::fabs(st.h[i]) > var.form.clamp;
      EXPECT_GT(held, 4);
    }
    // dx is written (NaN before: a kernel that added to it fails), the weights' gradients accumulated.
    std::vector<float> dx(static_cast<size_t>(N * C), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> g_router(router.size(), 0.0f);
    std::vector<float> g_shared1(shared1.size(), 0.0f), g_shared2(shared2.size(), 0.0f), g_sgate(sgate.size(), 0.0f);
    std::vector<float> g_router_b(router_b.size(), 0.0f);
    std::vector<float> g_latent1(latent1.size(), 0.5f), g_latent2(latent2.size(), -0.5f);  // accumulated onto
    std::vector<std::vector<float>> g1, g2, g1_b, g2_b;
    MoeGrads g;
    g.latent_fc1 = g_latent1.data();
    g.latent_fc2 = g_latent2.data();
    g.router = g_router.data();
    g.router_bias = g_router_b.data();
    g.shared_fc1 = g_shared1.data();
    g.shared_fc2 = g_shared2.data();
    g.shared_gate = g_sgate.data();
    for (int64_t e = 0; e < E; ++e) {
      g1.emplace_back(fc1[size_t(e)].size(), 0.0f);
      g2.emplace_back(fc2[size_t(e)].size(), 0.0f);
    }
    for (int64_t e = 0; e < E; ++e) {
      g1_b.emplace_back(fc1_b[size_t(e)].size(), 0.0f);
      g2_b.emplace_back(fc2_b[size_t(e)].size(), 0.0f);
    }
    for (int64_t e = 0; e < E; ++e) {
      g.fc1.push_back(g1[size_t(e)].data());
      g.fc2.push_back(g2[size_t(e)].data());
      if (!var.biases) continue;
      g.fc1_bias.push_back(g1_b[size_t(e)].data());
      g.fc2_bias.push_back(g2_b[size_t(e)].data());
    }
    std::vector<float> sbuf(static_cast<size_t>(moe_scratch_floats(N, s)));
    MoeScratch sc;
    moe_scratch_carve(sc, sbuf.data(), N, s);
    moe_backward(dx.data(), R.data(), x.data(), st, weights(), g, sc, N, s, 1.0f);
    // Central differences in fp32 arithmetic with a step large enough for it (the routing
    // stays the same: no near-ties in this data).
    auto check = [&](std::vector<float>& v, const std::vector<float>& got, const std::string& what) {
      for (size_t i = 0; i < v.size(); ++i) {
        const float v0 = v[i], h = 1e-2f;
        v[i] = v0 + h;
        const double fp = objective();
        v[i] = v0 - h;
        const double fm = objective();
        v[i] = v0;
        const double want = (fp - fm) / (2.0 * h);
        EXPECT_NEAR(got[i], want, 2e-3 * (1.0 + std::fabs(want)))
            << what << "[" << i << "] swiglu " << swiglu << " pre-softmax " << var.pre_softmax << " scale " << var.scale
            << " shared " << var.Fs << " gate " << var.gate << " sigmoid " << var.sigmoid << " bias " << var.bias
            << " k " << var.k << " aux group " << var.aux_group << " capacity " << var.capacity << " by position "
            << var.by_position << " z " << var.z << " biases " << var.biases << " alpha " << var.form.alpha
            << " global " << var.global << " probs on input " << var.probs_on_input << " jitter " << var.jitter
            << " latent " << var.latent;
      }
    };
    check(x, dx, "dx");
    check(router, g_router, "router");
    check(shared1, g_shared1, "shared fc1");
    check(shared2, g_shared2, "shared fc2");
    if (s.shared_gate) check(sgate, g_sgate, "shared gate");
    if (s.L > 0) {  // (the gradients were accumulated onto 0.5 and -0.5)
      for (float& v : g_latent1) v -= 0.5f;
      for (float& v : g_latent2) v += 0.5f;
      check(latent1, g_latent1, "fc1_latent_proj");
      check(latent2, g_latent2, "fc2_latent_proj");
    }
    for (int64_t e = 0; e < E; ++e) {
      check(fc1[size_t(e)], g1[size_t(e)], "fc1 of expert " + std::to_string(e));
      check(fc2[size_t(e)], g2[size_t(e)], "fc2 of expert " + std::to_string(e));
    }
    if (var.biases) {
      check(router_b, g_router_b, "router bias");
      for (int64_t e = 0; e < E; ++e) {
        check(fc1_b[size_t(e)], g1_b[size_t(e)], "fc1 bias of expert " + std::to_string(e));
        check(fc2_b[size_t(e)], g2_b[size_t(e)], "fc2 bias of expert " + std::to_string(e));
      }
    }
  }
}

// --moe-router-force-load-balancing: the routing reads the balance stream's standard normal draws (by
// token) in place of the router's logits, and the logits' gradient passes to the router unchanged (a
// straight-through estimator). So the router's weights change nothing of the forward, and a layer whose
// router makes exactly those logits (unit input rows, the draws as its weights) gives, forced or not,
// the same output, losses and every gradient, bit for bit.
TEST(Moe, ForcedBalanceRoutesByTheDrawsAndPassesTheGradient) {
  MoeShape s = shape(3, 2, 0.5f);
  s.z_loss_coeff = 0.2f;
  const int64_t N = 4, C = s.C, F = s.F, E = s.E;
  std::vector<float> x(static_cast<size_t>(N * C), 0.0f);
  for (int64_t t = 0; t < N; ++t) x[size_t(t * C + t)] = 1.0f;  // logits[t, e] = router[e, t]
  const std::vector<float> dy = random_floats(size_t(N * C), 61);
  std::vector<std::vector<float>> fc1, fc2;
  for (int64_t e = 0; e < E; ++e) {
    fc1.push_back(random_floats(size_t(F * C), uint32_t(62 + e)));
    fc2.push_back(random_floats(size_t(C * F), uint32_t(72 + e)));
  }
  const PhiloxStream stream{5, 6, 7, 8};
  const std::vector<MoeWeights::TokenRun> runs = {{0, 2, 7}, {2, 2, 31}};
  struct Run {
    std::vector<float> y, logits, dx, g_router;
    std::vector<std::vector<float>> g1, g2;
    double aux = 0, z = 0;
  };
  auto run = [&](bool forced, const std::vector<float>& router) {
    MoeShape sh = s;
    sh.force_balance = forced;
    MoeWeights w;
    w.router = router.data();
    for (int64_t e = 0; e < E; ++e) {
      w.fc1.push_back(fc1[size_t(e)].data());
      w.fc2.push_back(fc2[size_t(e)].data());
    }
    w.fc1_site.resize(size_t(E));
    w.fc2_site.resize(size_t(E));
    w.token_runs = runs;
    w.balance_stream = stream;
    std::vector<float> buf(static_cast<size_t>(moe_state_floats(N, sh)));
    std::vector<float> sbuf(static_cast<size_t>(moe_scratch_floats(N, sh)));
    MoeState st;
    moe_state_carve(st, buf.data(), N, sh);
    MoeScratch sc;
    moe_scratch_carve(sc, sbuf.data(), N, sh);
    Run r;
    r.y.resize(size_t(N * C));
    moe_forward(r.y.data(), x.data(), st, w, N, sh);
    r.logits = st.logits_host;
    r.aux = st.aux_loss;
    r.z = st.z;
    r.dx.resize(size_t(N * C));
    r.g_router.assign(router.size(), 0.0f);
    MoeGrads g;
    g.router = r.g_router.data();
    for (int64_t e = 0; e < E; ++e) {
      r.g1.emplace_back(fc1[size_t(e)].size(), 0.0f);
      r.g2.emplace_back(fc2[size_t(e)].size(), 0.0f);
    }
    for (int64_t e = 0; e < E; ++e) {
      g.fc1.push_back(r.g1[size_t(e)].data());
      g.fc2.push_back(r.g2[size_t(e)].data());
    }
    moe_backward(r.dx.data(), dy.data(), x.data(), st, w, g, sc, N, sh, 1.0f);
    return r;
  };
  const Run a = run(true, random_floats(size_t(E * C), 60));
  // The routing's logits are the documented draws: row t's element e is normal(token(t) E + e).
  for (const MoeWeights::TokenRun& r : runs)
    for (int64_t t = r.row; t < r.row + r.rows; ++t)
      for (int64_t e = 0; e < E; ++e)
        ASSERT_EQ(a.logits[size_t(t * E + e)], float(stream.normal(uint64_t((r.token + t - r.row) * E + e)))) << t;
  std::vector<float> draws(static_cast<size_t>(E * C), 0.0f);  // the router that makes those logits
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) draws[size_t(e * C + t)] = a.logits[size_t(t * E + e)];
  const Run b = run(true, draws), plain = run(false, draws);
  EXPECT_EQ(b.y, a.y) << "the forced forward read the router's weights";
  EXPECT_EQ(b.aux, a.aux);
  EXPECT_EQ(b.y, plain.y);
  EXPECT_EQ(b.logits, plain.logits);
  EXPECT_EQ(b.aux, plain.aux);
  EXPECT_EQ(b.z, plain.z);
  EXPECT_EQ(b.dx, plain.dx);
  EXPECT_EQ(b.g_router, plain.g_router) << "the logits' gradient did not pass to the router";
  EXPECT_EQ(b.g1, plain.g1);
  EXPECT_EQ(b.g2, plain.g2);
  EXPECT_NE(a.dx, b.dx);  // through the router's weights, which differ
}

TEST(Moe, ConfigurationErrorsNameTheFlag) {
  auto config = [] {
    TransformerConfig c;
    c.num_layers = 1;
    c.hidden_size = 16;
    c.num_attention_heads = 2;
    c.vocab_size = 32;
    c.max_position_embeddings = 8;
    c.num_experts = 4;
    c.add_bias_linear = false;
    return c;
  };
  auto expect_error = [](TransformerConfig c, int64_t tp, const std::string& needle) {
    try {
      c.finalize(tp);
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TransformerConfig ok = config();
  ok.finalize();
  EXPECT_EQ(ok.moe_ffn_hidden_size, ok.ffn_hidden_size);
  TransformerConfig c = config();
  c.add_bias_linear = true;  // the router's and the experts' biases; the shared experts have none
  c.finalize();
  c = config();
  c.add_bias_linear = true;
  c.moe_shared_expert_intermediate_size = 16;
  expect_error(c, 1, "--disable-bias-linear");
  c = config();
  c.moe_router_topk = 5;
  expect_error(c, 1, "--moe-router-topk");
  c = config();
  c.moe_aux_loss_coeff = -1.0f;
  expect_error(c, 1, "--moe-aux-loss-coeff");
  c = config();
  c.moe_router_topk_scaling_factor = 0.0f;
  expect_error(c, 1, "--moe-router-topk-scaling-factor");
  c = config();
  c.moe_z_loss_coeff = -0.1f;
  expect_error(c, 1, "--moe-z-loss-coeff");
  c = config();
  c.moe_ffn_hidden_size = 3;  // each expert's ffn splits over the tensor-parallel ranks
  expect_error(c, 2, "--moe-ffn-hidden-size 3 is not divisible by --tensor-model-parallel-size 2");
  c = config();
  c.moe_shared_expert_gate = true;
  expect_error(c, 1, "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
  c = config();
  c.moe_router_num_groups = 2;
  expect_error(c, 1, "--moe-router-num-groups and --moe-router-group-topk go together");
  c.moe_router_num_groups = 3;
  c.moe_router_group_topk = 1;
  expect_error(c, 1, "--moe-router-num-groups 3 does not divide --num-experts 4");
  c.moe_router_num_groups = 2;
  c.moe_router_group_topk = 3;
  expect_error(c, 1, "--moe-router-group-topk 3 is above --moe-router-num-groups 2");
  c.moe_router_num_groups = 4;
  c.moe_router_group_topk = 1;  // top-2 from one group of 1 expert
  expect_error(c, 1, "--moe-router-topk 2 must be between --moe-router-group-topk 1");
  c = config();
  c.moe_shared_expert_intermediate_size = 5;  // the shared experts split as the dense MLP
  expect_error(c, 2, "--moe-shared-expert-intermediate-size 5 is not divisible by --tensor-model-parallel-size 2");
}

// --moe-layer-freq's forms (Megatron's: an integer N, every N-th layer from layer 0; or a Python
// list expression of one 0 or 1 per layer).
TEST(Moe, LayerFrequencyForms) {
  using V = std::vector<int>;
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("1", 4), V{});  // every layer: the empty pattern
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("2", 5), (V{1, 0, 1, 0, 1}));
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("[1,0, 1,1]", 4), (V{1, 0, 1, 1}));
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("([0]*1+[1]*3)", 4), (V{0, 1, 1, 1}));
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("'([0]*1+[1]*3)'", 4), (V{0, 1, 1, 1}));  // shell quotes kept
  EXPECT_EQ(TransformerConfig::parse_moe_layer_freq("[0,1]*2+([1]+[0])", 6), (V{0, 1, 0, 1, 1, 0}));
  auto expect_error = [](const std::string& value, int64_t layers, const std::string& needle) {
    try {
      TransformerConfig::parse_moe_layer_freq(value, layers);
      ADD_FAILURE() << value << ": no error; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--moe-layer-freq"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("[1,0,1]", 4, "3 entries for --num-layers 4");
  expect_error("[1,2,1,1]", 4, "other than 0 or 1");
  expect_error("0", 4, "positive integer");
  expect_error("[1,0]*2)", 4, "unexpected ')'");
  expect_error("([1]*4", 4, "expected ')'");
  expect_error("[1,0,]", 2, "expected a non-negative integer");
  expect_error("[1]*x", 4, "expected a non-negative integer");
  expect_error("range(4)", 4, "expected '[' or '('");
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 32;
  c.max_position_embeddings = 8;
  c.num_experts = 4;
  c.add_bias_linear = false;
  c.moe_layer_pattern = {0, 1};
  c.finalize();
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1));
  c.moe_layer_pattern = {1, 1, 0};
  try {
    c.finalize();
    ADD_FAILURE() << "no error for 3 entries and 2 layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-layer-freq has 3 entries for --num-layers 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lattice
