// Pipeline parallelism (1F1B, interleaved, uneven stages) and the 3D layout against the
// single-process run: losses, gradient norms and final parameters over 20 iterations
// with dropout 0 and 0.1; the activations stage 0 keeps in flight. Runs under mpirun
// with 2 and 4 ranks (PP = world size) and 8 ranks (TP 2 x PP 2 x DP 2).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "core/error.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_runner.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"
#include "../mamba_test_config.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 8, kIters = 20;
constexpr double kLr = 1e-3, kWd = 0.1;

struct Case {
  std::string name;
  int64_t layers = 4;
  int64_t per_virtual = 0, first = 0, last = 0;  // pipeline layout flags
  bool untie = false;
  float dropout = 0.0f;
  float adam_eps = 1e-8f;
  int64_t experts = 0;  // --num-experts (top-2, the load-balancing loss, no linear biases)
  std::vector<int> moe_layers = {};  // --moe-layer-freq's pattern (empty: every layer)
  bool sigmoid_bias = false;  // sigmoid scores and the expert bias (rate 0.01)
  double capacity = 0;        // --moe-expert-capacity-factor
  bool embedding_in_split = false, loss_in_split = false;  // --account-for-embedding/loss-in-pipeline-split
  int64_t mtp = 0;    // --mtp-num-layers (on the last stage, its lookup through the shared word embedding)
  bool rope = false;  // --position-embedding-type rope
  bool muon = false;  // --optimizer muon (each stage's matrices its own; the embedding copies Adam's)
  std::string hybrid;  // --hybrid-override-pattern (its length is `layers`; Mamba layers of tests/mamba_test_config.h)
  std::string layout;  // --pipeline-model-parallel-layout (instead of the flags above)
  int64_t group = 0;   // --microbatch-group-size-per-virtual-pipeline-stage (0: P)
  int64_t global_batch = kGBS;
};

// An interleaved case (4 layers, one per chunk: 2 chunks per stage on 2 ranks) with its micro-batch group
// and global batch (micro-batches of 2).
Case group_case(const std::string& name, int64_t group, int64_t global_batch) {
  Case c;
  c.name = name;
  c.per_virtual = 1;
  c.dropout = 0.1f;
  c.group = group;
  c.global_batch = global_batch;
  return c;
}

// A --pipeline-model-parallel-layout case.
Case layout_case(const std::string& name, int64_t layers, const std::string& layout, float dropout, int64_t mtp = 0) {
  Case c;
  c.name = name;
  c.layers = layers;
  c.layout = layout;
  c.dropout = dropout;
  c.mtp = mtp;
  c.rope = mtp > 0;  // the last stage's prediction depths have no position table
  return c;
}

PipelineLayout layout_of(const Case& c, int P) {
  PipelineLayout l = !c.layout.empty() ? parse_pipeline_layout(c.layout, c.layers, P, c.mtp)
                                       : make_pipeline_layout(c.layers, P, c.per_virtual, c.first, c.last,
                                                              c.embedding_in_split, c.loss_in_split);
  l.microbatch_group_size = c.group;
  return l;
}

TransformerConfig config(const Case& c, int tp) {
  TransformerConfig t;
  t.num_layers = c.layers;
  t.hidden_size = 32;
  t.num_attention_heads = 4;
  t.vocab_size = 50;
  t.make_vocab_size_divisible_by = 8;
  t.max_position_embeddings = kT;
  t.hidden_dropout = t.attention_dropout = c.dropout;
  t.untie_embeddings_and_output_weights = c.untie;
  t.mtp_num_layers = c.mtp;
  t.mtp_loss_scaling_factor = 0.5f;
  if (c.rope) t.position_embedding_type = "rope";
  if (!c.hybrid.empty()) set_hybrid(t, c.hybrid);
  if (c.experts > 0) {
    t.num_experts = c.experts;
    t.moe_router_topk = 2;
    t.moe_aux_loss_coeff = 0.01f;
    t.add_bias_linear = false;
    t.moe_layer_pattern = c.moe_layers;
    t.moe_expert_capacity_factor = c.capacity;
    if (c.sigmoid_bias) {
      t.moe_router_score_function = "sigmoid";
      t.moe_router_enable_expert_bias = true;
      t.moe_router_bias_update_rate = 0.01f;
    }
  }
  t.finalize(tp);
  return t;
}


// `ps` null: the single-process reference; `perturb`: its initial parameters moved by that much (relative).
LayoutRun train(const Case& c, ParallelState* ps, bool sequence_parallel, const DataParallelConfig* dp_cfg,
                double perturb = 0) {
  const int P = ps ? ps->pp().size() : 1;
  const PipelineLayout layout = ps ? layout_of(c, P) : make_pipeline_layout(c.layers, 1, 0, 0, 0);
  const int dp_size = ps ? ps->dp().size() : 1;
  const int64_t M = c.global_batch / (kB * dp_size);
  const int stage = ps ? ps->pp_rank() : 0;
  const std::vector<PipelineOp> ops = pipeline_schedule(layout, M, stage);
  const ModelPlacement place{stage_layers(layout, stage), stage == 0, stage == P - 1, max_in_flight(ops)};
  const TensorParallel tp = ps ? TensorParallel{&ps->tp(), sequence_parallel} : TensorParallel{};
  GPTModel model(config(c, tp.size()), kB, kT, tp, place);
  model.init_parameters(1234);
  if (perturb != 0) perturb_parameters(model.params(), perturb);
  PipelineRunner runner(model, layout, ps ? &ps->pp() : nullptr, ps ? ps->embedding() : nullptr);
  std::unique_ptr<DataParallel> dp;
  if (dp_cfg) dp = std::make_unique<DataParallel>(model, ps->dp(), *dp_cfg);
  OptimizerConfig oc;
  oc.adam_eps = c.adam_eps;
  if (c.muon) oc.optimizer = "muon";
  Optimizer opt(model.params(), oc, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{kB, c.global_batch, kT, 1.0, 1234};
  LayoutRun run;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get(), &runner);
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.grad_norm);
  }
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  run.infos = model.params().infos();
  run.peak_activations = runner.peak_activations();
  run.warmup = warmup_forwards(ops) - 1;
  return run;
}

class DistPipeline : public ::testing::TestWithParam<Case> {};

TEST_P(DistPipeline, MatchesSingleProcess) {
  const int world = mpi_world_size();
  if (world == 1 || world == 8) GTEST_SKIP() << "PP = world size on 2 or 4 ranks";
  const Case& c = GetParam();
  try {
    layout_of(c, world);
  } catch (const Error& e) {
    GTEST_SKIP() << "layout does not fit " << world << " stages: " << e.what();
  }
  auto ps = ParallelState::create(1, world, 120);
  const LayoutRun single = train(c, nullptr, false, nullptr);
  const LayoutRun pp = train(c, ps.get(), false, nullptr);
  expect_same_run(pp, single);
  if (ps->pp_rank() == 0 && layout_of(c, world).virtual_stages == 1) {
    // 1F1B: stage 0 keeps at most warmup + 1 micro-batches of activations.
    EXPECT_EQ(pp.warmup, std::min<int64_t>(world - 1, c.global_batch / kB));
    EXPECT_EQ(pp.peak_activations, pp.warmup + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistPipeline,
    ::testing::Values(Case{"OneFOneB", 4, 0, 0, 0, false, 0.0f}, Case{"OneFOneBDropout", 4, 0, 0, 0, false, 0.1f},
                      Case{"Untied", 4, 0, 0, 0, true, 0.1f},
                      Case{"Interleaved", 4, 1, 0, 0, false, 0.0f},
                      Case{"InterleavedDropout", 4, 1, 0, 0, false, 0.1f},
                      Case{"UnevenFirst", 7, 0, 1, 0, false, 0.0f}, Case{"UnevenLast", 7, 0, 0, 1, false, 0.1f},
                      Case{"MixtureOfExpertsInterleavedDropout", 4, 1, 0, 0, false, 0.1f, 1e-8f, 4},
                      // 6 layers + embedding + loss: 2 and 4 stages, the end stages one layer short.
                      Case{"EmbeddingAndLossInSplit", 6, 0, 0, 0, false, 0.1f, 1e-8f, 0, {}, false, 0, true, true},
                      // 7 + embedding interleaved, one split layer per chunk: stage 0's first chunk is
                      // the embedding alone (no layers), on 2 stages (4 chunks each) and 4 (2 each).
                      Case{"EmbeddingInSplitInterleaved", 7, 1, 0, 0, true, 0.1f, 1e-8f, 0, {}, false, 0, true},
                      // 7 + loss interleaved: the last stage's last chunk is the loss alone.
                      Case{"LossInSplitInterleaved", 7, 1, 0, 0, false, 0.0f, 1e-8f, 0, {}, false, 0, false, true},
                      // --mtp-num-layers: the depths on the last stage (its last virtual chunk), their lookup
                      // through its copy of the word embedding (the tied output layer's, or an untied model's
                      // own), summed with the first stage's over the embedding group.
                      Case{"MtpRopeDropout", 4, 0, 0, 0, false, 0.1f, 1e-8f, 0, {}, false, 0, false, false, 2, true},
                      Case{"MtpUntiedRopeInterleaved", 4, 1, 0, 0, true, 0.1f, 1e-8f, 0, {}, false, 0, false, false, 1,
                           true},
                      Case{"MtpMixtureOfExpertsSigmoidBias", 4, 0, 0, 0, false, 0.0f, 1e-8f, 4, {}, true, 0, false, false,
                           1, true},
                      // --optimizer muon: experts and MTP's layer orthogonalized on their stage, the tied
                      // word embedding's two copies with Adam.
                      Case{"MuonMtpMixtureOfExpertsInterleaved", 4, 1, 0, 0, false, 0.1f, 1e-8f, 4, {}, false, 0, false,
                           false, 1, true, true},
                      // --hybrid-override-pattern: stages starting with a Mamba, an MLP-only, an attention-only
                      // or an MoE-only layer (the first norm made on the stage), ending with each kind.
                      Case{"HybridMamba", 4, 0, 0, 0, false, 0.1f, 1e-8f, 0, {}, false, 0, false, false, 0, false,
                           false, "M*-M"},
                      Case{"HybridMambaMixtureOfExpertsInterleaved", 4, 1, 0, 0, false, 0.1f, 1e-8f, 4, {}, false, 0,
                           false, false, 0, false, false, "M-*E"},
                      // A hybrid's prediction depth on the last stage (Megatron's unified pattern): a Mamba layer
                      // with an MoE block ("ME"), its lookup through the shared word embedding (rotary positions).
                      Case{"HybridMambaMtpMixtureOfExperts", 4, 0, 0, 0, false, 0.1f, 1e-8f, 4, {}, false, 0, false,
                           false, 0, true, false, "M-*E/ME"},
                      // --pipeline-model-parallel-layout: uneven stages (interleaved on 2 ranks: 1, 3 | 1, 1
                      // layers), stages of the embedding or the loss alone, prediction depths with the loss.
                      layout_case("LayoutUnevenDropout", 6, "Et|t*3|t|tL", 0.1f),
                      layout_case("LayoutEmbeddingAndLossAlone", 6, "E|t*3|t*3|L", 0.0f),
                      layout_case("LayoutMtp", 4, "Ett|ttmL", 0.1f, 1),
                      // --microbatch-group-size-per-virtual-pipeline-stage: 4 micro-batches through a chunk at a
                      // time; 3 and 5 micro-batches (not a multiple of PP 2) in groups of 3 (the last of 2).
                      group_case("InterleavedGroupOfFour", 4, 8), group_case("InterleavedThreeMicroBatches", 3, 6),
                      group_case("InterleavedFiveMicroBatchesGroupsOfThree", 3, 10)),
    [](const auto& info) { return info.param.name; });

// Mixture of experts under PP 2 x DP 2 with the distributed optimizer (4 ranks): each data-parallel
// rank routes its own micro-batches (the load-balancing loss per micro-batch, as on one rank).
// --moe-layer-freq [1,0,0,1]: each stage holds an MoE layer and a dense one. Sigmoid scores with the
// expert bias: every data-parallel rank moves the bias by the tokens of all of them. Capacity 1: each
// rank drops within its own micro-batches, as one process does micro-batch by micro-batch.
TEST(DistPipelineMoe, WithDataParallelDistributedOptimizerMatchesSingleProcess) {
  if (mpi_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto ps = ParallelState::create(1, 2, 120);
  Case c{"MoE", 4, 0, 0, 0, false, 0.1f, 1e-8f, 4, {1, 0, 0, 1}, true, 1.0};
  DataParallelConfig cfg;
  cfg.bucket_elements = 3000;
  cfg.distributed_optimizer = true;
  cfg.overlap_grad_reduce = true;
  const LayoutRun single = train(c, nullptr, false, nullptr);
  const LayoutRun run = train(c, ps.get(), false, &cfg);
  expect_same_run(run, single);
}

// TP 2 x PP 2 x DP 2 with sequence parallelism and the distributed optimizer (8 ranks).
class DistThreeD : public ::testing::TestWithParam<float> {};

TEST_P(DistThreeD, MatchesSingleProcess) {
  if (mpi_world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  auto ps = ParallelState::create(2, 2, 120);
  // With dropout one fc1 weight's gradient is zero up to rounding (a GELU unit inactive on every
  // token), and Adam turns the three reduction orders' rounding differences into a 2e-5 parameter
  // difference there: within that element's rounding spread (layout_run.h).
  Case c{"3D", 4, 0, 0, 0, false, GetParam(), 1e-8f};
  DataParallelConfig cfg;
  cfg.bucket_elements = 3000;
  cfg.distributed_optimizer = true;
  cfg.overlap_grad_reduce = true;
  LayoutRun single = train(c, nullptr, false, nullptr);
  single.rounding_spread = measure_rounding_spread(single, train(c, nullptr, false, nullptr, kRoundingPerturbation));
  const LayoutRun run = train(c, ps.get(), true, &cfg);
  expect_same_run(run, single);
}

INSTANTIATE_TEST_SUITE_P(Dropout, DistThreeD, ::testing::Values(0.0f, 0.1f));

}  // namespace
}  // namespace lattice
