// The per-rank memory estimate (--log-memory, --dry-run) against the real thing: a
// GPTModel built with the same placement and tensor-parallel rank (a model's
// construction never communicates, so a layout-only group of T ranks stands in for the
// tensor-parallel group), its Optimizer over the shard the distributed optimizer owns,
// and Megatron's per-rank parameter formula.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dist/comm.h"
#include "model/gpt_model.h"
#include "optim/grad_sync.h"
#include "optim/optimizer.h"
#include "train/distributed_setup.h"
#include "train/memory_estimate.h"
#include "../gdn_test_config.h"
#include "../mamba_test_config.h"
#include "../mla_test_config.h"

namespace lattice {
namespace {

// Rank r of a group of n that never transfers anything (construction only).
class LayoutGroup : public Comm {
 public:
  LayoutGroup(int rank, int size) : Comm("tp"), rank_(rank), size_(size), ranks_(static_cast<size_t>(size)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void all_reduce(float*, int64_t, ReduceOp) override { ADD_FAILURE() << "unexpected transfer"; }
  void all_reduce(double*, int64_t, ReduceOp) override { ADD_FAILURE() << "unexpected transfer"; }
  std::unique_ptr<CommRequest> iall_reduce(float*, int64_t) override { return fail(); }
  std::unique_ptr<CommRequest> ireduce_scatter(const float*, float*, const std::vector<int64_t>&) override {
    return fail();
  }
  std::unique_ptr<CommRequest> iall_gather(float*, const std::vector<int64_t>&) override { return fail(); }
  void broadcast(void*, int64_t, int) override { ADD_FAILURE() << "unexpected transfer"; }
  void send(const float*, int64_t, int, int) override { ADD_FAILURE() << "unexpected transfer"; }
  void recv(float*, int64_t, int, int) override { ADD_FAILURE() << "unexpected transfer"; }
  std::unique_ptr<CommRequest> isend(const float*, int64_t, int, int) override { return fail(); }
  std::unique_ptr<CommRequest> irecv(float*, int64_t, int, int) override { return fail(); }
  void barrier() override { ADD_FAILURE() << "unexpected transfer"; }

 private:
  std::unique_ptr<CommRequest> fail() {
    ADD_FAILURE() << "unexpected transfer";
    return nullptr;
  }
  int rank_, size_;
  std::vector<int> ranks_;
};

TransformerConfig config(int64_t layers, bool untied, int64_t tp = 1) {
  TransformerConfig c;
  c.num_layers = layers;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 300;  // padded to 384 (x tp)
  c.max_position_embeddings = 32;
  c.untie_embeddings_and_output_weights = untied;
  c.finalize(tp);
  return c;
}

MemoryLayout layout(const TransformerConfig& c, int tp, int pp, int dp, int64_t micro_batches) {
  MemoryLayout m;
  m.config = c;
  m.micro_batch_size = 2;
  m.seq_length = 16;
  m.tp = tp;
  m.pp = pp;
  m.dp = dp;
  m.pipeline = make_pipeline_layout(c.num_layers, pp, 0, 0, 0);
  m.num_micro_batches = micro_batches;
  return m;
}

// The model (and optimizer) of world rank w under m, built for real.
struct RealRank {
  std::unique_ptr<LayoutGroup> group, ep_group, cp_group;
  std::unique_ptr<GPTModel> model;
  std::unique_ptr<Optimizer> optimizer;
  ElementRanges owned;
};

RealRank build(const MemoryLayout& m, int w) {
  RealRank r;
  const int tp_rank = w % m.tp, cp_rank = (w / m.tp) % m.cp, dp_rank = (w / (m.tp * m.cp)) % m.dp;
  const int stage = w / (m.tp * m.cp * m.dp);
  const ModelPlacement place{stage_layers(m.pipeline, stage), stage == 0, stage == m.pp - 1,
                             max_in_flight(pipeline_schedule(m.pipeline, m.num_micro_batches, stage))};
  r.group = std::make_unique<LayoutGroup>(tp_rank, m.tp);
  // Expert parallelism: dp ranks in groups of ep; whole experts (--expert-tensor-parallel-size 1): the
  // stage's tp x dp ranks in rank order.
  const bool whole = m.config.experts_whole(m.tp);
  const int expert_place = whole ? tp_rank + m.tp * (cp_rank + m.cp * dp_rank) : dp_rank;
  // (--num-distributed-optimizer-instances: each group cut into that many runs, a rank sharding over its own)
  const int expert_dp_ranks = (whole ? m.tp * m.cp * m.dp / m.ep : m.dp / m.ep * m.cp) / m.dist_opt_instances;
  r.ep_group = std::make_unique<LayoutGroup>(expert_place % m.ep, m.ep);
  r.cp_group = std::make_unique<LayoutGroup>(cp_rank, m.cp);
  r.model = std::make_unique<GPTModel>(m.config, m.micro_batch_size, m.seq_length,
                                       TensorParallel{m.tp > 1 ? r.group.get() : nullptr, m.sequence_parallel},
                                       place, r.ep_group.get(), ContextParallel{r.cp_group.get()});
  if (m.distributed_optimizer) {
    // As DataParallel/GradSync: this DP rank's shard of every bucket (the experts' over the expert
    // data-parallel group, in which this rank is dp_rank / ep x cp + cp_rank).
    // With context parallelism the gradients are sharded over dp x cp (rank dp_rank cp + cp_rank).
    const int grad_ranks = m.dp * m.cp / m.dist_opt_instances, grad_rank = (dp_rank * m.cp + cp_rank) % grad_ranks;
    const int64_t bucket = m.ddp_bucket_size > 0 ? m.ddp_bucket_size : default_bucket_elements(grad_ranks);
    for (const Bucket& b : make_buckets(r.model->params(), bucket, grad_ranks, expert_dp_ranks)) {
      const int rank =
          b.expert ? (whole ? expert_place / m.ep : expert_place / m.ep * m.cp + cp_rank) % expert_dp_ranks : grad_rank;
      const int64_t s = b.shard_begin(rank);
      r.owned.emplace_back(s, s + b.shard_counts[size_t(rank)]);
    }
  }
  OptimizerConfig oc;
  oc.optimizer = m.optimizer;
  oc.exp_avg_bf16 = m.exp_avg_bf16;
  oc.exp_avg_sq_bf16 = m.exp_avg_sq_bf16;
  oc.muon = m.muon;
  r.optimizer = std::make_unique<Optimizer>(r.model->params(), oc, r.owned, m.tp > 1 ? r.group.get() : nullptr);
  return r;
}

int64_t real_elements(const GPTModel& model) {
  int64_t n = 0;
  for (const ParamInfo& p : model.params().infos()) n += p.numel;
  return n;
}

void expect_matches(const MemoryLayout& m, int w) {
  SCOPED_TRACE("world rank " + std::to_string(w));
  const RankMemory e = estimate_rank_memory(m, w, 1000);
  const RealRank real = build(m, w);
  const GPTModel& model = *real.model;
  EXPECT_EQ(e.buffer_elements, model.num_parameters());
  EXPECT_EQ(e.parameters, real_elements(model));
  EXPECT_EQ(e.param_bytes, size_t(model.num_parameters()) * sizeof(float));
  EXPECT_EQ(e.grad_bytes, size_t(model.num_parameters()) * sizeof(float));
  EXPECT_EQ(e.weight_copy_bytes, 0u);
  EXPECT_EQ(e.owned_parameters, real.optimizer->state_numel());
  EXPECT_EQ(e.optimizer_bytes, real.optimizer->state_bytes());
  EXPECT_EQ(e.activation_slots, model.placement().slots);
  EXPECT_EQ(e.activation_bytes, model.arena_bytes() + model.context_parallel_bytes());
  EXPECT_EQ(e.baseline_bytes, 1000u);
  EXPECT_EQ(e.peak_bytes(), e.model_state_bytes() + e.activation_bytes + 1000);
}

TEST(MemoryEstimate, OneProcessEqualsTheModel) {
  for (bool untied : {false, true})
    for (const char* opt : {"adam", "sgd"}) {
      MemoryLayout m = layout(config(3, untied), 1, 1, 1, 4);
      m.optimizer = opt;
      expect_matches(m, 0);
      const RankMemory e = estimate_rank_memory(m, 0, 0);
      EXPECT_EQ(e.activation_slots, 1);
      EXPECT_EQ(e.grad_staging_bytes, 0u);
      EXPECT_EQ(e.owned_parameters, e.parameters);
    }
}

// --exp-avg-dtype / --exp-avg-sq-dtype bf16: 2 bytes per moment, alone or under the distributed
// optimizer's sharding.
TEST(MemoryEstimate, Bf16MomentsEqualTheOptimizer) {
  for (int combo = 1; combo < 4; ++combo)
    for (bool distributed : {false, true}) {
      MemoryLayout m = layout(config(3, false), 1, 1, 1, 4);
      m.exp_avg_bf16 = combo & 1;
      m.exp_avg_sq_bf16 = combo & 2;
      m.distributed_optimizer = distributed;
      expect_matches(m, 0);
      const RankMemory e = estimate_rank_memory(m, 0, 0);
      EXPECT_EQ(e.optimizer_bytes, size_t(e.owned_parameters) * (combo == 3 ? 4 : 6));
    }
}

// --disable-bias-linear: the four linear biases are not registered.
TEST(MemoryEstimate, NoLinearBiasesEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig c = config(3, false, P);
    c.add_bias_linear = false;
    expect_matches(layout(c, P, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(config(3, false, P), P, 1, 1, 4), 0, 0).parameters;
    const int64_t without = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
    EXPECT_EQ(with - without, 3 * (3 * c.hidden_size / P + c.hidden_size + c.ffn_hidden_size / P + c.hidden_size));
  }
}

// RMSNorm: the norms' biases are not registered.
TEST(MemoryEstimate, RmsNormEqualsTheModel) {
  TransformerConfig c = config(3, false, 2);
  c.normalization = "RMSNorm";
  const MemoryLayout m = layout(c, 2, 1, 1, 4);
  expect_matches(m, 0);
  const int64_t with = estimate_rank_memory(layout(config(3, false, 2), 2, 1, 1, 4), 0, 0).parameters;
  EXPECT_EQ(with - estimate_rank_memory(m, 0, 0).parameters, (2 * 3 + 1) * c.hidden_size);
}

// Mixers other than the attention: a hybrid's Mamba, attention-only and MLP-only layers (--hybrid-override-pattern,
// on one and two tensor-parallel ranks and two pipeline stages) and Gated DeltaNet layers: the model's
// parameters (the estimate reads the model's registry) and activations.
TEST(MemoryEstimate, HybridAndGatedDeltaNetEqualTheModel) {
  for (int P : {1, 2})
    for (int pp : {1, 2}) {
      TransformerConfig c;
      c.hidden_size = 64;
      c.num_attention_heads = 4;
      c.vocab_size = 300;
      c.max_position_embeddings = 32;
      set_hybrid(c, "M*-M", MambaShapes{8, 8, 2, 6});
      c.finalize(P);
      for (int w = 0; w < P * pp; ++w) expect_matches(layout(c, P, pp, 1, 4), w);
      TransformerConfig g = config(3, false, P);
      g.swiglu = true;
      set_gdn(g, {1, 0, 1}, GdnShapes{2, 4, 8, 6});
      g.finalize(P);
      for (int w = 0; w < P; ++w) expect_matches(layout(g, P, 1, 1, 4), w);
    }
}

// SwiGLU: fc1's weight and bias twice as tall, and its activation buffer twice as wide.
TEST(MemoryEstimate, SwigluEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig c = config(3, false, P);
    c.swiglu = true;
    expect_matches(layout(c, P, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
    const int64_t without = estimate_rank_memory(layout(config(3, false, P), P, 1, 1, 4), 0, 0).parameters;
    EXPECT_EQ(with - without, 3 * (c.ffn_hidden_size / P) * (c.hidden_size + 1));
  }
}

// Grouped-query attention: the QKV weight and bias (Q + 2 x groups x kv_channels) shrink; the
// grouped QKV output's scratch is counted among the activations.
TEST(MemoryEstimate, GroupedQueryAttentionEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig c = config(3, false, P);
    c.num_query_groups = 2;
    expect_matches(layout(c, P, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
    const int64_t without = estimate_rank_memory(layout(config(3, false, P), P, 1, 1, 4), 0, 0).parameters;
    EXPECT_EQ(without - with, 3 * 2 * (4 - 2) * c.kv_channels / P * (c.hidden_size + 1));
  }
}

// --attention-output-gate: the QKV weight and bias grow by heads x kv_channels (the gates' rows); the
// wider QKV output and its gradient, and the gated output's scratch, among the activations.
TEST(MemoryEstimate, AttentionOutputGateEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig c = config(3, false, P);
    c.attention_output_gate = true;
    expect_matches(layout(c, P, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
    const int64_t without = estimate_rank_memory(layout(config(3, false, P), P, 1, 1, 4), 0, 0).parameters;
    EXPECT_EQ(with - without, 3 * 4 * c.kv_channels / P * (c.hidden_size + 1));
    const size_t act_with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).activation_bytes;
    const size_t act_without = estimate_rank_memory(layout(config(3, false, P), P, 1, 1, 4), 0, 0).activation_bytes;
    EXPECT_GT(act_with, act_without);
  }
}

// --optimizer muon: Adam's two moments' bytes per parameter but for the matrices Muon updates (their
// momentum alone), plus Muon's scratch (the largest matrix three times, two Gram matrices: with the QKV
// split, of the largest piece; with --muon-tp-mode duplicated the whole matrices' too), at TP 1 and 2.
TEST(MemoryEstimate, MuonScratchEqualsTheOptimizers) {
  for (int P : {1, 2})
    for (int variant : {0, 1, 2}) {  // whole qkv; split; split and duplicated
      const bool split = variant > 0;
      TransformerConfig c = config(3, false, P);
      c.num_query_groups = 2;
      MemoryLayout m = layout(c, P, 1, 1, 4);
      m.optimizer = "muon";
      if (variant == 2) m.muon.tp_mode = "duplicated";
      if (split) m.muon.qkv_split_rows = c.qkv_group_rows();
      expect_matches(m, 0);
      MemoryLayout adam = layout(c, P, 1, 1, 4);
      const RealRank real = build(m, 0);
      const int64_t matrices = muon_matrix_elements(real.model->params().infos());
      ASSERT_GT(matrices, 0);
      EXPECT_EQ(real.optimizer->state_bytes() - real.optimizer->scratch_bytes(),
                estimate_rank_memory(adam, 0, 0).optimizer_bytes - size_t(matrices) * sizeof(float));
    }
}

// --kv-channels wider than hidden / heads: the attention's weights and activations grow.
TEST(MemoryEstimate, WideAttentionEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig c = config(3, false, P);
    c.kv_channels = 3 * c.hidden_size / c.num_attention_heads;
    c.finalize(P);
    expect_matches(layout(c, P, 1, 1, 4), 0);
  }
}

// --qk-layernorm: per layer q_layernorm's and k_layernorm's weight and bias [kv_channels]
// (replicated), weights only with RMSNorm; the norms' kept inputs and scratch among the activations.
TEST(MemoryEstimate, QkLayernormEqualsTheModel) {
  for (int P : {1, 2})
    for (const char* norm : {"LayerNorm", "RMSNorm"}) {
      TransformerConfig base = config(3, false, P);
      base.normalization = norm;
      TransformerConfig c = base;
      c.qk_layernorm = true;
      expect_matches(layout(c, P, 1, 1, 4), 0);
      const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
      const int64_t without = estimate_rank_memory(layout(base, P, 1, 1, 4), 0, 0).parameters;
      EXPECT_EQ(with - without, 3 * 2 * (c.rmsnorm() ? 1 : 2) * c.kv_channels) << norm << ", P " << P;
    }
}

// --multi-latent-attention: per layer the query latent (or linear_q_proj), the key-value latent, their
// norms with --qk-layernorm, the up projections (split by heads) and linear_proj [C, H Dv] in place of
// linear_qkv and a [C, C] projection; the latents' kept buffers among the activations.
TEST(MemoryEstimate, MultiLatentAttentionEqualsTheModel) {
  for (int P : {1, 2})
    for (int64_t q_lora_rank : {0, 24})
      for (const char* norm : {"LayerNorm", "RMSNorm"}) {
        SCOPED_TRACE(std::string(norm) + ", q_lora_rank " + std::to_string(q_lora_rank) + ", P " + std::to_string(P));
        TransformerConfig base = config(3, false, P);
        base.normalization = norm;
        base.position_embedding_type = "rope";
        base.finalize(P);
        TransformerConfig c = base;
        set_mla(c, MlaShapes{q_lora_rank, 16, 12, 8, 16});
        c.finalize(P);
        EXPECT_EQ(c.kv_channels, 20);  // max(Dq 20, Dv 16)
        expect_matches(layout(c, P, 1, 1, 4), 0);
        const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
        const int64_t without = estimate_rank_memory(layout(base, P, 1, 1, 4), 0, 0).parameters;
        const int64_t C = 64, H = 4, Dq = 20, nb = c.rmsnorm() ? 1 : 2;
        const int64_t q = q_lora_rank == 0 ? H * Dq * C / P : 24 * C + nb * 24 + H * Dq * 24 / P;
        const int64_t kv = (16 + 8) * C + nb * 16 + H * (12 + 16) * 16 / P + C * H * 16 / P;
        const int64_t standard = 3 * C * C / P + 3 * C / P + C * C / P;  // linear_qkv with its bias, linear_proj
        EXPECT_EQ(with - without, 3 * (q + kv - standard));
      }
}

// --mtp-num-layers: per depth enorm, hnorm, eh_proj [C, 2C], one transformer layer and final_layernorm
// (eh_proj split over the tensor-parallel ranks); each depth's kept buffers among the activations.
TEST(MemoryEstimate, MultiTokenPredictionEqualsTheModel) {
  for (int P : {1, 2}) {
    TransformerConfig base = config(3, false, P);
    TransformerConfig c = base;
    c.mtp_num_layers = 2;
    expect_matches(layout(c, P, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(c, P, 1, 1, 4), 0, 0).parameters;
    const int64_t without = estimate_rank_memory(layout(base, P, 1, 1, 4), 0, 0).parameters;
    TransformerConfig four = base;  // two more decoder layers: the depths' transformer layers
    four.num_layers = 5;
    four.finalize(P);
    const int64_t layers = estimate_rank_memory(layout(four, P, 1, 1, 4), 0, 0).parameters - without;
    const int64_t C = c.hidden_size;
    EXPECT_EQ(with - without, layers + 2 * (3 * 2 * C + 2 * C * C / P)) << "P " << P;
  }
}

// --num-experts: per layer the router [E, C] and E experts' fc1 and fc2 in place of the MLP's
// (no biases); the MoE layer's kept buffers and scratch among the activations.
TEST(MemoryEstimate, MixtureOfExpertsEqualsTheModel) {
  for (bool swiglu : {false, true}) {
    TransformerConfig base = config(3, false);
    base.add_bias_linear = false;
    base.swiglu = swiglu;
    TransformerConfig c = base;
    c.num_experts = 4;
    c.moe_ffn_hidden_size = 24;
    c.finalize();
    expect_matches(layout(c, 1, 1, 1, 4), 0);
    TransformerConfig c2 = c;  // every expert's fc1 and fc2 split over 2 tensor-parallel ranks
    c2.padded_vocab_size = 0;
    c2.finalize(2);
    expect_matches(layout(c2, 2, 1, 1, 4), 0);
    const int64_t with = estimate_rank_memory(layout(c, 1, 1, 1, 4), 0, 0).parameters;
    base.finalize();
    const int64_t without = estimate_rank_memory(layout(base, 1, 1, 1, 4), 0, 0).parameters;
    const int64_t C = c.hidden_size, mats = swiglu ? 3 : 2;
    EXPECT_EQ(with - without, 3 * (4 * C + 4 * mats * 24 * C - mats * base.ffn_hidden_size * C)) << swiglu;
    TransformerConfig c4 = c;  // sigmoid scores with the expert bias [E] per layer, shared experts
    c4.moe_router_score_function = "sigmoid";
    c4.moe_router_enable_expert_bias = true;
    c4.moe_shared_expert_intermediate_size = 16;
    c4.moe_shared_expert_gate = true;
    c4.finalize();
    expect_matches(layout(c4, 1, 1, 1, 4), 0);
    TransformerConfig c3 = c;  // --moe-layer-freq: the middle layer dense
    c3.moe_layer_pattern = {1, 0, 1};
    c3.finalize();
    expect_matches(layout(c3, 1, 1, 1, 4), 0);
    EXPECT_EQ(with - estimate_rank_memory(layout(c3, 1, 1, 1, 4), 0, 0).parameters,
              4 * C + 4 * mats * 24 * C - mats * base.ffn_hidden_size * C)
        << swiglu;
  }
}

// Expert parallelism: each rank holds E / ep experts of every MoE layer, sharded with the
// distributed optimizer over the expert data-parallel group (DP 4 = EP 2 x 2 here); every element
// of the model is owned by one rank.
TEST(MemoryEstimate, ExpertParallelRanksEqualTheirModels) {
  TransformerConfig c = config(3, false);
  c.add_bias_linear = false;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 24;
  c.finalize();
  for (int64_t bucket : {int64_t(0), int64_t(3000)}) {
    MemoryLayout m = layout(c, 1, 1, 4, 1);
    m.ep = 2;
    m.distributed_optimizer = true;
    m.ddp_bucket_size = bucket;
    int64_t owned = 0;
    for (int w = 0; w < 4; ++w) {
      expect_matches(m, w);
      owned += estimate_rank_memory(m, w, 0).owned_parameters;
    }
    MemoryLayout whole = layout(c, 1, 1, 1, 1);
    const int64_t all = estimate_rank_memory(whole, 0, 0).parameters;
    const int64_t expert = 2 * 24 * c.hidden_size;  // one expert's fc1 and fc2
    EXPECT_EQ(estimate_rank_memory(m, 0, 0).parameters, all - 3 * 2 * expert);  // 2 of 4 experts per layer
    EXPECT_EQ(owned, all);  // every element of the model owned by one rank
    // The MoE layers' routed rows keep their fc1 outputs and activations with the expert-parallel
    // dispatch, outside the arena: N k (F1 + F) floats less per layer and micro-batch, and as much
    // scratch.
    MemoryLayout no_ep = m;
    no_ep.ep = 1;
    const int64_t N = m.micro_batch_size * m.seq_length, k = c.moe_router_topk;
    EXPECT_EQ(estimate_rank_memory(no_ep, 0, 0).activation_bytes - estimate_rank_memory(m, 0, 0).activation_bytes,
              size_t(3 + 1) * size_t(N * k * 2 * 24) * sizeof(float));
  }
}

// Whole experts (--expert-tensor-parallel-size 1) at TP 2 x DP 2: EP 2 over each tensor-parallel pair
// and EP 4 over all four ranks, each expert unsplit, the MoE layers' buffers for the rank's
// sequence-parallel rows (the shared experts' for every row); with biases (fc1's whole with its weight)
// and the distributed optimizer.
TEST(MemoryEstimate, WholeExpertRanksEqualTheirModels) {
  TransformerConfig c = config(3, false, 2);
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 24;
  c.expert_tensor_parallel_size = 1;
  c.finalize(2);
  TransformerConfig shared = c;  // gated shared experts (split over the ranks, on every token's row)
  shared.moe_shared_expert_intermediate_size = 32;
  shared.moe_shared_expert_gate = true;
  for (int ep : {2, 4})
    for (bool distributed : {false, true}) {
      MemoryLayout m = layout(distributed ? shared : c, 2, 1, 2, 1);
      m.ep = ep;
      m.sequence_parallel = true;
      m.distributed_optimizer = distributed;
      for (int w = 0; w < 4; ++w) expect_matches(m, w);
    }
  // TP 2 x CP 2 x DP 2, EP 4: the expert-parallel groups over tensor- and context-parallel pairs.
  MemoryLayout cp = layout(shared, 2, 1, 2, 1);
  cp.cp = 2;
  cp.ep = 4;
  cp.sequence_parallel = true;
  cp.distributed_optimizer = true;
  for (int w = 0; w < 8; ++w) expect_matches(cp, w);
  // Two distributed-optimizer instances at TP 2 x DP 2 x EP 2: the experts sharded over one copy.
  MemoryLayout two = layout(shared, 2, 1, 2, 1);
  two.ep = 2;
  two.sequence_parallel = true;
  two.distributed_optimizer = true;
  two.dist_opt_instances = 2;
  for (int w = 0; w < 4; ++w) expect_matches(two, w);
  TransformerConfig split = c;
  split.expert_tensor_parallel_size = 0;
  MemoryLayout a = layout(c, 2, 1, 2, 1), b = layout(split, 2, 1, 2, 1);
  a.ep = b.ep = 2;
  a.sequence_parallel = b.sequence_parallel = true;
  // Rank 0: experts 0 and 1 whole against experts 0 and 1 (EP over dp) halved: one expert's worth more
  // per layer (fc1 with its bias, fc2; fc2's bias is whole either way).
  const int64_t expert = 2 * 24 * c.hidden_size + 24;
  EXPECT_EQ(estimate_rank_memory(a, 0, 0).parameters - estimate_rank_memory(b, 0, 0).parameters, 3 * expert);
}

// GPT-OSS's MLP (experts and router with biases, quick GEGLU) under TP 2 x EP 2: the router's bias
// [E] replicated, each local expert's fc1 bias split with its rows and fc2's whole.
TEST(MemoryEstimate, ExpertBiasesEqualTheModel) {
  TransformerConfig c = config(3, false, 2);
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 24;
  c.quick_geglu = true;
  c.finalize(2);
  MemoryLayout m = layout(c, 2, 1, 2, 1);
  m.ep = 2;
  for (int w = 0; w < 4; ++w) expect_matches(m, w);
  TransformerConfig nobias = c;
  nobias.add_bias_linear = false;
  MemoryLayout mn = layout(nobias, 2, 1, 2, 1);
  mn.ep = 2;
  const int64_t C = c.hidden_size;
  // Per layer: the attention's biases (QKV's split, the projection's whole), the router's, and 2
  // local experts' fc1 (2 x 24 / 2 rows) and fc2 (C) biases.
  EXPECT_EQ(estimate_rank_memory(m, 0, 0).parameters - estimate_rank_memory(mn, 0, 0).parameters,
            3 * (3 * C / 2 + C + 4 + 2 * (24 + C)));
}

// Context parallelism: every rank of a context-parallel group holds the whole model and a 1/cp share
// of each sequence's activations, plus the gathered keys and values; with the distributed optimizer
// the state is sharded over dp x cp.
TEST(MemoryEstimate, ContextParallelRanksEqualTheirModels) {
  TransformerConfig c = config(3, false);
  c.num_query_groups = 2;
  c.finalize();
  MemoryLayout m = layout(c, 1, 1, 2, 1);
  m.cp = 2;
  m.distributed_optimizer = true;
  int64_t owned = 0;
  for (int w = 0; w < 4; ++w) {
    expect_matches(m, w);
    owned += estimate_rank_memory(m, w, 0).owned_parameters;
  }
  const RankMemory whole = estimate_rank_memory(layout(c, 1, 1, 1, 1), 0, 0);
  EXPECT_EQ(owned, whole.parameters);  // each element owned by one of the 4 ranks
  const RankMemory r3 = estimate_rank_memory(m, 3, 0);
  EXPECT_EQ(r3.cp_rank, 1);
  EXPECT_EQ(r3.dp_rank, 1);
  MemoryLayout half = layout(c, 1, 1, 1, 1);  // one process with half the sequence
  half.seq_length = m.seq_length / 2;
  const int64_t kv = m.micro_batch_size * m.seq_length * 2 * c.num_query_groups * c.kv_channels;
  EXPECT_EQ(r3.activation_bytes, estimate_rank_memory(half, 0, 0).activation_bytes + size_t(2 * kv + kv / 2) * 4);
}

// Experts under context parallelism: their gradients summed and sharded over dp x cp like the
// others'; every element owned by one of the 4 ranks.
TEST(MemoryEstimate, ContextParallelExpertsEqualTheirModels) {
  TransformerConfig c = config(3, false);
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 24;
  c.finalize();
  MemoryLayout m = layout(c, 1, 1, 2, 1);
  m.cp = 2;
  m.distributed_optimizer = true;
  int64_t owned = 0;
  for (int w = 0; w < 4; ++w) {
    expect_matches(m, w);
    owned += estimate_rank_memory(m, w, 0).owned_parameters;
  }
  EXPECT_EQ(owned, estimate_rank_memory(layout(c, 1, 1, 1, 1), 0, 0).parameters);
}

// The rotary embedding has no position table: the estimate registers none either.
TEST(MemoryEstimate, RotaryEmbeddingEqualsTheModel) {
  TransformerConfig c = config(3, false);
  c.position_embedding_type = "rope";
  c.finalize();
  const MemoryLayout m = layout(c, 1, 1, 1, 4);
  expect_matches(m, 0);
  const RankMemory learned = estimate_rank_memory(layout(config(3, false), 1, 1, 1, 4), 0, 0);
  EXPECT_EQ(estimate_rank_memory(m, 0, 0).parameters, learned.parameters - c.max_position_embeddings * c.hidden_size);
}

TEST(MemoryEstimate, PipelineStagesEqualTheirModels) {
  for (bool untied : {false, true}) {
    const MemoryLayout m = layout(config(8, untied), 1, 4, 1, 8);
    int64_t total = 0;
    for (int w = 0; w < 4; ++w) {
      expect_matches(m, w);
      total += estimate_rank_memory(m, w, 0).parameters;
    }
    // Stage r keeps P - r micro-batches in flight under 1F1B.
    for (int w = 0; w < 4; ++w) EXPECT_EQ(estimate_rank_memory(m, w, 0).activation_slots, 4 - w);
    // The stages hold the whole model, plus the last stage's copy of a tied embedding.
    const RankMemory whole = estimate_rank_memory(layout(config(8, untied), 1, 1, 1, 8), 0, 0);
    const TransformerConfig& c = m.config;
    EXPECT_EQ(total, whole.parameters + (untied ? 0 : c.padded_vocab_size * c.hidden_size));
  }
  // Interleaved (2 chunks per stage) and uneven stages.
  MemoryLayout inter = layout(config(8, false), 1, 2, 1, 4);
  inter.pipeline = make_pipeline_layout(8, 2, 2, 0, 0);
  MemoryLayout uneven = layout(config(7, true), 1, 1, 1, 6);
  uneven.pp = 3;
  uneven.pipeline = make_pipeline_layout(7, 3, 0, 1, 0);
  for (int w = 0; w < 2; ++w) expect_matches(inter, w);
  for (int w = 0; w < 3; ++w) expect_matches(uneven, w);
  // --mtp-num-layers: the depths on the last stage, with its copy of the word embedding (an untied
  // model's own; a tied model's output layer's) for their lookup.
  for (bool untied : {false, true}) {
    TransformerConfig c = config(8, untied);
    c.position_embedding_type = "rope";
    c.mtp_num_layers = 2;
    c.finalize();
    const MemoryLayout mtp = layout(c, 1, 4, 1, 8);
    int64_t total = 0;
    for (int w = 0; w < 4; ++w) {
      expect_matches(mtp, w);
      total += estimate_rank_memory(mtp, w, 0).parameters;
    }
    const RankMemory whole = estimate_rank_memory(layout(c, 1, 1, 1, 8), 0, 0);
    EXPECT_EQ(total, whole.parameters + c.padded_vocab_size * c.hidden_size) << (untied ? "untied" : "tied");
  }
}

TEST(MemoryEstimate, TensorParallelRanksEqualTheirModels) {
  for (int tp : {2, 4})
    for (bool sp : {false, true}) {
      MemoryLayout m = layout(config(2, false, tp), tp, 1, 1, 2);
      m.sequence_parallel = sp;
      for (int w = 0; w < tp; ++w) expect_matches(m, w);
    }
  MemoryLayout three_d = layout(config(4, true, 2), 2, 2, 2, 4);  // TP 2 x PP 2 x DP 2
  three_d.sequence_parallel = true;
  three_d.distributed_optimizer = true;
  for (int w = 0; w < 8; ++w) expect_matches(three_d, w);
}

TEST(MemoryEstimate, TensorParallelParametersFollowTheFormula) {
  // Per rank: L ((12h^2 + 7h)/T + 6h) with F = 4h, plus Vp h / T word embeddings and the
  // replicated position embeddings and final LayerNorm.
  for (int64_t T : {1, 2, 4}) {
    const TransformerConfig c = config(3, false, T);
    const int64_t h = c.hidden_size, L = c.num_layers;
    const int64_t want = L * ((12 * h * h + 7 * h) / T + 6 * h) + c.padded_vocab_size * h / T +
                         c.max_position_embeddings * h + 2 * h;
    for (int r = 0; r < T; ++r)
      EXPECT_EQ(estimate_rank_memory(layout(c, int(T), 1, 1, 1), r, 0).parameters, want) << "T " << T;
  }
}

TEST(MemoryEstimate, DistributedOptimizerOwnsOneShardOfEveryBucket) {
  for (int dp : {2, 3})
    for (int64_t bucket : {int64_t(0), int64_t(5000)}) {  // one bucket, and several
      MemoryLayout m = layout(config(3, false), 1, 1, dp, 1);
      m.distributed_optimizer = true;
      m.ddp_bucket_size = bucket;
      int64_t owned = 0;
      size_t staging = 0;
      for (int w = 0; w < dp; ++w) {
        expect_matches(m, w);
        const RankMemory e = estimate_rank_memory(m, w, 0);
        owned += e.owned_parameters;
        staging += e.grad_staging_bytes;
        // Adam: 8 bytes per owned parameter, about 8/d per parameter of the rank.
        EXPECT_NEAR(double(e.optimizer_bytes) / double(e.parameters), 8.0 / dp, 0.05);
      }
      const RankMemory whole = estimate_rank_memory(m, 0, 0);
      EXPECT_EQ(owned, whole.parameters);  // every parameter owned exactly once
      EXPECT_EQ(staging, size_t(whole.buffer_elements) * sizeof(float));  // the buffer, split d ways
    }
}

TEST(MemoryEstimate, MpiReductionCopiesFollowTheBinomialTree) {
  // Reduce-scatter (distributed optimizer): min(children, 2) copies of the gradient
  // buffer; in-place all-reduce: one copy on receivers, on every rank when ceil(log2 DP) is odd.
  auto copies = [](int dp, bool dist_opt, int w) {
    MemoryLayout m = layout(config(2, false), 1, 1, dp, 1);
    m.distributed_optimizer = dist_opt;
    const RankMemory e = estimate_rank_memory(m, w, 0);
    EXPECT_EQ(e.comm_staging_bytes % (size_t(e.buffer_elements) * 4), 0u);
    return int(e.comm_staging_bytes / (size_t(e.buffer_elements) * 4));
  };
  EXPECT_EQ(copies(1, true, 0), 0);
  EXPECT_EQ(copies(1, false, 0), 0);
  const std::vector<int> rs4{2, 0, 1, 0}, ar4{1, 0, 1, 0}, rs2{1, 0}, ar2{1, 1};
  for (int w = 0; w < 4; ++w) EXPECT_EQ(copies(4, true, w), rs4[size_t(w)]) << w;
  for (int w = 0; w < 4; ++w) EXPECT_EQ(copies(4, false, w), ar4[size_t(w)]) << w;
  for (int w = 0; w < 2; ++w) EXPECT_EQ(copies(2, true, w), rs2[size_t(w)]) << w;
  for (int w = 0; w < 2; ++w) EXPECT_EQ(copies(2, false, w), ar2[size_t(w)]) << w;
}

TEST(MemoryEstimate, PrecisionBytesScaleTheModelState) {
  MemoryLayout m = layout(config(2, false), 1, 1, 1, 1);
  const RankMemory fp32 = estimate_rank_memory(m, 0, 0);
  m.precision.weight_copy = 2;  // bf16 weights beside fp32 main parameters and gradients
  const RankMemory bf16 = estimate_rank_memory(m, 0, 0);
  EXPECT_EQ(bf16.weight_copy_bytes, size_t(fp32.buffer_elements) * 2);
  EXPECT_EQ(bf16.model_state_bytes(), fp32.model_state_bytes() + bf16.weight_copy_bytes);
  // Megatron's fp32 count: 16 bytes per parameter (4 + 4 + 8), up to alignment padding.
  EXPECT_NEAR(double(fp32.model_state_bytes()) / double(fp32.parameters), 16.0, 0.05);
}

TEST(MemoryEstimate, ActivationsAreSlotsTimesOneMicroBatchPlusScratch) {
  const MemoryLayout m = layout(config(8, false), 1, 4, 1, 8);
  const RankMemory first = estimate_rank_memory(m, 0, 0), second = estimate_rank_memory(m, 1, 0);
  EXPECT_GT(first.activation_bytes_per_micro_batch, 0u);
  EXPECT_EQ(first.activation_bytes_per_micro_batch, second.activation_bytes_per_micro_batch);  // same layers, no loss
  EXPECT_GT(first.activation_bytes, size_t(first.activation_slots) * first.activation_bytes_per_micro_batch);
  EXPECT_EQ(first.activation_bytes - second.activation_bytes, first.activation_bytes_per_micro_batch);
}

TEST(MemoryEstimate, WorldRanksFollowMegatronsOrder) {
  const MemoryLayout m = layout(config(4, false, 2), 2, 2, 2, 2);
  const std::vector<RankMemory> all = estimate_all_ranks(m, 0);
  ASSERT_EQ(all.size(), 8u);
  for (int w = 0; w < 8; ++w) {
    const RankMemory& r = all[size_t(w)];
    EXPECT_EQ(r.world_rank, w);
    EXPECT_EQ(w, r.tp_rank + 2 * (r.dp_rank + 2 * r.pp_rank));
  }
  const std::string table = format_memory_estimate(m, all, "a note");
  EXPECT_NE(table.find("rank 5 (tp 1, pp 1, dp 0)"), std::string::npos) << table;
  EXPECT_NE(table.find("4 main parameters + 4 gradients + 8 Adam = 16 bytes per parameter"), std::string::npos);
  std::vector<double> peaks(8, double(all[0].peak_bytes()) * 1.05);
  const std::string measured = format_memory_measured(all, peaks, 3);
  EXPECT_NE(measured.find("rank 7: peak resident"), std::string::npos) << measured;
  EXPECT_NE(measured.find("(+5.0%)"), std::string::npos) << measured;
}

TEST(MemoryEstimate, ProcessMemoryIsReadFromProc) {
  const size_t rss = resident_bytes(), peak = peak_resident_bytes();
  EXPECT_GT(rss, 0u);
  EXPECT_GE(peak, rss);
}

}  // namespace
}  // namespace lattice
