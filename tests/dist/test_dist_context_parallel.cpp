// Context parallelism (--context-parallel-size, model/context_parallel.h) against the
// single-process run: every sequence split over the group's ranks (two chunks each, Megatron's
// load balancing), the keys and values all-gathered for the attention and their gradients
// reduce-scattered back, the losses and their token counts summed over the group, the gradients
// summed over dp x cp. Losses, gradient norms and every parameter part over 20 iterations (10 on 4
// ranks) to
// 1e-5 relative (layout_run.h), with dropout (its masks keyed by each token's place in the
// sequence), the rotary embedding and grouped-query attention, document boundaries, per-token
// loss, recomputation, and beside data, tensor (with sequence) and pipeline parallelism. Runs
// under mpirun with 2 and 4 ranks; each layout where the world size fits it.
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
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 32, kGBS = 8;
constexpr double kLr = 1e-3, kWd = 0.1;

struct Case {
  std::string name;
  int world = 2, cp = 2, tp = 1, pp = 1;
  bool distributed_optimizer = false, overlap = false, sequence_parallel = false;
  float dropout = 0.1f;
  bool rope_gqa = false;   // rotary embedding, 2 query groups of 2 heads
  bool documents = false;  // --eod-mask-loss --reset-position-ids (eod: token 3)
  bool per_token_loss = false;
  std::string recompute;   // "", "full" or "selective"
  int64_t iterations = 20;  // 10 on 4 ranks (oversubscribed on small machines)
  int64_t window = -1;       // --window-size (sliding-window attention; -1: none)
  std::string window_skip;   // --window-attn-skip-freq
  std::string softmax_type = "vanilla";  // --softmax-type
  bool attention_mask = false;  // with documents: --reset-attention-mask too
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

TransformerConfig config(const Case& c, int tp) {
  TransformerConfig t;
  t.num_layers = 4;
  t.hidden_size = 32;
  t.num_attention_heads = 4;
  t.vocab_size = 50;
  t.make_vocab_size_divisible_by = 8;
  t.max_position_embeddings = kT;
  t.hidden_dropout = t.attention_dropout = c.dropout;
  if (c.rope_gqa) {
    t.position_embedding_type = "rope";
    t.num_query_groups = 2;
  }
  t.window_size = c.window;
  t.softmax_type = c.softmax_type;
  if (!c.window_skip.empty())
    t.window_attn_pattern = TransformerConfig::parse_window_attn_skip_freq(c.window_skip, t.num_layers);
  if (c.recompute == "full") {
    t.recompute_granularity = "full";
    t.recompute_method = "uniform";
    t.recompute_num_layers = 2;
  } else if (c.recompute == "selective") {
    t.recompute_granularity = "selective";
  }
  t.finalize(tp);
  return t;
}

// `ps` null: the single-process reference.
LayoutRun train(const Case& c, ParallelState* ps) {
  const int P = ps ? ps->pp().size() : 1;
  const PipelineLayout layout = make_pipeline_layout(4, P, 0, 0, 0);
  const int dp_size = ps ? ps->dp().size() : 1;
  const int64_t M = kGBS / (kB * dp_size);
  const int stage = ps ? ps->pp_rank() : 0;
  const std::vector<PipelineOp> ops = pipeline_schedule(layout, M, stage);
  const ModelPlacement place{stage_layers(layout, stage), stage == 0, stage == P - 1, max_in_flight(ops)};
  const TensorParallel tp = ps ? TensorParallel{&ps->tp(), c.sequence_parallel} : TensorParallel{};
  GPTModel model(config(c, tp.size()), kB, kT, tp, place, nullptr, ContextParallel{ps ? &ps->cp() : nullptr});
  model.init_parameters(1234);
  if (c.documents) model.set_document_boundaries(DocumentBoundaries{3, true, true, c.attention_mask});
  PipelineRunner runner(model, layout, ps ? &ps->pp() : nullptr, ps ? ps->embedding() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (ps) {
    DataParallelConfig cfg;
    cfg.bucket_elements = 3000;
    cfg.distributed_optimizer = c.distributed_optimizer;
    cfg.overlap_grad_reduce = c.overlap;
    dp = std::make_unique<DataParallel>(model, ps->dp(), cfg, nullptr, nullptr, &ps->dp_cp());
  }
  Optimizer opt(model.params(), OptimizerConfig{}, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  sc.per_token_loss = c.per_token_loss;
  LayoutRun run;
  for (int64_t it = 0; it < c.iterations; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get(), &runner);
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.grad_norm);
  }
  model.params().download_params(run.params);
  run.infos = model.params().infos();
  return run;
}

class DistContextParallel : public ::testing::TestWithParam<Case> {};

TEST_P(DistContextParallel, MatchesSingleProcess) {
  const Case& c = GetParam();
  if (mpi_world_size() != c.world) GTEST_SKIP() << "needs " << c.world << " ranks";
  auto ps = ParallelState::create(c.tp, c.pp, 120, 1, c.cp);
  ASSERT_EQ(ps->cp().size(), c.cp);
  ASSERT_EQ(ps->dp_cp().size(), ps->dp().size() * c.cp);
  const LayoutRun single = train(c, nullptr);
  const LayoutRun run = train(c, ps.get());
  expect_same_run(run, single);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistContextParallel,
    ::testing::Values(
        Case{"Cp2"},
        Case{"Cp2RopeGqaDocumentsPerTokenLoss", 2, 2, 1, 1, false, false, false, 0.1f, true, true, true},
        Case{"Cp2FullRecomputeDistributedOptimizer", 2, 2, 1, 1, true, true, false, 0.1f, false, false, false, "full"},
        Case{"Cp2SelectiveRecomputeRope", 2, 2, 1, 1, false, false, false, 0.1f, true, false, false, "selective"},
        // a sliding window of 5 keys inside the 8-token chunks and across them, layers 2 and 4 full,
        // and learnable attention sinks (each rank's rows' share of their gradient summed over dp x cp)
        Case{"Cp2WindowSinksRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, false, false, "", 20, 5, "2",
             "learnable"},
        // the document mask: each rank's queries against the whole sequence's keys' document ids
        Case{"Cp2DocumentMaskRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, true, true, "", 20, -1, "",
             "vanilla", true},
        Case{"Cp4RopeGqa", 4, 4, 1, 1, false, false, false, 0.1f, true, false, false, "", 10},
        // DP 2 x CP 2: the gradients summed over all four ranks, the data split over two.
        Case{"Dp2Cp2DistributedOptimizer", 4, 2, 1, 1, true, true, false, 0.1f, false, true, false, "", 10},
        // TP 2 x CP 2 with sequence parallelism: each tensor-parallel rank's heads gathered over its
        // context-parallel peers, the token shards within this rank's chunks.
        Case{"Tp2Cp2SequenceParallelRopeGqa", 4, 2, 2, 1, false, false, true, 0.1f, true, false, false, "", 10},
        // PP 2 x CP 2: each stage's activations are its chunks' rows.
        // the window on layers 1 and 3, one on each pipeline stage
        Case{"Pp2Cp2DocumentsWindow", 4, 2, 1, 2, false, false, false, 0.1f, false, true, false, "", 10, 9, "2"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace lattice
