// Evaluation: Megatron's validation block format, PPL = exp(min(20, loss)), the
// token-weighted loss over all micro-batches of all eval iterations, and that evaluating
// changes no parameter or gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "train/evaluation.h"

namespace lattice {
namespace {

TEST(DsEvaluation, MegatronValidationBlock) {
  EvalResult r;
  r.lm_loss = 3.0;
  r.ppl = std::exp(3.0);
  const std::string line = " validation loss at iteration 10 | lm loss value: 3.000000E+00 | lm loss PPL: 2.008554E+01 | ";
  const std::string dashes(line.size() + 1, '-');
  EXPECT_EQ(format_evaluation(eval_prefix(10), r), dashes + "\n" + line + "\n" + dashes);
  EXPECT_EQ(eval_prefix(200, "validation"), "iteration 200 on validation set");
  EXPECT_EQ(eval_prefix(200, "test"), "iteration 200 on test set");
}

TEST(DsEvaluation, MetricsLine) {
  EvalResult r;
  r.lm_loss = 2.5;
  r.ppl = std::exp(2.5);
  const auto j = nlohmann::json::parse(format_eval_metrics_json(30, "val", r));
  EXPECT_EQ(j["iteration"], 30);
  EXPECT_EQ(j["val_loss"].get<double>(), 2.5);
  EXPECT_EQ(j["val_ppl"].get<double>(), std::exp(2.5));
  EXPECT_TRUE(nlohmann::json::parse(format_eval_metrics_json(30, "test", r)).contains("test_ppl"));
}

class DsEvaluate : public ::testing::Test {
 protected:
  DsEvaluate() : cfg_(make_config()), model_(cfg_, 2, 16), data_(cfg_.vocab_size, 16, 9) {
    model_.init_parameters(5);
  }
  static TransformerConfig make_config() {
    TransformerConfig c;
    c.num_layers = 1;
    c.hidden_size = 32;
    c.num_attention_heads = 2;
    c.vocab_size = 40;
    c.max_position_embeddings = 16;
    c.hidden_dropout = c.attention_dropout = 0.5f;  // must not apply in evaluation
    c.finalize();
    return c;
  }
  TransformerConfig cfg_;
  GPTModel model_;
  MockSamples data_;
};

TEST_F(DsEvaluate, TokenWeightedLossOverAllMicroBatches) {
  // --eod-mask-loss makes micro-batches hold different numbers of loss tokens, so the
  // token-weighted mean differs from the mean of micro-batch means.
  model_.set_document_boundaries(DocumentBoundaries{int32_t(cfg_.vocab_size - 1), true, false, false});
  const std::vector<float> before(model_.params().params(), model_.params().params() + model_.params().numel());
  model_.params().zero_grad();
  const EvalResult r = evaluate(model_, data_, 8, 8, 4, 2);  // samples 8..15, 4 micro-batches
  double sum = 0, count = 0, mean_of_means = 0;
  std::vector<int32_t> tokens(2 * 17);
  for (int64_t m = 0; m < 4; ++m) {
    fill_micro_batch(data_, 8 + 2 * m, 2, tokens.data());
    const LossSum l = model_.forward_loss_sum(tokens.data(), nullptr, 2, 16);
    sum += l.sum;
    count += l.count;
    mean_of_means += l.sum / l.count / 4;
  }
  EXPECT_DOUBLE_EQ(r.lm_loss, sum / count);
  EXPECT_EQ(r.tokens, count);
  EXPECT_LT(count, 4 * 2 * 16);  // some eod inputs were masked
  EXPECT_NE(r.lm_loss, mean_of_means);
  EXPECT_DOUBLE_EQ(r.ppl, std::exp(r.lm_loss));
  // Deterministic (no dropout) and side-effect free.
  EXPECT_EQ(evaluate(model_, data_, 8, 8, 4, 2).lm_loss, r.lm_loss);
  EXPECT_EQ(std::vector<float>(model_.params().params(), model_.params().params() + model_.params().numel()), before);
  for (int64_t i = 0; i < model_.params().numel(); ++i) ASSERT_EQ(model_.params().grads()[i], 0.0f);
  // Other samples, another loss.
  EXPECT_NE(evaluate(model_, data_, 16, 8, 4, 2).lm_loss, r.lm_loss);
}

// --full-validation's whole split: a sample count that is not a multiple of the global batch. The
// last global batch holds the rest (3 of 4), its last micro-batch the rest of that (1 row of 2).
TEST_F(DsEvaluate, PartialLastBatchAndMicroBatch) {
  const EvalResult r = evaluate(model_, data_, 3, 7, 4, 2);  // samples 3..9: [3,4] [5,6] | [7,8] [9]
  double sum = 0, count = 0;
  std::vector<int32_t> tokens(2 * 17);
  for (const auto& [first, rows] : std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {5, 2}, {7, 2}, {9, 1}}) {
    fill_micro_batch(data_, first, rows, tokens.data());
    const LossSum l = model_.forward_loss_sum(tokens.data(), nullptr, rows, 16);
    sum += l.sum;
    count += l.count;
  }
  EXPECT_EQ(r.tokens, 7 * 16);
  EXPECT_EQ(count, 7 * 16);
  EXPECT_DOUBLE_EQ(r.lm_loss, sum / count);
  EXPECT_NE(r.lm_loss, evaluate(model_, data_, 3, 8, 4, 2).lm_loss);  // sample 10 counts when asked for
}

TEST(DsEvaluation, PerplexityCappedAtExp20) {
  EXPECT_EQ(perplexity(2.0), std::exp(2.0));
  EXPECT_EQ(perplexity(20.0), std::exp(20.0));
  EXPECT_EQ(perplexity(25.0), std::exp(20.0));  // Megatron: math.exp(min(20, loss))
}

}  // namespace
}  // namespace lattice
