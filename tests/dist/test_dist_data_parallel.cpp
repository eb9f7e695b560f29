// Data parallelism and the distributed optimizer against the single-process run, with
// the communication volume read from the byte counters and the optimizer-state memory.
// Runs under mpirun with 1, 2 and 4 ranks (DP = world size).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"
#include "train/evaluation.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 8, kIters = 20;
constexpr double kLr = 1e-3, kWd = 0.1;

TransformerConfig config(float dropout) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = dropout;
  c.finalize();
  return c;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> params;
  size_t optimizer_state_bytes = 0;
  int64_t numel = 0;
  CommStats dp_stats;
};

// One run of kIters iterations; with `dp` set, data-parallel over the world (with several
// distributed-optimizer instances when ps has them: the trainer's groups).
TrainRun train(float dropout, ParallelState* ps, const DataParallelConfig* dp_cfg,
               const OptimizerConfig& oc = OptimizerConfig{}) {
  TransformerConfig c = config(dropout);
  GPTModel model(c, kB, kT);
  model.init_parameters(1234);
  std::unique_ptr<DataParallel> dp;
  if (dp_cfg && ps->dp_cp_replicas())
    dp = std::make_unique<DataParallel>(model, ps->dp(), *dp_cfg, &ps->ep(), &ps->expert_dp_shard(), &ps->dp_cp_shard(),
                                        ps->dp_cp_replicas(), ps->expert_dp_replicas());
  else if (dp_cfg)
    dp = std::make_unique<DataParallel>(model, ps->dp(), *dp_cfg);
  Optimizer opt(model.params(), oc, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(c.vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  TrainRun run;
  if (dp) dp->comm().stats().reset();
  for (int64_t it = 0; it < kIters; ++it)
    run.losses.push_back(train_step(model, opt, data, sc, it, kLr, kWd, dp.get()).lm_loss);
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  run.optimizer_state_bytes = opt.state_bytes();
  run.numel = model.params().numel();
  if (dp) run.dp_stats = dp->comm().stats();
  return run;
}

void expect_same_run(const TrainRun& got, const TrainRun& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::fabs(want.losses[i])) << "iteration " << i + 1;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(want.params[i])));
    max_err = std::max(max_err, std::fabs(double(got.params[i]) - double(want.params[i])));
  }
  EXPECT_LE(max_err, 1e-5 * max_ref) << "final parameters";
}

class DistDataParallel : public ::testing::TestWithParam<float> {
 protected:
  void SetUp() override { ps_ = ParallelState::create(1, 1, 120); }
  std::unique_ptr<ParallelState> ps_;
};

TEST_P(DistDataParallel, AllReduceMatchesSingleProcess) {
  TrainRun single = train(GetParam(), nullptr, nullptr);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;  // several buckets
  TrainRun dp = train(GetParam(), ps_.get(), &cfg);
  expect_same_run(dp, single);
}

// --optimizer muon: every rank orthogonalizes the same all-reduced gradients of each matrix (its QKV
// split by heads), Adam the rest: the single process's run.
TEST_P(DistDataParallel, MuonMatchesSingleProcess) {
  OptimizerConfig oc;
  oc.optimizer = "muon";
  oc.muon.nesterov = true;
  oc.muon.qkv_split_rows = {8, 8, 8};  // 4 heads of 8: per head q, k, v
  TrainRun single = train(GetParam(), nullptr, nullptr, oc);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.overlap_grad_reduce = true;
  TrainRun dp = train(GetParam(), ps_.get(), &cfg, oc);
  expect_same_run(dp, single);
  TrainRun adam = train(GetParam(), nullptr, nullptr);
  EXPECT_NE(adam.losses.back(), single.losses.back()) << "Muon changes the training";
}

TEST_P(DistDataParallel, OverlappedAllReduceMatchesSingleProcess) {
  TrainRun single = train(GetParam(), nullptr, nullptr);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.overlap_grad_reduce = true;
  TrainRun dp = train(GetParam(), ps_.get(), &cfg);
  expect_same_run(dp, single);
}

TEST_P(DistDataParallel, DistributedOptimizerMatchesSingleProcess) {
  TrainRun single = train(GetParam(), nullptr, nullptr);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.distributed_optimizer = true;
  cfg.overlap_grad_reduce = true;
  TrainRun dp = train(GetParam(), ps_.get(), &cfg);
  expect_same_run(dp, single);
}

// --exp-avg-dtype / --exp-avg-sq-dtype bf16: each rank's shard of the bf16 moments steps as the
// single process's whole state does. The data-parallel sums round differently from one process's
// (the 1e-5 of expect_same_run); a moment that lands on the other side of a bf16 rounding moves
// its parameter by up to lr x 2^-7 more in a step, so the final parameters agree to
// iterations x lr x 2^-7 (a misplaced shard would be off by ~lr every step).
TEST_P(DistDataParallel, DistributedOptimizerWithBf16MomentsMatchesSingleProcess) {
  OptimizerConfig oc;
  oc.exp_avg_bf16 = oc.exp_avg_sq_bf16 = true;
  TrainRun single = train(GetParam(), nullptr, nullptr, oc);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.distributed_optimizer = true;
  TrainRun dp = train(GetParam(), ps_.get(), &cfg, oc);
  ASSERT_EQ(dp.losses.size(), single.losses.size());
  for (size_t i = 0; i < single.losses.size(); ++i)
    EXPECT_NEAR(dp.losses[i], single.losses[i], 1e-5 * std::fabs(single.losses[i])) << "iteration " << i + 1;
  double max_err = 0;
  for (size_t i = 0; i < single.params.size(); ++i)
    max_err = std::max(max_err, std::fabs(double(dp.params[i]) - double(single.params[i])));
  EXPECT_LE(max_err, double(kIters) * kLr * std::ldexp(1.0, -7)) << "final parameters";
  // Half the fp32 moments' bytes: 2 + 2 per owned parameter.
  EXPECT_EQ(dp.optimizer_state_bytes * 2, train(GetParam(), ps_.get(), &cfg).optimizer_state_bytes);
}

// --num-distributed-optimizer-instances 2: each half of the data-parallel ranks shards the optimizer
// state over itself (the gradients reduce-scattered within it, then each shard summed with the other
// half's same shard), in fp32 and with the bf16 reduction: the single process's run, each rank owning
// 2/DP of the state. On 2 ranks each instance is one rank (its shard is everything).
TEST_P(DistDataParallel, DistributedOptimizerInstancesMatchSingleProcess) {
  const int world = ps_->world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto ps = ParallelState::create(1, 1, 120, 1, 1, 2);
  ASSERT_EQ(ps->dp_cp_shard().size(), world / 2);
  ASSERT_NE(ps->dp_cp_replicas(), nullptr);
  EXPECT_EQ(ps->dp_cp_replicas()->size(), 2);
  const TrainRun single = train(GetParam(), nullptr, nullptr);
  for (bool bf16 : {false, true}) {
    DataParallelConfig cfg;
    cfg.bucket_elements = 4000;
    cfg.distributed_optimizer = true;
    cfg.overlap_grad_reduce = true;
    cfg.grad_reduce_in_bf16 = bf16;
    const TrainRun got = train(GetParam(), ps.get(), &cfg);
    if (!bf16) {
      expect_same_run(got, single);
    } else {  // the bf16 reduction's rounding: the losses within bf16's unit roundoff of the fp32 run's
      for (size_t i = 0; i < single.losses.size(); ++i)
        EXPECT_NEAR(got.losses[i], single.losses[i], std::ldexp(1.0, -8) * std::fabs(single.losses[i]))
            << "bf16 reduction, iteration " << i + 1;
    }
    // This rank's state: its even share of an instance's (world / 2 ranks), 8 bytes per element.
    const double share = double(got.optimizer_state_bytes) / (8.0 * double(got.numel));
    EXPECT_NEAR(share, 2.0 / world, 0.02) << "bf16 " << bf16;
  }
}

INSTANTIATE_TEST_SUITE_P(Dropout, DistDataParallel, ::testing::Values(0.0f, 0.1f));

TEST(DistDataParallelVolume, BytesPerStepAreTheGradientBuffer) {
  auto ps = ParallelState::create(1, 1, 120);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  TrainRun ddp = train(0.0f, ps.get(), &cfg);
  const uint64_t buffer = uint64_t(ddp.numel) * 4;
  // One all-reduce of the gradient buffer and one of the (double) loss per step.
  EXPECT_EQ(ddp.dp_stats.bytes[int(CommOp::all_reduce)], uint64_t(kIters) * (buffer + 8));
  EXPECT_EQ(ddp.dp_stats.bytes[int(CommOp::reduce_scatter)], 0u);

  cfg.distributed_optimizer = true;
  TrainRun zero = train(0.0f, ps.get(), &cfg);
  // Reduce-scatter of the gradient buffer plus all-gather of the parameters; the
  // all-reduces are the gradient norm and the loss (one double each).
  EXPECT_EQ(zero.dp_stats.bytes[int(CommOp::reduce_scatter)], uint64_t(kIters) * buffer);
  EXPECT_EQ(zero.dp_stats.bytes[int(CommOp::all_gather)], uint64_t(kIters) * buffer);
  EXPECT_EQ(zero.dp_stats.bytes[int(CommOp::all_reduce)], uint64_t(kIters) * 16);
}

TEST(DistDataParallelMemory, OptimizerStateIsShardedOverDp) {
  auto ps = ParallelState::create(1, 1, 120);
  const int d = ps->dp().size();
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.distributed_optimizer = true;
  TrainRun zero = train(0.0f, ps.get(), &cfg);
  // Adam's two fp32 moments for this rank's 1/d of the buffer (shards differ by at most
  // one element per bucket): fp32 params and grads 8 bytes + 8/d bytes per parameter.
  const double per_rank = 8.0 * double(zero.numel) / d;
  EXPECT_NEAR(double(zero.optimizer_state_bytes), per_rank, 8.0 * 64);
  double total = double(zero.optimizer_state_bytes);
  ps->dp().all_reduce(&total, 1, ReduceOp::sum);
  EXPECT_EQ(total, 8.0 * double(zero.numel));
}

TEST(DistDataParallelIdentity, OneRankDistributedOptimizerIsBitIdentical) {
  auto local = ParallelState::single();
  TrainRun plain = train(0.1f, nullptr, nullptr);
  DataParallelConfig cfg;
  cfg.bucket_elements = 4000;
  cfg.distributed_optimizer = true;
  TrainRun zero = train(0.1f, local.get(), &cfg);
  EXPECT_EQ(plain.losses, zero.losses);
  EXPECT_EQ(0, std::memcmp(plain.params.data(), zero.params.data(), plain.params.size() * sizeof(float)));
}

// Evaluation over the data-parallel group: each rank reads its micro-batches of every global batch
// (half of each at DP 2), a short last batch (--full-validation) is read by every rank and counted
// once, and the token-weighted loss is one process's.
class CountingSamples : public SampleSource {
 public:
  explicit CountingSamples(const SampleSource& inner) : inner_(inner) {}
  void sample(int64_t index, int32_t* out) const override {
    ++reads;
    inner_.sample(index, out);
  }
  int64_t seq_length() const override { return inner_.seq_length(); }
  mutable int64_t reads = 0;

 private:
  const SampleSource& inner_;
};

TEST(DistDataParallelEvaluation, RanksSplitEachGlobalBatch) {
  auto ps = ParallelState::create(1, 1, 120);
  const int64_t d = ps->dp().size();
  if (kGBS % (kB * d) != 0) GTEST_SKIP() << "global batch " << kGBS << " not divisible by " << kB << " x " << d;
  TransformerConfig c = config(0.1f);  // dropout must not apply in evaluation
  GPTModel model(c, kB, kT);
  model.init_parameters(1234);
  MockSamples data(c.vocab_size, kT, 7);
  // 3 whole global batches and a short one of 5 samples (micro-batches of 2, 2 and 1).
  const int64_t n = 3 * kGBS + 5;
  CountingSamples counted(data);
  const EvalResult one = evaluate(model, data, 3, n, kGBS, kB);
  const EvalResult split = evaluate(model, counted, 3, n, kGBS, kB, nullptr, &ps->dp());
  EXPECT_EQ(counted.reads, 3 * kGBS / d + 5);
  EXPECT_EQ(split.tokens, one.tokens);
  EXPECT_NEAR(split.lm_loss, one.lm_loss, 1e-12 * one.lm_loss);
  EXPECT_EQ(split.ppl, perplexity(split.lm_loss));
  // Every rank holds the same result.
  double v[2] = {split.lm_loss, -split.lm_loss};
  ps->dp().all_reduce(v, 2, ReduceOp::max);
  EXPECT_EQ(v[0], split.lm_loss);
  EXPECT_EQ(-v[1], split.lm_loss);
}

}  // namespace
}  // namespace lattice
