// Megatron's FLOPs formula against reference/megatron.md's test vector.
#include <gtest/gtest.h>

#include "train/flops.h"

#include "../gdn_test_config.h"
#include "../mamba_test_config.h"

namespace lattice {
namespace {

// h=256, 8 heads, ffn 1024, V 50257 (padded 50304), max positions 1024; not finalized.
TransformerConfig base_config(int64_t layers) {
  TransformerConfig c;
  c.num_layers = layers;
  c.hidden_size = 256;
  c.num_attention_heads = 8;
  c.ffn_hidden_size = 1024;
  c.vocab_size = 50257;
  c.max_position_embeddings = 1024;
  return c;
}

TEST(TrainFlops, MegatronTestVector) {
  // GBS=8, s=1024, L=2, h=256, 8 heads, kv_channels 32, ffn 1024, V_padded 50304
  TransformerConfig c = base_config(2);
  c.kv_channels = 32;
  c.finalize();
  ASSERT_EQ(c.padded_vocab_size, 50304);
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 736050020352.0);
  // SwiGLU: ffn_mult 3 (three ffn x h matrices per layer) instead of 2.
  c.swiglu = true;
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 761819824128.0);
  // Grouped-query attention: k and v kv_channels x groups wide.
  c.swiglu = false;
  c.num_query_groups = 2;
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 726386343936.0);
  // --attention-output-gate: the QKV layer's gates, one more h x q matrix per layer (Megatron's
  // gate_projection_size): 6 x 2 layers x 256 x 256 per token, 8 x 1024 tokens more.
  c.num_query_groups = 0;
  c.attention_output_gate = true;
  c.finalize();
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), 736050020352.0 + 6.0 * 2 * 256 * 256 * 8 * 1024);
}

// --experimental-attention-variant gated_delta_net: a GDN layer counts in_proj, out_proj, the convolution
// and the delta rule's three Dk x Dv products per value head instead of the attention's terms.
TEST(TrainFlops, GatedDeltaNetLayersCountTheirOwnTerms) {
  TransformerConfig c = base_config(2);
  c.kv_channels = 32;
  c.swiglu = true;
  c.finalize();
  const double attention_layer = 6.0 * (256.0 * 3 * 256 + 256.0 * 256) + 1024.0 * 6 * 256;  // per token
  const double dense = megatron_flops_per_iteration(c, 8, 1024);
  set_gdn(c, {1, 0}, GdnShapes{2, 4, 32, 16, 4});
  c.finalize();
  // in_proj [2 x 64 + 2 x 64 + 8, 256], out_proj [256, 64], conv [192, 4], delta rule 3 x 4 x 32 x 16.
  const double gdn_layer = 6.0 * (256.0 * 264 + 64.0 * 256 + 192.0 * 4 + 3.0 * 4 * 32 * 16);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024), dense + 8.0 * 1024 * (gdn_layer - attention_layer));
}

// --hybrid-override-pattern: each layer's own terms (Megatron's hybrid count): M*-E, a Mamba layer of 8 heads of
// 32 in 2 groups of state 16, an attention-only layer, an MLP-only layer and an MoE-only layer, and the logits.
TEST(TrainFlops, HybridLayersCountTheirOwnTerms) {
  TransformerConfig c = base_config(4);
  c.kv_channels = 32;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 128;
  c.moe_shared_expert_intermediate_size = 64;
  c.add_bias_linear = false;
  set_hybrid(c, "M*-E", MambaShapes{8, 32, 2, 16});
  c.finalize();
  const double h = 256, s = 1024;
  const double mamba = 6 * h * (2 * 256 + 2 * 2 * 16 + 8) + 7.0 * 256 * 16 + 6.0 * 256 * h;  // in_proj, scan, out_proj
  const double attention = 6 * (h * 3 * 256 + 256 * h) + s * 6 * 256;
  const double mlp = 6 * h * 1024 * 2, moe = 6 * h * (128 * 2 + 64) * 2, logits = 6 * h * 50304;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024), 8.0 * 1024 * (mamba + attention + mlp + moe + logits));
}

// --mtp-num-layers: each depth's transformer layer as one more layer, plus its logits and its norms
// and eh_proj (Megatron's "MTP norms and proj": 6 (3h + 2h^2) per token and depth).
TEST(TrainFlops, MultiTokenPredictionAddsLayersLogitsAndProjections) {
  TransformerConfig c = base_config(3);
  c.finalize();
  const double three_layers = megatron_flops_per_iteration(c, 8, 1024);
  c.num_layers = 2;
  c.mtp_num_layers = 1;
  c.finalize();
  const double tokens = 8.0 * 1024, h = 256;
  EXPECT_EQ(megatron_flops_per_iteration(c, 8, 1024), three_layers + tokens * (6 * h * 50304 + 6 * (3 * h + 2 * h * h)));
}

// Mixture of experts: each layer's own MLP width, k experts' plus the shared experts' in an MoE
// layer (Megatron's num_moe_layers / num_dense_layers terms); the router and gate not counted.
TEST(TrainFlops, MixtureOfExpertsCountsEachLayersMlp) {
  TransformerConfig c = base_config(2);
  c.add_bias_linear = false;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 512;
  c.moe_shared_expert_intermediate_size = 256;
  c.moe_layer_pattern = {0, 1};
  c.finalize();
  const double h = 256, q = 256, gbs = 8, s = 1024, V = 50304;
  const double attention = 6 * (h * 3 * q + q * h);
  const double dense = 6 * h * 1024 * 2 + attention, moe = 6 * h * (512 * 2 + 256) * 2 + attention;
  const double want = gbs * s * (dense + moe + 6 * h * V) + gbs * s * s * 6 * q * 2;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024), want);
  // --moe-latent-size 64: the routed experts' matrices 64 wide instead of h (Megatron's routed_expert_hidden_size),
  // and the two latent projections (2 h L); the shared experts' unchanged. The same in a hybrid's E layer.
  c.moe_latent_size = 64;
  c.finalize();
  const double latent = 6 * (64 * 512 * 2 + h * 256) * 2 + 6 * 2 * h * 64 + attention;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024), gbs * s * (dense + latent + 6 * h * V) + gbs * s * s * 6 * q * 2);
  TransformerConfig hy = base_config(2);
  hy.add_bias_linear = false;
  hy.num_experts = 4;
  hy.moe_router_topk = 2;
  hy.moe_ffn_hidden_size = 512;
  hy.moe_shared_expert_intermediate_size = 256;
  hy.moe_latent_size = 64;
  set_hybrid(hy, "E-");
  hy.finalize();
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(hy, 8, 1024),
                   gbs * s * (6 * (64 * 512 * 2 + h * 256) * 2 + 6 * 2 * h * 64 + 6 * h * 1024 * 2 + 6 * h * V));
}

// --multi-latent-attention: Megatron's MLA terms per layer and token in place of the QKV layer's and the core
// attention's: the query latent (or linear_q_proj), the key-value latent and its up projection, the
// rotary key, the projection, and the causal core attention over Dq-wide scores and Dv-wide values.
TEST(TrainFlops, MultiLatentAttentionCountsTheLatents) {
  TransformerConfig c = base_config(2);
  c.position_embedding_type = "rope";
  c.multi_latent_attention = true;
  c.q_lora_rank = 96;
  c.kv_lora_rank = 64;
  c.qk_head_dim = 32;
  c.qk_pos_emb_head_dim = 16;
  c.v_head_dim = 24;
  c.finalize();
  const double h = 256, H = 8, gbs = 8, s = 1024, V = 50304, Dq = 48;
  const double mlp = 6 * h * 1024 * 2;
  const double q_latent = 96 * (h + H * Dq + 1);
  const double rest = 64 * (h + H * (32 + 24) + 1) + h * 16 + H * 24 * h + s * H * Dq / 2 + s * H * 24 / 2;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024), gbs * s * (2 * (mlp + 6 * (q_latent + rest)) + 6 * h * V));
  c.q_lora_rank = 0;  // linear_q_proj [H Dq, h]
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(c, 8, 1024),
                   gbs * s * (2 * (mlp + 6 * (h * H * Dq + rest)) + 6 * h * V));
}

}  // namespace
}  // namespace lattice
