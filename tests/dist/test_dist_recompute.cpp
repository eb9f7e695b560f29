// Activation recomputation under tensor and sequence parallelism (TP = world size): the
// recomputed forward repeats its collectives on every rank in the same order, so losses
// and each rank's final parameters are bit-identical to the same layout without
// recomputation; and the repeated collectives are exactly those of the recomputed part.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 4, kIters = 6, kLayers = 4;

struct Recompute {
  const char* granularity;
  const char* method;
  int64_t num_layers;
  std::vector<std::string> modules = {};  // --recompute-modules
  bool gate = false;                      // --attention-output-gate
};
void PrintTo(const Recompute& r, std::ostream* os) {
  *os << "'" << r.granularity << "' '" << r.method << "' " << r.num_layers;
  for (const std::string& m : r.modules) *os << " " << m;
  if (r.gate) *os << " gated";
}

TransformerConfig config(const Recompute& r, int tp) {
  TransformerConfig c;
  c.num_layers = kLayers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = 0.1f;
  c.recompute_granularity = r.granularity;
  c.recompute_method = r.method;
  c.recompute_num_layers = r.num_layers;
  c.recompute_modules = r.modules;
  c.attention_output_gate = r.gate;
  c.finalize(tp);
  return c;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> params;  // this rank's buffer
};

TrainRun train(const Recompute& r, const TensorParallel& tp) {
  GPTModel model(config(r, tp.size()), kB, kT, tp);
  model.init_parameters(1234);
  Optimizer opt(model.params(), OptimizerConfig{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc;
  sc.micro_batch_size = kB;
  sc.global_batch_size = kGBS;
  sc.seq_length = kT;
  TrainRun run;
  for (int64_t it = 0; it < kIters; ++it) run.losses.push_back(train_step(model, opt, data, sc, it, 1e-3, 0.1).lm_loss);
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  return run;
}

class DistRecompute : public ::testing::TestWithParam<Recompute> {};

TEST_P(DistRecompute, SequenceParallelIsBitIdentical) {
  auto ps = ParallelState::create(mpi_world_size(), 1, 120);
  const TensorParallel tp{&ps->tp(), true};
  const TrainRun base = train({"", "", 0, {}, GetParam().gate}, tp), got = train(GetParam(), tp);
  ASSERT_EQ(got.losses.size(), base.losses.size());
  for (size_t i = 0; i < base.losses.size(); ++i) EXPECT_EQ(got.losses[i], base.losses[i]) << "iteration " << i + 1;
  ASSERT_EQ(got.params.size(), base.params.size());
  EXPECT_EQ(std::memcmp(got.params.data(), base.params.data(), base.params.size() * sizeof(float)), 0)
      << "final parameters differ on rank " << ps->tp().rank();
}

INSTANTIATE_TEST_SUITE_P(Recompute, DistRecompute,
                         ::testing::Values(Recompute{"full", "uniform", 1}, Recompute{"full", "uniform", 2},
                                           Recompute{"full", "block", 3}, Recompute{"selective", "", 0},
                                           Recompute{"selective", "", 0, {"core_attn", "mlp", "layernorm"}},
                                           Recompute{"full", "uniform", 2, {}, true},
                                           Recompute{"selective", "", 0, {}, true}),
                         [](const ::testing::TestParamInfo<Recompute>& i) {
                           std::string modules;
                           for (const std::string& m : i.param.modules) modules += "_" + m;
                           return std::string(i.param.granularity) + (*i.param.method ? "_" : "") +
                                  i.param.method + (i.param.num_layers ? std::to_string(i.param.num_layers) : "") +
                                  modules + (i.param.gate ? "_gate" : "");
                         });

// With sequence parallelism a layer's forward all-gathers its two LayerNorm outputs and
// reduce-scatters its two row-parallel outputs. Recomputing every layer (uniform, N = 1)
// reruns a layer's forward up to its GELU: 2 all-gathers and 1 reduce-scatter more per
// layer and micro-batch; selective recomputation of the core attention or of the norms
// communicates nothing more, of the MLP one all-gather (LN2's output, for fc1) per layer.
TEST(DistRecomputeVolume, RecomputedCollectives) {
  auto ps = ParallelState::create(mpi_world_size(), 1, 120);
  if (ps->tp().size() == 1) GTEST_SKIP() << "needs tensor parallelism";
  auto stats = [&](const Recompute& r) {
    GPTModel model(config(r, ps->tp().size()), kB, kT, TensorParallel{&ps->tp(), true});
    model.init_parameters(1);
    MockSamples data(model.config().vocab_size, kT, 3);
    std::vector<int32_t> tokens(static_cast<size_t>(kB * (kT + 1)));
    fill_micro_batch(data, 0, kB, tokens.data());
    ps->tp().stats().reset();
    model.forward_backward(tokens.data(), nullptr, kB, kT, 1.0f, MicroBatchKey{});
    return ps->tp().stats();
  };
  const CommStats none = stats({"", "", 0}), full = stats({"full", "uniform", 1}), sel = stats({"selective", "", 0});
  const CommStats norms = stats({"selective", "", 0, {"layernorm"}}), mlp = stats({"selective", "", 0, {"mlp"}});
  const int ag = int(CommOp::all_gather), rs = int(CommOp::reduce_scatter);
  EXPECT_EQ(full.calls[ag] - none.calls[ag], uint64_t(2 * kLayers));
  EXPECT_EQ(full.calls[rs] - none.calls[rs], uint64_t(kLayers));
  EXPECT_EQ(sel.calls[ag], none.calls[ag]);
  EXPECT_EQ(sel.calls[rs], none.calls[rs]);
  EXPECT_EQ(norms.calls[ag], none.calls[ag]);
  EXPECT_EQ(norms.calls[rs], none.calls[rs]);
  EXPECT_EQ(mlp.calls[ag] - none.calls[ag], uint64_t(kLayers));
  EXPECT_EQ(mlp.calls[rs], none.calls[rs]);
}

}  // namespace
}  // namespace lattice
