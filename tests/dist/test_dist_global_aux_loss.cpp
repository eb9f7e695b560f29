// --moe-router-load-balancing-type global_aux_loss (Megatron's global-batch load balancing) under
// parallel layouts. Each micro-batch's loss weighs its probabilities by the step's expert counts so
// far, summed over every data- and context-parallel rank and averaged over the micro-batches.
//
// Tensor, sequence, pipeline and context parallelism route the same tokens as one process (with whole
// experts, --expert-tensor-parallel-size 1, each tensor-parallel rank its own rows): those
// runs equal the single process's (with aux_loss listed too, each type its own coefficient, and
// with full recomputation, whose second forward must not count a micro-batch again).
// Data parallelism (and expert parallelism inside it) counts the tokens of every rank's micro-batch
// m as one process counts a micro-batch holding all of them, while each rank's loss weighs its own
// probabilities and the gradients are averaged over the ranks: a run at DP d with micro-batches of
// B equals one process with micro-batches of d B and the coefficient divided by d (the language-model
// loss and its gradient are the same either way), to 1e-5 (layout_run.h; SGD with momentum). The global loss logged is
// the whole group's on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_runner.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"

namespace lattice {
namespace {

constexpr int64_t kT = 16, kGBS = 8, kIters = 12;
constexpr double kLr = 0.05, kWd = 0.1;
constexpr float kGlobalCoeff = 0.05f;

struct Case {
  std::string name;
  int world = 2, tp = 1, pp = 1, ep = 1, cp = 1;
  bool sequence_parallel = false;
  bool aux_loss = false;     // aux_loss listed too (its micro-batch counts are per data-parallel rank: TP/PP/CP only)
  bool recompute = false;    // full recomputation (uniform, 2 layers)
  bool sigmoid_bias = false;  // sigmoid scores with the expert bias
  int etp = 0;                // --expert-tensor-parallel-size (1: whole experts, each TP rank routing its rows)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct GlobalRun : LayoutRun {
  std::vector<double> global_losses;  // the logged global load-balancing loss per iteration
};

TransformerConfig config(const Case& c, int tp, float global_coeff) {
  TransformerConfig t;
  t.num_layers = 4;
  t.hidden_size = 32;
  t.num_attention_heads = 4;
  t.vocab_size = 50;
  t.make_vocab_size_divisible_by = 8;
  t.max_position_embeddings = kT;
  // No dropout: a micro-batch of d B rows draws other masks than d ranks' micro-batches of B.
  t.hidden_dropout = t.attention_dropout = 0.0f;
  t.num_experts = 4;
  t.moe_router_topk = 2;
  t.add_bias_linear = false;
  t.moe_layer_pattern = {1, 0, 1, 1};
  t.moe_aux_loss_coeff = c.aux_loss ? 0.01f : 0.0f;
  t.moe_global_aux_loss = true;
  t.moe_global_aux_loss_coeff = global_coeff;
  t.expert_tensor_parallel_size = c.etp;
  if (c.sigmoid_bias) {
    t.moe_router_score_function = "sigmoid";
    t.moe_router_enable_expert_bias = true;
    t.moe_router_bias_update_rate = 0.01f;
  }
  if (c.recompute) {
    t.recompute_granularity = "full";
    t.recompute_method = "uniform";
    t.recompute_num_layers = 2;
  }
  t.finalize(tp);
  return t;
}

// `ps` null: one process with micro-batches of B.
GlobalRun train(const Case& c, ParallelState* ps, int64_t B, float global_coeff) {
  const int P = ps ? ps->pp().size() : 1;
  const PipelineLayout layout = make_pipeline_layout(4, P, 0, 0, 0);
  const int dp_size = ps ? ps->dp().size() : 1;
  const int64_t M = kGBS / (B * dp_size);
  const int stage = ps ? ps->pp_rank() : 0;
  const std::vector<PipelineOp> ops = pipeline_schedule(layout, M, stage);
  const ModelPlacement place{stage_layers(layout, stage), stage == 0, stage == P - 1, max_in_flight(ops)};
  const TensorParallel tp = ps ? TensorParallel{&ps->tp(), c.sequence_parallel} : TensorParallel{};
  GPTModel model(config(c, tp.size(), global_coeff), B, kT, tp, place, ps ? &ps->ep() : nullptr,
                 ContextParallel{ps && c.cp > 1 ? &ps->cp() : nullptr});
  model.init_parameters(1234);
  if (ps) model.set_data_parallel_group(&ps->dp());
  if (ps) model.set_tensor_context_group(&ps->tp_cp());
  PipelineRunner runner(model, layout, ps ? &ps->pp() : nullptr, ps ? ps->embedding() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (ps) {
    DataParallelConfig cfg;
    cfg.bucket_elements = 3000;
    dp = std::make_unique<DataParallel>(model, ps->dp(), cfg, &ps->ep(), &ps->expert_dp(), &ps->dp_cp());
  }
  // SGD with momentum: the parameters move with the gradients. (Adam's normalization would turn the
  // last-bit differences of near-zero gradient elements, summed in another order from micro-batches
  // of d B rows than from d ranks' of B, into whole-step differences: 2e-5 relative after 12 steps
  // with the coefficient 0.)
  OptimizerConfig ocfg;
  ocfg.optimizer = "sgd";
  Optimizer opt(model.params(), ocfg, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{B, kGBS, kT, 1.0, 1234};
  GlobalRun run;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get(), &runner);
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.grad_norm);
    run.global_losses.push_back(r.global_load_balancing_loss);
  }
  model.params().download_params(run.params);
  run.infos = model.params().infos();
  return run;
}

class DistGlobalAuxLoss : public ::testing::TestWithParam<Case> {};

TEST_P(DistGlobalAuxLoss, MatchesOneProcess) {
  const Case& c = GetParam();
  if (mpi_world_size() != c.world) GTEST_SKIP() << "needs " << c.world << " ranks";
  auto ps = ParallelState::create(c.tp, c.pp, 120, c.ep, c.cp, 1, c.etp);
  const int d = ps->dp().size();
  const int64_t B = 2;
  // Data parallelism: one process with micro-batches of d B, the coefficient over d.
  const GlobalRun single = train(c, nullptr, B * d, kGlobalCoeff / float(d));
  const GlobalRun run = train(c, ps.get(), B, kGlobalCoeff);
  expect_same_run(run, single);
  ASSERT_EQ(run.global_losses.size(), single.global_losses.size());
  for (size_t i = 0; i < single.global_losses.size(); ++i) {
    EXPECT_GT(single.global_losses[i], 0.5) << "iteration " << i + 1;  // about 1: the experts' shares times their loads
    EXPECT_NEAR(run.global_losses[i], single.global_losses[i], 1e-5 * single.global_losses[i]) << "iteration " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistGlobalAuxLoss,
    ::testing::Values(
        Case{"Tp2SequenceParallelWithAuxLoss", 2, 2, 1, 1, 1, true, true},
        Case{"Pp2WithAuxLossRecompute", 2, 1, 2, 1, 1, false, true, true},
        Case{"Cp2WithAuxLossSigmoidBias", 2, 1, 1, 1, 2, false, true, false, true},
        Case{"Dp2", 2},
        Case{"Dp2Recompute", 2, 1, 1, 1, 1, false, false, true},
        Case{"Dp2Ep2SigmoidBias", 2, 1, 1, 2, 1, false, false, false, true},
        Case{"Dp2Tp2SequenceParallel", 4, 2, 1, 1, 1, true},
        Case{"Dp2Cp2", 4, 1, 1, 1, 2},
        // Whole experts: each tensor-(and context-)parallel rank routes its own rows; the counts are summed
        // over tp x cp, so the runs equal one process's.
        Case{"Tp2Etp1Ep2WithAuxLossSigmoidBias", 2, 2, 1, 2, 1, true, true, false, true, 1},
        Case{"Tp2Cp2Etp1Ep4Recompute", 4, 2, 1, 4, 2, true, false, true, false, 1}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace lattice
