// fp16 loss scaling across ranks: an overflow on one data-parallel rank only makes every
// rank skip the step (the inf/nan check is reduced over all ranks), the scalers stay in
// step, and the replicas stay identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
