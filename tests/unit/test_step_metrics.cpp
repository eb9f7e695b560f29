// --log-params-norm and --log-num-zeros-in-grad on one process: StepResult's params_norm is
// the L2 norm of the parameters after the update, num_zeros_in_grad the zero gradients the
// update used, both against a direct computation over the buffer; off, neither is computed.
// The layouts against one process: tests/dist/test_dist_step_metrics.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 8;

TEST(StepMetrics, ParamsNormAndZeroGradientsAgainstTheBuffer) {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 64;  // most rows unseen by a batch of 2 x 8 tokens: zero input-embedding gradients
  c.max_position_embeddings = 2 * kT;
  c.untie_embeddings_and_output_weights = true;
  c.finalize();
  GPTModel model(c, kB, kT);
  model.init_parameters(3);
  Optimizer opt(model.params(), OptimizerConfig{});
  MockSamples data(c.vocab_size, kT, 11);
  StepConfig sc{kB, kB, kT, 1.0, 3};
  const StepResult off = train_step(model, opt, data, sc, 0, 1e-3, 0.0);
  EXPECT_EQ(off.num_zeros_in_grad, -1);
  EXPECT_EQ(off.params_norm, -1);

  sc.log_params_norm = sc.log_num_zeros_in_grad = true;
  const StepResult r = train_step(model, opt, data, sc, 1, 1e-3, 0.0);
  const ParamBuffer& p = model.params();
  double sq = 0;
  int64_t zeros = 0;
  for (const ParamInfo& info : p.infos())
    for (int64_t i = info.offset; i < info.offset + info.numel; ++i) {
      sq += double(p.params()[i]) * double(p.params()[i]);
      zeros += p.grads()[i] == 0.0f;
    }
  EXPECT_NEAR(r.params_norm, std::sqrt(sq), 1e-9 * std::sqrt(sq));
  EXPECT_EQ(r.num_zeros_in_grad, zeros);
  // At least the unseen positions' and most of the unseen tokens' embedding rows.
  EXPECT_GT(zeros, kT * c.hidden_size);
  EXPECT_LT(zeros, p.numel());
}

}  // namespace
}  // namespace lattice
