// Tensor and sequence parallelism against the single-process run: losses and final
// parameters over 20 iterations (dropout 0 and 0.1; learned positions and the rotary
// embedding; multi-token prediction; multi-latent attention; the attention output gate), the communication of one layer
// read from the byte counters, and the per-rank memory. Runs under mpirun with 1, 2
// and 4 ranks: TP = world size, and TP = 2 x DP = 2 with the distributed optimizer on 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "dist/mpi_comm.h"
#include "dist/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/data_parallel.h"
#include "train/train_step.h"
#include "layout_run.h"
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

constexpr int64_t kB = 2, kT = 16, kGBS = 8, kIters = 20;
constexpr double kLr = 1e-3, kWd = 0.1;

// 50 real tokens padded to a multiple of 8 x TP (56 on one rank, 64 on 2 or 4), so the
// vocabulary splits unevenly: with TP = 4 the last rank holds 2 real rows.
// swiglu: SwiGLU's fc1 (its weight and bias each the gate's and the up projection's rows,
// both split over the ranks), ffn 64 (the default for hidden 32). qk_norm 1: --qk-layernorm
// (each rank normalizes its heads' queries and keys; the replicated norms' gradients all-reduced);
// 2: --qk-l2-norm (the same without weights),
// always with the rotary embedding: with learned positions the key norm's bias adds the same to
// every score of a query, so its gradient is zero up to rounding, which Adam amplifies.
TransformerConfig config(float dropout, int tp, int64_t layers = 2, bool rope = false, bool swiglu = false,
                         int qk_norm = 0, bool moe = false, bool gpt_oss = false, int64_t mtp = 0, int mla = 0,
                         bool gate = false, bool no_rope = false, bool gdn = false, bool hybrid = false) {
  TransformerConfig c;
  // Gated DeltaNet in layer 0 (4 key and 8 value heads: whole heads per rank), attention in layer 1
  if (gdn) set_gdn(c, {1, 0}, GdnShapes{4, 8, 6, 5, 3});
  if (no_rope) c.no_rope_pattern = {0, 1};  // --no-rope-freq 2: the second layer not rotated (NoPE)
  c.attention_output_gate = gate;  // --attention-output-gate: each rank's heads' gates in its share of linear_qkv
  c.mtp_num_layers = mtp;  // --mtp-num-layers: the prediction depths' eh_proj column-parallel, their norms replicated
  c.mtp_loss_scaling_factor = 0.5f;
  c.num_attention_heads = 4;
  if (rope) {  // an attention twice as wide as the hidden size (8 heads of 8 sharing 4 keys and values:
               // grouped-query attention, whole groups per rank), no linear biases, RMSNorm, SwiGLU,
               // a sliding window of 5 keys on the first layer (the second attends fully) and learnable
               // attention sinks (one per head, split with the heads): GPT-OSS's attention
    c.position_embedding_type = "rope";
    c.window_size = 5;
    c.window_attn_pattern = {1, 0};
    c.softmax_type = "learnable";
    c.num_attention_heads = 8;
    c.num_query_groups = 4;
    c.kv_channels = 8;
    c.add_bias_linear = false;
    c.normalization = "RMSNorm";
    c.swiglu = true;
  }
  if (swiglu) c.swiglu = true;
  c.qk_layernorm = qk_norm == 1;
  c.qk_l2_norm = qk_norm == 2;
  if (qk_norm) c.position_embedding_type = "rope";  // LayerNorm's biases kept without `rope`
  if (moe) {  // 4 experts of ffn 64 (each split over the ranks), top-2, the load-balancing loss,
              // gated shared experts of ffn 32 (split too, the gate replicated)
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 64;
    c.moe_aux_loss_coeff = 0.01f;
    c.moe_shared_expert_intermediate_size = 32;
    c.moe_shared_expert_gate = true;
    c.add_bias_linear = false;
  }
  if (gpt_oss) {  // GPT-OSS's MLP: 4 experts of ffn 32 (split over the ranks), top-2, with the router's and
                  // the experts' biases (fc2's added on one rank of the group), quick GEGLU with the up
                  // projection's offset and clamps small enough to hold many values
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 32;
    c.moe_aux_loss_coeff = 0.01f;
    c.quick_geglu = true;
    c.glu_linear_offset = 1.0f;
    c.activation_func_clamp_value = 0.05f;
  }
  if (mla) {  // --multi-latent-attention: 1, a query latent of 16, RMSNorm latent norms, values narrower than the
              // queries and keys (Dq 12, Dv 6); 2, linear_q_proj with LayerNorm's latent norms (biases), YaRN,
              // values wider (Dv 16). The up projections split by heads, the rest replicated.
    c.position_embedding_type = mla == 1 ? "rope" : "yarn";
    c.yarn_rotary_scaling_factor = 4.0f;
    c.yarn_original_max_position_embeddings = 8;
    set_mla(c, mla == 1 ? MlaShapes{} : MlaShapes{0, 12, 8, 4, 16});
    if (mla == 1) c.normalization = "RMSNorm";
  }
  c.num_layers = layers;
  // --hybrid-override-pattern M*-M-: Mamba layers (8 heads of 4 in 4 groups, state 5: whole heads and groups
  // per rank), an attention-only and MLP-only layers
  if (hybrid) set_hybrid(c, "M*-M-", MambaShapes{8, 4, 4, 5});
  c.hidden_size = 32;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = kT;
  c.hidden_dropout = c.attention_dropout = dropout;
  c.finalize(tp);
  return c;
}


LayoutRun train(float dropout, const TensorParallel& tp, ParallelState* ps, const DataParallelConfig* dp_cfg,
                bool rope = false, bool swiglu = false, int qk_norm = 0, bool moe = false,
                bool gpt_oss = false, int64_t mtp = 0, int mla = 0, bool gate = false, bool no_rope = false,
                bool muon = false, bool gdn = false, bool hybrid = false) {
  GPTModel model(config(dropout, tp.size(), 2, rope, swiglu, qk_norm, moe, gpt_oss, mtp, mla, gate, no_rope, gdn, hybrid),
                 kB, kT, tp);
  // --optimizer muon --muon-tp-mode duplicated: every matrix orthogonalized whole (its shards gathered
  // over the tensor-parallel group), linear_qkv split by query groups: the single process's numbers.
  OptimizerConfig oc;
  if (muon) {
    oc.optimizer = "muon";
    oc.muon.tp_mode = "duplicated";
    oc.muon.nesterov = true;
    oc.muon.qkv_split_rows = model.config().qkv_group_rows();
  }
  model.init_parameters(1234);
  std::unique_ptr<DataParallel> dp;
  if (dp_cfg) dp = std::make_unique<DataParallel>(model, ps->dp(), *dp_cfg);
  Optimizer opt(model.params(), oc, dp ? dp->owned_ranges() : ElementRanges{}, tp.comm);
  MockSamples data(model.config().vocab_size, kT, 7);
  StepConfig sc{kB, kGBS, kT, 1.0, 1234};
  LayoutRun run;
  for (int64_t it = 0; it < kIters; ++it) {
    const StepResult r = train_step(model, opt, data, sc, it, kLr, kWd, dp.get());
    run.losses.push_back(r.lm_loss);
    run.grad_norms.push_back(r.grad_norm);
  }
  run.params.assign(model.params().params(), model.params().params() + model.params().numel());
  run.infos = model.params().infos();
  run.key_bias_noise = key_bias_elements(model.config());
  return run;
}

struct Layout {
  bool sequence_parallel;
  float dropout;
  bool rope = false;  // the rotary embedding (each rank rotates its heads' q and k), 8 heads of 8 in 4
                      // query groups, --disable-bias-linear, RMSNorm, SwiGLU
  bool swiglu = false;  // SwiGLU with the linear layers' biases
  int qk_norm = 0;            // 1: --qk-layernorm, 2: --qk-l2-norm
  bool moe = false;           // --num-experts 4 (Megatron's TP split of every expert)
  bool gpt_oss = false;       // GPT-OSS's MLP: experts with biases, the clamped quick GEGLU
  int64_t mtp = 0;            // --mtp-num-layers
  int mla = 0;                // --multi-latent-attention (config())
  bool gate = false;          // --attention-output-gate
  bool no_rope = false;       // --no-rope-freq 2 (with rope)
  bool muon = false;          // --optimizer muon --muon-tp-mode duplicated
  bool gdn = false;           // --experimental-attention-variant gated_delta_net (layer 0), with SwiGLU
  bool hybrid = false;        // --hybrid-override-pattern M*-M- (config())
};

class DistTensorParallel : public ::testing::TestWithParam<Layout> {};

// TP = world size.
TEST_P(DistTensorParallel, MatchesSingleProcess) {
  auto ps = ParallelState::create(mpi_world_size(), 1, 120);
  const Layout l = GetParam();
  LayoutRun single = train(l.dropout, TensorParallel{}, nullptr, nullptr, l.rope, l.swiglu, l.qk_norm, l.moe,
                             l.gpt_oss, l.mtp, l.mla, l.gate, l.no_rope, l.muon, l.gdn, l.hybrid);
  LayoutRun tp = train(l.dropout, TensorParallel{&ps->tp(), l.sequence_parallel}, ps.get(), nullptr, l.rope, l.swiglu, l.qk_norm, l.moe,
                             l.gpt_oss, l.mtp, l.mla, l.gate, l.no_rope, l.muon, l.gdn, l.hybrid);
  expect_same_run(tp, single);
}

// TP = 2 x DP = 2 with the distributed optimizer (4 ranks only).
TEST_P(DistTensorParallel, WithDataParallelDistributedOptimizerMatchesSingleProcess) {
  if (mpi_world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto ps = ParallelState::create(2, 1, 120);
  const Layout l = GetParam();
  if (l.muon) GTEST_SKIP() << "--optimizer muon does not go with the distributed optimizer";
  LayoutRun single = train(l.dropout, TensorParallel{}, nullptr, nullptr, l.rope, l.swiglu, l.qk_norm, l.moe,
                             l.gpt_oss, l.mtp, l.mla, l.gate, l.no_rope, l.muon, l.gdn, l.hybrid);
  DataParallelConfig cfg;
  cfg.bucket_elements = 3000;
  cfg.distributed_optimizer = true;
  cfg.overlap_grad_reduce = true;
  LayoutRun run = train(l.dropout, TensorParallel{&ps->tp(), l.sequence_parallel}, ps.get(), &cfg, l.rope, l.swiglu, l.qk_norm, l.moe,
                             l.gpt_oss, l.mtp, l.mla, l.gate, l.no_rope, l.muon, l.gdn, l.hybrid);
  expect_same_run(run, single);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistTensorParallel,
                         ::testing::Values(Layout{false, 0.0f}, Layout{true, 0.0f}, Layout{false, 0.1f},
                                           Layout{true, 0.1f}, Layout{true, 0.1f, true},
                                           Layout{false, 0.1f, false, true}, Layout{false, 0.0f, false, false, true},
                                           Layout{true, 0.1f, true, false, true},
                                           Layout{false, 0.1f, false, true, false, true},
                                           Layout{true, 0.0f, true, false, false, true}, Layout{true, 0.1f, false, false, false, true},
                                           Layout{true, 0.1f, false, false, false, false, true},
                                           Layout{false, 0.0f, false, false, false, false, true},
                                           Layout{true, 0.1f, false, false, 2},
                                           Layout{true, 0.1f, false, false, 0, false, false, 2},
                                           Layout{false, 0.1f, false, true, 0, false, false, 1},
                                           Layout{false, 0.0f, false, false, 0, false, false, 0, 1},
                                           Layout{true, 0.0f, false, false, 0, false, false, 0, 1},
                                           Layout{true, 0.1f, false, false, 0, false, false, 1, 2},
                                           Layout{true, 0.1f, true, false, 0, false, false, 0, 0, true},
                                           Layout{false, 0.1f, false, false, 1, false, false, 0, 0, true},
                                           Layout{true, 0.0f, false, false, 0, true, false, 0, 0, true},
                                           Layout{true, 0.1f, true, false, 0, false, false, 0, 0, false, true},
                                           Layout{true, 0.1f, true, false, 0, false, false, 0, 0, true, false, true},
                                           Layout{false, 0.0f, false, false, 0, true, false, 0, 0, false, false, true},
                                           Layout{true, 0.1f, true, false, 0, false, false, 0, 0, true, false, false, true},
                                           Layout{false, 0.0f, false, true, 0, false, false, 0, 0, false, false, false, true},
                                           Layout{false, 0.0f, false, false, 0, false, false, 0, 0, false, false, false,
                                                  false, true},
                                           Layout{true, 0.1f, false, false, 0, false, false, 0, 0, false, false, false,
                                                  false, true}),
                         [](const auto& info) {
                           return std::string(info.param.sequence_parallel ? "SP" : "TP") +
                                  (info.param.dropout > 0 ? "Dropout" : "NoDropout") + (info.param.rope ? "Rope" : "") +
                                  (info.param.swiglu ? "Swiglu" : "") + (info.param.qk_norm == 1 ? "QkLayernorm" : info.param.qk_norm == 2 ? "QkL2Norm" : "") + (info.param.moe ? "Moe" : "") +
                                  (info.param.gpt_oss ? "GptOssMlp" : "") +
                                  (info.param.mtp ? "Mtp" + std::to_string(info.param.mtp) : "") +
                                  (info.param.mla ? "Mla" + std::to_string(info.param.mla) : "") +
                                  (info.param.gate ? "Gate" : "") + (info.param.no_rope ? "NoRopeLayer" : "") +
                                  (info.param.muon ? "MuonDuplicated" : "") + (info.param.gdn ? "GatedDeltaNet" : "") +
                                  (info.param.hybrid ? "HybridMamba" : "");
                         });

// The tensor-parallel group's counters over one micro-batch's forward and backward.
CommStats one_micro_batch(ParallelState& ps, bool sp, int64_t layers) {
  GPTModel model(config(0.0f, ps.tp().size(), layers), kB, kT, TensorParallel{&ps.tp(), sp});
  model.init_parameters(1);
  MockSamples data(model.config().vocab_size, kT, 3);
  std::vector<int32_t> tokens(static_cast<size_t>(kB * (kT + 1)));
  fill_micro_batch(data, 0, kB, tokens.data());
  ps.tp().stats().reset();
  model.forward_backward(tokens.data(), nullptr, kB, kT, 1.0f, MicroBatchKey{});
  return ps.tp().stats();
}

// Per layer and micro-batch (the difference between 2 and 1 layers): Megatron's two
// all-reduces of B x T x h forward and two backward; with sequence parallelism each
// becomes an all-gather plus a reduce-scatter of the same tensor, and backward
// all-gathers the two LayerNorm outputs again for the weight gradients (Megatron keeps
// only their shards).
TEST(DistTensorParallelVolume, CommunicationPerLayerIsMegatrons) {
  auto ps = ParallelState::create(mpi_world_size(), 1, 120);
  if (ps->tp().size() == 1) GTEST_SKIP() << "needs tensor parallelism";
  const uint64_t act = uint64_t(kB * kT * 32) * sizeof(float);  // B x T x h fp32
  auto per_layer = [&](bool sp, CommOp op) {
    const CommStats one = one_micro_batch(*ps, sp, 1), two = one_micro_batch(*ps, sp, 2);
    return std::pair<uint64_t, uint64_t>{two.bytes[int(op)] - one.bytes[int(op)],
                                         two.calls[int(op)] - one.calls[int(op)]};
  };
  EXPECT_EQ(per_layer(false, CommOp::all_reduce), std::make_pair(4 * act, uint64_t(4)));
  EXPECT_EQ(per_layer(false, CommOp::all_gather), std::make_pair(uint64_t(0), uint64_t(0)));
  EXPECT_EQ(per_layer(true, CommOp::all_reduce), std::make_pair(uint64_t(0), uint64_t(0)));
  EXPECT_EQ(per_layer(true, CommOp::reduce_scatter), std::make_pair(4 * act, uint64_t(4)));
  EXPECT_EQ(per_layer(true, CommOp::all_gather), std::make_pair(6 * act, uint64_t(6)));
}

// Parameters per layer fall as 1/T except the replicated norms and row-parallel biases
// (6h per layer); activations per layer fall as 1/T with sequence parallelism.
TEST(DistTensorParallelMemory, PerRankMemoryFallsAsOneOverT) {
  auto ps = ParallelState::create(mpi_world_size(), 1, 120);
  const int P = ps->tp().size();
  if (P == 1) GTEST_SKIP() << "needs tensor parallelism";
  auto layer_params = [&](const TensorParallel& tp, bool duplicated) {
    GPTModel m(config(0.0f, tp.size(), 1), kB, kT, tp);
    int64_t n = 0;
    for (const ParamInfo& p : m.params().infos())
      if (p.name.rfind("decoder.layers.", 0) == 0 && p.tp_duplicated == duplicated) n += p.numel;
    return n;
  };
  const TensorParallel one{}, split{&ps->tp(), false};
  EXPECT_EQ(layer_params(one, true), 0);
  EXPECT_EQ(layer_params(split, false) * P + layer_params(split, true), layer_params(one, false));
  EXPECT_EQ(layer_params(split, true), 6 * 32);

  auto per_layer = [&](const TensorParallel& tp) {
    const TransformerConfig c1 = config(0.0f, tp.size(), 1), c2 = config(0.0f, tp.size(), 2);
    // 8 x 16 tokens: every per-rank buffer is a whole number of 64-byte arena blocks.
    return int64_t(GPTModel::activation_bytes(c2, 8, kT, tp)) - int64_t(GPTModel::activation_bytes(c1, 8, kT, tp));
  };
  const int64_t base = per_layer(one);
  EXPECT_EQ(per_layer(TensorParallel{&ps->tp(), true}) * P, base);
  EXPECT_GT(per_layer(TensorParallel{&ps->tp(), false}), base / P);
}

}  // namespace
}  // namespace lattice
