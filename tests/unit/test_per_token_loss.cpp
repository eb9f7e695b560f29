// --calculate-per-token-loss (StepConfig::per_token_loss): the step's loss and gradient are the
// global batch's summed token losses over its token count, the same whatever the split into
// micro-batches, and equal to that mean computed directly; the default (the mean of the
// micro-batches' means) is not split-invariant when --eod-mask-loss leaves micro-batches with
// different token counts, which the data here does. Data-parallel and pipeline layouts against
// one process: tests/dist/test_dist_per_token_loss.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr int64_t kT = 16, kGBS = 4;
constexpr int32_t kEod = 3;  // a vocabulary of 8: about one token in 8 is masked

TransformerConfig config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = 0.0f;  // masks are keyed by micro-batch
  c.finalize();
  return c;
}

struct StepRun {
  std::vector<double> losses;
  std::vector<float> grads;   // after the last step
  std::vector<float> params;  // after the last step
};

// `iters` steps of the global batch split into micro-batches of B.
StepRun train(int64_t B, bool per_token, int iters, LossScaler* scaler = nullptr) {
  const TransformerConfig c = config();
  GPTModel model(c, B, kT);
  model.init_parameters(99);
  model.set_document_boundaries({kEod, true, false, false});
  Optimizer opt(model.params(), OptimizerConfig{});
  MockSamples data(c.vocab_size, kT, 5);
  StepConfig sc{B, kGBS, kT, 1.0, 99};
  sc.per_token_loss = per_token;
  sc.loss_scaler = scaler;
  StepRun run;
  for (int it = 0; it < iters; ++it) run.losses.push_back(train_step(model, opt, data, sc, it, 1e-3, 0.0).lm_loss);
  const ParamBuffer& p = model.params();
  run.grads.assign(p.grads(), p.grads() + p.numel());
  run.params.assign(p.params(), p.params() + p.numel());
  return run;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(a[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// The masked token counts of the global batch's micro-batches of B.
std::vector<int> token_counts(int64_t B) {
  MockSamples data(config().vocab_size, kT, 5);
  std::vector<int32_t> tokens(size_t(B * (kT + 1)));
  std::vector<int> counts;
  for (int64_t first = 0; first < kGBS; first += B) {
    fill_micro_batch(data, first, B, tokens.data());
    int n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < kT; ++t) n += tokens[size_t(b * (kT + 1) + t)] != kEod;
    counts.push_back(n);
  }
  return counts;
}

TEST(PerTokenLoss, TheDataGivesMicroBatchesDifferentTokenCounts) {
  const std::vector<int> counts = token_counts(1);
  EXPECT_NE(*std::min_element(counts.begin(), counts.end()), *std::max_element(counts.begin(), counts.end()));
  // ...so the default loss, a mean of means, changes with the split.
  EXPECT_GT(std::fabs(train(1, false, 1).losses[0] - train(4, false, 1).losses[0]), 1e-5);
}

TEST(PerTokenLoss, LossAndGradientsAreTheSameForEveryMicroBatchSplit) {
  const StepRun whole = train(4, true, 3), halves = train(2, true, 3), singles = train(1, true, 3);
  for (size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(halves.losses[i], whole.losses[i], 1e-6 * whole.losses[i]) << "iteration " << i;
    EXPECT_NEAR(singles.losses[i], whole.losses[i], 1e-6 * whole.losses[i]) << "iteration " << i;
  }
  EXPECT_LT(max_rel_diff(halves.grads, whole.grads), 1e-5);
  EXPECT_LT(max_rel_diff(singles.grads, whole.grads), 1e-5);
  EXPECT_LT(max_rel_diff(singles.params, whole.params), 1e-6);
}

TEST(PerTokenLoss, IsTheBatchTokenMeanAndItsGradient) {
  // One micro-batch holding the whole batch: the default mean of means is then the token mean,
  // so per-token loss with four micro-batches must equal it, loss and gradients.
  const StepRun reference = train(4, false, 1), split = train(1, true, 1);
  EXPECT_NEAR(split.losses[0], reference.losses[0], 1e-6 * reference.losses[0]);
  EXPECT_LT(max_rel_diff(split.grads, reference.grads), 1e-5);
  // And the loss is the masked mean computed directly.
  const TransformerConfig c = config();
  GPTModel model(c, kGBS, kT);
  model.init_parameters(99);
  model.set_document_boundaries({kEod, true, false, false});
  std::vector<int32_t> tokens(size_t(kGBS * (kT + 1)));
  fill_micro_batch(MockSamples(c.vocab_size, kT, 5), 0, kGBS, tokens.data());
  const LossSum l = model.forward_loss_sum(tokens.data(), nullptr, kGBS, kT);
  const std::vector<int> counts = token_counts(1);
  double total = 0;
  for (int n : counts) total += n;
  EXPECT_EQ(l.count, total);
  EXPECT_NEAR(split.losses[0], l.sum / l.count, 1e-6 * split.losses[0]);
}

TEST(PerTokenLoss, LossScalingDividesByScaleAndTokens) {
  // A constant power-of-two loss scale leaves fp32 gradients as they were.
  LossScalerConfig cfg;
  cfg.dynamic = false;
  cfg.initial_scale = 1024;
  LossScaler scaler(cfg);
  const StepRun scaled = train(1, true, 2, &scaler), plain = train(1, true, 2);
  EXPECT_NEAR(scaled.losses[1], plain.losses[1], 1e-6 * plain.losses[1]);
  EXPECT_LT(max_rel_diff(scaled.grads, plain.grads), 1e-6);
}

}  // namespace
}  // namespace lattice
