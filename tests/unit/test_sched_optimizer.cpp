// Optimizer::step(scheduler): every parameter gets its group's learning rate and weight
// decay (--decoupled-lr for the word embedding and output layer, no weight decay on biases
// and 1-D parameters), also on a shard of the buffer.
#include <gtest/gtest.h>

#include "optim/opt_param_scheduler.h"
#include "optim/optimizer.h"
#include "optim/param_buffer.h"

namespace lattice {
namespace {

// embedding [4, 2] (decoupled), fc1 weight [2, 2], fc1 bias [2]; every weight and grad 1.
struct Fixture {
  ParamBuffer params;
  Fixture() {
    params.add("embedding.word_embeddings.weight", {4, 2}, ParamInit::ones, 0);
    params.add("decoder.layers.0.mlp.linear_fc1.weight", {2, 2}, ParamInit::ones, 0);
    params.add("decoder.layers.0.mlp.linear_fc1.bias", {2}, ParamInit::ones, 0);
    params.allocate();
    params.initialize(1);
    for (int64_t i = 0; i < params.numel(); ++i) params.grads()[i] = 1.0f;
  }
  float at(const char* name, int64_t i) const { return params.param_tensor(name).as<float>()[i]; }
};

OptimizerConfig plain_sgd() {
  OptimizerConfig c;
  c.optimizer = "sgd";
  c.sgd_momentum = 0;  // first step: p -= lr * (g + wd * p)
  return c;
}

OptimizerParamScheduler constant_schedule(std::optional<double> decoupled_lr) {
  OptimizerParamSchedulerOptions o;
  o.max_lr = 0.1;
  o.lr_decay_steps = 100;
  o.lr_decay_style = "constant";
  o.start_wd = o.end_wd = 0.01;
  o.wd_incr_steps = 100;
  o.decoupled_lr = decoupled_lr;
  return OptimizerParamScheduler(o);
}

TEST(SchedOptimizer, EachParameterGetsItsGroupsLrAndWeightDecay) {
  Fixture f;
  Optimizer opt(f.params, plain_sgd());
  opt.step(constant_schedule(0.5));
  for (int64_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(f.at("embedding.word_embeddings.weight", i), 1 - 0.5f * 1.01f);
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f.at("decoder.layers.0.mlp.linear_fc1.weight", i), 1 - 0.1f * 1.01f);
  for (int64_t i = 0; i < 2; ++i) EXPECT_FLOAT_EQ(f.at("decoder.layers.0.mlp.linear_fc1.bias", i), 1 - 0.1f);
  EXPECT_EQ(opt.steps(), 1);
}

TEST(SchedOptimizer, ConstantStepMatchesTheSchedulerWithoutDecoupledLr) {
  Fixture a, b;
  Optimizer oa(a.params, plain_sgd()), ob(b.params, plain_sgd());
  oa.step(constant_schedule(std::nullopt));
  ob.step(0.1, 0.01);
  for (int64_t i = 0; i < a.params.numel(); ++i) EXPECT_EQ(a.params.params()[i], b.params.params()[i]) << i;
  EXPECT_FLOAT_EQ(a.at("embedding.word_embeddings.weight", 0), 1 - 0.1f * 1.01f);
}

TEST(SchedOptimizer, ShardUpdatesOnlyItsElementsWithTheirGroupsValues) {
  Fixture f;
  const int64_t emb = f.params.info("embedding.word_embeddings.weight").offset;
  const int64_t fc1 = f.params.info("decoder.layers.0.mlp.linear_fc1.weight").offset;
  // The last 3 embedding elements and the first fc1 element.
  Optimizer opt(f.params, plain_sgd(), {{emb + 5, emb + 8}, {fc1, fc1 + 1}});
  opt.step(constant_schedule(0.5));
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_FLOAT_EQ(f.at("embedding.word_embeddings.weight", i), i >= 5 ? 1 - 0.5f * 1.01f : 1.0f) << i;
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(f.at("decoder.layers.0.mlp.linear_fc1.weight", i), i == 0 ? 1 - 0.1f * 1.01f : 1.0f) << i;
  EXPECT_EQ(f.at("decoder.layers.0.mlp.linear_fc1.bias", 0), 1.0f);
}

}  // namespace
}  // namespace lattice
