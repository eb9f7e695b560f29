// fp16 loss scaling across ranks: an overflow on one data-parallel rank only makes every
// rank skip the step (the inf/nan check is reduced over all ranks), the scalers stay in
// step, and the replicas stay identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"
#include "train/train_step.h"

namespace lattice {
namespace {

TEST(DistPrecision, OverflowOnOneRankSkipsTheStepEverywhere) {
  auto ps = ParallelState::create(1, 1, 120);
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.max_position_embeddings = 16;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  GPTModel model(c, 2, 16);
  model.init_parameters(1234);
  DataParallelConfig dcfg;
  dcfg.distributed_optimizer = true;
  DataParallel dp(model, ps->dp(), dcfg);
  Optimizer opt(model.params(), OptimizerConfig{}, dp.owned_ranges());
  auto policy = make_half_precision_policy(HalfFormat::fp16);
  model.set_gemm_policy(policy.get());
  LossScalerConfig lc;
  lc.initial_scale = 4096;
  lc.hysteresis = 1;
  LossScaler scaler(lc);
  MockSamples data(c.vocab_size, 16, 7);
  StepConfig sc{2, 8, 16, 1.0, 1234};
  sc.loss_scaler = &scaler;
  sc.precision = policy.get();
  const int last = ps->world_size() - 1;
  if (ps->world_rank() == last) sc.inject_inf_iterations = {2};
  std::vector<float> before(size_t(model.params().numel()));
  for (int64_t it = 0; it < 5; ++it) {
    dp.finish_param_gather();
    std::memcpy(before.data(), model.params().params(), before.size() * sizeof(float));
    StepResult r = train_step(model, opt, data, sc, it, 1e-3, 0.0, &dp);
    dp.finish_param_gather();
    EXPECT_EQ(r.skipped, it == 2) << "rank " << ps->world_rank() << " iteration " << it;
    EXPECT_EQ(scaler.scale(), it >= 2 ? 2048.0 : 4096.0) << "rank " << ps->world_rank() << " iteration " << it;
    const bool same = std::memcmp(before.data(), model.params().params(), before.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, it == 2) << "rank " << ps->world_rank() << " iteration " << it;
  }
  // The replicas agree: the max over ranks of the parameters equals this rank's.
  std::vector<float> mx(model.params().params(), model.params().params() + model.params().numel());
  ps->world().all_reduce(mx.data(), int64_t(mx.size()), ReduceOp::max);
  EXPECT_EQ(0, std::memcmp(mx.data(), model.params().params(), mx.size() * sizeof(float)));
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// fp8 over data parallelism when a weight is used on some ranks only (an expert no token of this
// rank reached): told the parameter count, every rank reduces the same amax list, and a weight used
// anywhere enters every rank's history alike (a weight used nowhere enters none).
TEST(DistPrecision, Fp8WeightUsedOnOneRankRecordsOnAll) {
  auto ps = ParallelState::create(1, 1, 120);
  if (ps->dp().size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Fp8Params params;
  params.count = 4;
  auto policy = make_fp8_policy(make_fp8_recipe("hybrid", 0, 4, "max"), nullptr, &ps->dp(), params);
  const int64_t N = 4, in = 8, out = 2;
  std::vector<float> x(size_t(N * in)), w(size_t(out * in)), y(size_t(N * out));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * float(int(i % 7) - 3) * float(ps->dp_rank() + 1);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f - 0.125f * float(i % 5);
  policy->forward(0, y.data(), x.data(), w.data(), N, in, out);  // every rank
  if (ps->dp_rank() == 0) policy->forward(2, y.data(), x.data(), w.data(), N, in, out);  // rank 0 only
  policy->finish_step();
  const std::map<int, Fp8ScalingState> st = policy->scaling_state();
  ASSERT_EQ(st.size(), 2u) << "weights 0 and 2 (1 and 3 used nowhere)";
  ASSERT_TRUE(st.count(2));
  // The same state on every rank: rank 0's amaxes for weight 2, the MAX over ranks for weight 0.
  std::vector<double> mine;
  for (int p : {0, 2})
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(st.at(p).amax_history[size_t(k)].size(), 1u) << "weight " << p;
      mine.push_back(st.at(p).amax_history[size_t(k)][0]);
    }
  std::vector<double> most = mine;
  ps->dp().all_reduce(most.data(), int64_t(most.size()), ReduceOp::max);
  std::vector<double> least = mine;
  for (double& v : least) v = -v;
  ps->dp().all_reduce(least.data(), int64_t(least.size()), ReduceOp::max);
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(most[i], -least[i]) << "amax " << i << " differs between ranks";
  EXPECT_EQ(mine[0], 0.75f * float(ps->dp().size()));  // the input's amax: the largest rank's
  EXPECT_EQ(mine[3], 0.75f);                            // weight 2's input: rank 0's
}

}  // namespace
}  // namespace lattice
