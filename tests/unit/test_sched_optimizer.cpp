// Optimizer::step(scheduler): every parameter gets its group's learning rate and weight
// decay (--decoupled-lr for the word embedding and output layer, no weight decay on biases
// and 1-D parameters), also on a shard of the buffer.
#include <gtest/gtest.h>

#include "optim/opt_param_scheduler.h"
#include "optim/optimizer.h"
#include "optim/param_buffer.h"
#include "core/error.h"
#include "kernels/cast_math.h"

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

// --exp-avg-dtype / --exp-avg-sq-dtype bf16: half the state bytes; the state exported to fp32
// exactly and imported back (into a fresh optimizer, as a checkpoint resumes) continues bit for
// bit; an fp32 state imported into bf16 moments is rounded to nearest even; SGD refuses them.
TEST(SchedOptimizer, Bf16MomentsHalveTheStateAndResumeExactly) {
  OptimizerConfig bf16;
  bf16.exp_avg_bf16 = bf16.exp_avg_sq_bf16 = true;
  Fixture a, b;
  Optimizer oa(a.params, bf16);
  int64_t elements = 0;  // the parameters' (numel() counts the alignment padding too)
  for (const ParamInfo& p : a.params.infos()) elements += p.numel;
  EXPECT_EQ(oa.state_numel(), elements);
  EXPECT_EQ(oa.state_bytes(), size_t(elements) * 4);  // two moments of 2 bytes
  auto grads = [](Fixture& f, int step) {
    for (int64_t i = 0; i < f.params.numel(); ++i) f.params.grads()[i] = 0.01f * float((i * 7 + step * 3) % 11) - 0.05f;
  };
  for (int s = 1; s <= 3; ++s) {
    grads(a, s);
    oa.step(1e-2, 0.1);
  }
  // A fresh optimizer from a's parameters and exported state.
  for (int64_t i = 0; i < a.params.numel(); ++i) b.params.params()[i] = a.params.params()[i];
  std::vector<float> m(size_t(a.params.numel())), v(m.size());
  oa.export_state(1, m.data());
  oa.export_state(2, v.data());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i], math::round_bf16(m[i])) << "exported m[" << i << "] is not a bf16 value";
    EXPECT_EQ(v[i], math::round_bf16(v[i])) << "exported v[" << i << "] is not a bf16 value";
  }
  Optimizer ob(b.params, bf16);
  ob.import_state(1, m.data());
  ob.import_state(2, v.data());
  ob.set_steps(3);
  for (int s = 4; s <= 6; ++s) {
    grads(a, s);
    grads(b, s);
    oa.step(1e-2, 0.1);
    ob.step(1e-2, 0.1);
  }
  for (int64_t i = 0; i < a.params.numel(); ++i) EXPECT_EQ(a.params.params()[i], b.params.params()[i]) << i;
  // fp32 moments into bf16 ones: rounded.
  const float values[] = {0.1f, -1.0f / 3.0f, 1e-7f, 12345.678f, 0.0f, 2.0f, 3.0f};
  std::vector<float> fp32(size_t(a.params.numel()), 0.0f), back(fp32.size(), 0.0f);
  for (size_t i = 0; i < fp32.size(); ++i) fp32[i] = values[i % 7] * float(1 + i);
  ob.import_state(1, fp32.data());
  ob.export_state(1, back.data());
  for (const ParamInfo& p : a.params.infos())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      EXPECT_EQ(back[size_t(i)], math::round_bf16(fp32[size_t(i)])) << i;
  OptimizerConfig sgd = bf16;
  sgd.optimizer = "sgd";
  EXPECT_THROW(Optimizer(a.params, sgd), Error);
}

}  // namespace
}  // namespace lattice
