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

#include <cmath>

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
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

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
  // Experts: "" none; "gpt_oss": 4 of GPT-OSS's MLP (biases, the clamped quick GEGLU), top 2, with
  // the load-balancing loss and the z-loss; "sigmoid_seq": sigmoid scores with the expert bias and the
  // per-sequence load-balancing loss (each sequence's counts over its chunks on both ranks).
  std::string moe;
  int64_t mtp = 0;  // --mtp-num-layers (each depth's tokens shifted along the whole sequences, then split)
  // --multi-latent-attention (a query latent of 16, a key-value latent of 12, Dq 12, Dv 6, latent norms; its
  // fused qkv gathered over the ranks as any layer's)
  bool mla = false;
  bool gate = false;  // --attention-output-gate (each rank's rows' gates, local to their tokens)
  bool no_rope = false;  // --no-rope-freq 2: layers 2 and 4 not rotated (with rope_gqa)
  // --experimental-attention-variant gated_delta_net on layers 1 and 3 (gdn_key_heads key heads and twice as
  // many value heads, SwiGLU) over the whole sequences: each rank its share of the heads when the CP size
  // divides the tensor-parallel rank's key heads, else every rank all of them
  bool gdn = false;
  int64_t gdn_key_heads = 2;
  // --hybrid-override-pattern (4 layers; Mamba layers of 4 heads of 8 in 4 groups, state 6): each rank scans its
  // share of the heads and groups over the whole sequences
  std::string hybrid;
  bool repeated_mtp = false;  // --mtp-use-repeated-layer (the shared depth's gradients announced once, after both)
};

// A run and the MoE losses it reported, each step's.
struct CpRun : LayoutRun {
  std::vector<double> load_balancing, z;
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
  t.mtp_num_layers = c.mtp;
  t.mtp_loss_scaling_factor = 0.5f;
  if (!c.window_skip.empty())
    t.window_attn_pattern = TransformerConfig::parse_window_attn_skip_freq(c.window_skip, t.num_layers);
  if (!c.moe.empty()) {
    t.num_experts = 4;
    t.moe_router_topk = 2;
    t.moe_ffn_hidden_size = 32;
    t.moe_aux_loss_coeff = 0.01f;
  }
  if (c.moe == "gpt_oss") {  // with YaRN's rotary table (each chunk's rows at their positions)
    if (c.rope_gqa) {
      t.position_embedding_type = "yarn";
      t.yarn_rotary_scaling_factor = 4.0f;
      t.yarn_original_max_position_embeddings = 8;
    }
    t.quick_geglu = true;
    t.glu_linear_offset = 1.0f;
    t.activation_func_clamp_value = 0.05f;
    t.moe_z_loss_coeff = 1e-3f;
  } else if (c.moe == "sigmoid_seq") {
    t.add_bias_linear = false;
    t.moe_router_score_function = "sigmoid";
    t.moe_router_enable_expert_bias = true;
    t.moe_router_bias_update_rate = 0.01f;
    t.moe_aux_loss_coeff = 0.0f;  // the per-sequence loss alone
    t.moe_seq_aux_loss = true;
    t.moe_seq_aux_loss_coeff = 0.01f;
  }
  if (c.mla) set_mla(t);
  t.attention_output_gate = c.gate;
  if (c.no_rope) t.no_rope_pattern = {0, 1, 0, 1};
  if (c.gdn) {
    t.swiglu = true;
    set_gdn(t, {1, 0, 1, 0}, GdnShapes{c.gdn_key_heads, 2 * c.gdn_key_heads, 8, 6});
  }
  if (!c.hybrid.empty()) set_hybrid(t, c.hybrid, MambaShapes{4, 8, 4, 6});
  t.mtp_use_repeated_layer = c.repeated_mtp;
  if (c.recompute == "full") {
    t.recompute_granularity = "full";
    t.recompute_method = "uniform";
    t.recompute_num_layers = 2;
  } else if (c.recompute == "selective") {
    t.recompute_granularity = "selective";
    if (c.mla) t.recompute_modules = {"core_attn", "mla_up_proj"};  // the fused qkv rotated again at its chunks' positions
  }
  t.finalize(tp);
  return t;
}

// `ps` null: the single-process reference.
CpRun train(const Case& c, ParallelState* ps) {
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
    // As the trainer makes it (the experts' gradients over ps->expert_dp(): dp x cp without expert parallelism).
    dp = std::make_unique<DataParallel>(model, ps->dp(), cfg, &ps->ep(), &ps->expert_dp(), &ps->dp_cp());
  }
  Optimizer opt(model.params(), OptimizerConfig{}, dp ? dp->owned_ranges() : ElementRanges{});
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  sc.per_token_loss = c.per_token_loss;
  CpRun run;
  for (int64_t it = 0; it < c.iterations; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get(), &runner);
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.grad_norm);
    run.load_balancing.push_back(r.load_balancing_loss);
    run.z.push_back(r.z_loss);
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
  const CpRun single = train(c, nullptr);
  const CpRun run = train(c, ps.get());
  expect_same_run(run, single);
  for (size_t i = 0; i < single.load_balancing.size(); ++i) {  // the whole micro-batches' losses, as reported
    EXPECT_NEAR(run.load_balancing[i], single.load_balancing[i], 1e-5 * std::fabs(single.load_balancing[i])) << i;
    EXPECT_NEAR(run.z[i], single.z[i], 1e-5 * std::fabs(single.z[i])) << i;
  }
  if (!c.moe.empty()) EXPECT_GT(single.load_balancing[0], 0.5);
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
        Case{"Pp2Cp2DocumentsWindow", 4, 2, 1, 2, false, false, false, 0.1f, false, true, false, "", 10, 9, "2"},
        // Experts: each rank routes its chunks' tokens; the load-balancing loss counts both ranks' tokens
        // (each rank's share of the loss and its gradient over the whole micro-batch's counts).
        Case{"Cp2GptOssMoeSinksWindowRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, false, false, "", 20, 5, "2",
             "learnable", false, "gpt_oss"},
        Case{"Cp2MoeSigmoidExpertBiasSequenceAuxLoss", 2, 2, 1, 1, true, true, false, 0.0f, false, false, false, "", 20,
             -1, "", "vanilla", false, "sigmoid_seq"},
        Case{"Tp2Cp2SequenceParallelGptOssMoe", 4, 2, 2, 1, false, false, true, 0.1f, true, false, false, "", 10, -1, "",
             "vanilla", false, "gpt_oss"},
        // --mtp-num-layers: the depths' inputs, targets and mask shifted along the whole sequences (a chunk's
        // last rows take the next chunk's tokens, another rank's), the documents and the attention unshifted.
        Case{"Cp2MtpDocumentMaskPerTokenLossRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, true, true, "", 20, -1,
             "", "vanilla", true, "", 2},
        Case{"Cp2MtpLearnedPositionsDistributedOptimizer", 2, 2, 1, 1, true, true, false, 0.1f, false, false, false, "", 20,
             -1, "", "vanilla", false, "", 1},
        Case{"Tp2Cp2SequenceParallelMtpGptOssMoe", 4, 2, 2, 1, false, false, true, 0.1f, true, false, false, "", 10, -1, "",
             "vanilla", false, "gpt_oss", 1},
        // --multi-latent-attention: the fused qkv its latents make, gathered and its gradient scattered as any layer's.
        Case{"Cp2MlaDocumentMaskSelectiveRecompute", 2, 2, 1, 1, false, false, false, 0.1f, false, true, true,
             "selective", 20, -1, "", "vanilla", true, "", 0, true},
        Case{"Tp2Cp2SequenceParallelMlaFullRecompute", 4, 2, 2, 1, false, false, true, 0.1f, false, false, false, "full",
             10, -1, "", "vanilla", false, "", 0, true},
        Case{"Pp2Cp2MlaDistributedOptimizer", 4, 2, 1, 2, true, true, false, 0.1f, false, false, false, "", 10, -1, "",
             "vanilla", false, "", 0, true},
        // --attention-output-gate: the gated qkv's keys and values gathered, their gradients scattered back.
        Case{"Cp2GateDocumentMaskSelectiveRecomputeRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, true, true,
             "selective", 20, -1, "", "vanilla", true, "", 0, false, true},
        Case{"Tp2Cp2SequenceParallelGateRopeGqa", 4, 2, 2, 1, false, false, true, 0.1f, true, false, false, "", 10, -1,
             "", "vanilla", false, "", 0, false, true},
        // --no-rope-freq: the rotated layers' chunks at their positions, the others not rotated.
        Case{"Cp2NoRopeLayersDocumentsRopeGqa", 2, 2, 1, 1, false, false, false, 0.1f, true, true, false, "", 20, -1, "",
             "vanilla", false, "", 0, false, false, true},
        // Gated DeltaNet, the state over the whole sequences: CP 2 splitting the 2 key heads (an all-to-all to
        // each rank's head and back; each rank adds its heads' parameter gradients), with full recomputation
        // and the distributed optimizer; TP 2 x CP 2 with sequence parallelism, each tensor-parallel rank's one
        // key head gathered whole on both CP ranks (the parameters' gradients added once), and with 4 key heads
        // split. The first two with document masks: the states and convolutions restart at each document of
        // the whole sequences.
        Case{"Cp2GatedDeltaNetDocumentMaskFullRecomputeDistributedOptimizerRopeGqa", 2, 2, 1, 1, true, true, false, 0.1f,
             true, true, false, "full", 20, -1, "", "vanilla", true, "", 0, false, false, false, true},
        Case{"Tp2Cp2SequenceParallelGatedDeltaNetGateDocumentMask", 4, 2, 2, 1, false, false, true, 0.1f, true, true,
             false, "", 10, -1, "", "vanilla", true, "", 0, false, true, false, true},
        Case{"Tp2Cp2SequenceParallelGatedDeltaNetSplitHeads", 4, 2, 2, 1, false, false, true, 0.1f, true, false, false,
             "", 10, -1, "", "vanilla", false, "", 0, false, true, false, true, 4},
        // Hybrid Mamba models (M*M-), the scan over the whole sequences: CP 2 (each rank 2 heads in 2 groups, by
        // all-to-alls; its heads' parameter gradients, its conv1d rows' added to the layer's) with document
        // masks (the states and convolutions restart at each document of the whole sequences), full
        // recomputation and the distributed optimizer; TP 2 x CP 2 with sequence parallelism (one head and one
        // group each) and selective recomputation; PP 2 x CP 2 (layers M* and M-) with documents; CP 4.
        Case{"Cp2HybridMambaDocumentMaskFullRecomputeDistributedOptimizerRopeGqa", 2, 2, 1, 1, true, true, false, 0.1f,
             true, true, false, "full", 20, -1, "", "vanilla", true, "", 0, false, false, false, false, 2, "M*M-"},
        Case{"Tp2Cp2SequenceParallelHybridMambaSelectiveRecompute", 4, 2, 2, 1, false, false, true, 0.1f, true, false,
             false, "selective", 10, -1, "", "vanilla", false, "", 0, false, false, false, false, 2, "M*M-"},
        Case{"Pp2Cp2HybridMambaDocumentMask", 4, 2, 1, 2, false, false, false, 0.1f, false, true, false, "", 10, -1, "",
             "vanilla", true, "", 0, false, false, false, false, 2, "M*M-"},
        Case{"Cp4HybridMamba", 4, 4, 1, 1, false, false, false, 0.1f, true, false, false, "", 10, -1, "", "vanilla",
             false, "", 0, false, false, false, false, 2, "M*M-"},
        // A hybrid's prediction depths (Megatron's unified pattern): two of a Mamba layer with an MLP block ("M-"),
        // their state over the whole shifted sequences, with document masks.
        Case{"Cp2HybridMambaMtp2DocumentMask", 2, 2, 1, 1, false, false, false, 0.1f, true, true, false, "", 20, -1, "",
             "vanilla", true, "", 0, false, false, false, false, 2, "M*M-/M-/M-"},
        // --mtp-use-repeated-layer with the overlapped gradient reduction: the shared depth's buckets go out once
        // both depths' gradients are in (a GPT model's depths, and a hybrid's).
        Case{"Cp2Mtp2RepeatedLayerOverlapDistributedOptimizer", 2, 2, 1, 1, true, true, false, 0.1f, true, false, false,
             "", 20, -1, "", "vanilla", false, "", 2, false, false, false, false, 2, "", true},
        Case{"Cp2HybridMambaMtp2RepeatedLayerOverlap", 2, 2, 1, 1, true, true, false, 0.1f, true, false, false, "", 20,
             -1, "", "vanilla", false, "", 0, false, false, false, false, 2, "M*M-/*-/*-", true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace lattice
