// What a training step reports and normalises, under data (distributed optimizer), pipeline
// and tensor parallelism against the single-process run: --calculate-per-token-loss (with
// --eod-mask-loss leaving the ranks' micro-batches different token counts), the parameter norm
// (--log-params-norm) and the zero-gradient count (--log-num-zeros-in-grad): the same losses,
// gradient norms, parameter norms, zero counts and parameters over 10 iterations. Runs under
// mpirun with 2 and 4 ranks (DP, PP or TP = world size).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_runner.h"
#include "pipeline/schedule.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"

namespace lattice {
namespace {

constexpr int64_t kB = 1, kT = 16, kGBS = 8, kIters = 10, kLayers = 4;
constexpr int32_t kEod = 3;

struct MetricsRun {
  LayoutRun run;
  std::vector<double> params_norms;
  std::vector<int64_t> zeros;
};

// `ps` null: one process; else `layout` ("dp", "pp" or "tp") is the world size.
MetricsRun train(ParallelState* ps, const std::string& layout) {
  const bool dp_on = ps && layout == "dp", pp_on = ps && layout == "pp", tp_on = ps && layout == "tp";
  const TensorParallel tp = tp_on ? TensorParallel{&ps->tp(), false} : TensorParallel{};
  TransformerConfig c;
  c.num_layers = kLayers;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 8;  // one token in 8 is the end of document, masked
  c.make_vocab_size_divisible_by = 2;  // the same padded vocabulary (8) for TP 1, 2 and 4
  c.max_position_embeddings = 2 * kT;  // positions never seen: zero gradients
  c.untie_embeddings_and_output_weights = true;
  c.hidden_dropout = c.attention_dropout = 0.0f;
  // No linear biases: the key bias's gradient is zero in exact arithmetic (a softmax does not
  // change when every score of a query moves by q.b), so whether rounding leaves an element of
  // it at exactly 0 depends on each layout's summation order. The norms' replicated parameters
  // are still there (the LayerNorms).
  c.add_bias_linear = false;
  c.finalize(tp.size());
  const int P = pp_on ? ps->pp().size() : 1;
  const PipelineLayout layout_pp = make_pipeline_layout(kLayers, P, 0, 0, 0);
  const int stage = pp_on ? ps->pp_rank() : 0;
  const int64_t M = kGBS / (kB * (dp_on ? ps->dp().size() : 1));
  const std::vector<PipelineOp> ops = pipeline_schedule(layout_pp, M, stage);
  const ModelPlacement place{stage_layers(layout_pp, stage), stage == 0, stage == P - 1, max_in_flight(ops)};
  GPTModel model(c, kB, kT, tp, place);
  model.init_parameters(1234);
  model.set_document_boundaries({kEod, true, false, false});
  PipelineRunner runner(model, layout_pp, pp_on ? &ps->pp() : nullptr, pp_on ? ps->embedding() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (dp_on) {
    DataParallelConfig cfg;
    cfg.bucket_elements = 4000;
    cfg.distributed_optimizer = true;
    cfg.overlap_grad_reduce = true;
    dp = std::make_unique<DataParallel>(model, ps->dp(), cfg);
  }
  Optimizer opt(model.params(), OptimizerConfig{}, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(c.vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  sc.per_token_loss = true;
  sc.log_params_norm = sc.log_num_zeros_in_grad = true;
  MetricsRun m;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, 1e-3, 0.1, dp.get(), &runner);
    m.run.losses.push_back(r.lm_loss);
    m.run.grad_norms.push_back(r.grad_norm);
    m.params_norms.push_back(r.params_norm);
    m.zeros.push_back(r.num_zeros_in_grad);
  }
  m.run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  m.run.infos = model.params().infos();
  return m;
}

void expect_same(const MetricsRun& got, const MetricsRun& single) {
  expect_same_run(got.run, single.run);
  ASSERT_EQ(got.zeros.size(), single.zeros.size());
  for (size_t i = 0; i < single.zeros.size(); ++i) {
    EXPECT_NEAR(got.params_norms[i], single.params_norms[i], 1e-6 * single.params_norms[i]) << "iteration " << i + 1;
    EXPECT_EQ(got.zeros[i], single.zeros[i]) << "iteration " << i + 1;
  }
  EXPECT_GT(single.zeros[0], 0);  // unseen positions
}

class DistStepMetrics : public ::testing::TestWithParam<std::string> {};

TEST_P(DistStepMetrics, MatchSingleProcess) {
  const int world = mpi_world_size();
  if (world == 1 || world > kLayers) GTEST_SKIP() << "the layout = world size on 2 or 4 ranks";
  const std::string layout = GetParam();
  auto ps = ParallelState::create(layout == "tp" ? world : 1, layout == "pp" ? world : 1, 120);
  expect_same(train(ps.get(), layout), train(nullptr, layout));
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistStepMetrics, ::testing::Values("dp", "pp", "tp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lattice
