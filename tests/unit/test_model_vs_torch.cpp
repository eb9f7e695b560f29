// The whole model against an independent PyTorch implementation
// (tests/fixtures/make_gpt_fixture.py): logits, loss, every gradient, and the losses
// and final parameters of 10 AdamW steps with gradient accumulation and clipping; with
// learned positions (tied and untied, both GELUs), with the rotary embedding, and with an
// attention wider than the hidden size (--kv-channels 24 x 4 heads, hidden 64), without the
// linear layers' biases (--disable-bias-linear), with RMSNorm (--normalization RMSNorm), with
// SwiGLU (--swiglu), and with grouped-query attention (--num-query-groups 2 of 4 heads); GPT-OSS's
// MLP (quick GEGLU with an offset and clamps) dense and in experts with biases; multi-token prediction
// (--mtp-num-layers 2 tied with learned positions, 1 untied with the rotary embedding and RMSNorm, 1 MoE
// depth after MoE layers: its load-balancing loss in the objective); multi-latent attention (query latent with
// RMSNorm latent norms; linear_q_proj with YaRN, values wider than the queries and keys); the attention
// output gate (--attention-output-gate, alone and with the rotary embedding, grouping and --qk-layernorm); a
// NoPE layer after a rotary one (--no-rope-freq 2); Gated DeltaNet layers (--experimental-attention-variant
// gated_delta_net); and Megatron-Core's hybrid MambaModel (--hybrid-override-pattern, Nemotron-H's): Mamba-2
// layers (M: norm and MambaMixer), attention-only (*), MLP-only (-) and MoE-only (E) layers, with RMSNorm, no
// linear biases, no position embedding and squared ReLU ("M-M*-"), with LayerNorm, biases, learned positions and
// untied embeddings, an attention layer first and an explicit --mamba-num-heads ("*M-M"), and with MoE layers
// ("ME*E"). Every parameter of a fixture must be one of the model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "checkpoint/model_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/train_step.h"

namespace lattice {
namespace {

constexpr double kRelTol = 1e-5;

int64_t meta_int(const SafetensorsFile& f, const char* key) {
  return std::stoll(f.metadata().at(key));
}
double meta_double(const SafetensorsFile& f, const char* key) {
  return std::stod(f.metadata().at(key));
}

TransformerConfig fixture_config(const SafetensorsFile& f) {
  TransformerConfig c;
  c.num_layers = meta_int(f, "num_layers");
  c.hidden_size = meta_int(f, "hidden_size");
  c.num_attention_heads = meta_int(f, "num_attention_heads");
  c.ffn_hidden_size = meta_int(f, "ffn_hidden_size");
  c.vocab_size = meta_int(f, "vocab_size");
  c.padded_vocab_size = meta_int(f, "padded_vocab_size");
  c.max_position_embeddings = meta_int(f, "max_position_embeddings");
  c.layernorm_epsilon = float(meta_double(f, "norm_epsilon"));
  c.hidden_dropout = c.attention_dropout = 0.0f;
  c.untie_embeddings_and_output_weights = f.metadata().count("untie_embeddings_and_output_weights") &&
                                          f.metadata().at("untie_embeddings_and_output_weights") == "1";
  c.gelu = f.metadata().count("openai_gelu") && f.metadata().at("openai_gelu") == "1" ? GeluKind::tanh
                                                                                      : GeluKind::erf;
  if (f.metadata().count("kv_channels")) c.kv_channels = meta_int(f, "kv_channels");
  if (f.metadata().count("add_bias_linear")) c.add_bias_linear = meta_int(f, "add_bias_linear") != 0;
  if (f.metadata().count("normalization")) c.normalization = f.metadata().at("normalization");
  c.swiglu = f.metadata().count("swiglu") && f.metadata().at("swiglu") == "1";
  c.quick_geglu = f.metadata().count("quick_geglu") && f.metadata().at("quick_geglu") == "1";
  if (f.metadata().count("glu_linear_offset")) c.glu_linear_offset = float(meta_double(f, "glu_linear_offset"));
  if (f.metadata().count("activation_func_clamp_value"))
    c.activation_func_clamp_value = float(meta_double(f, "activation_func_clamp_value"));
  if (f.metadata().count("squared_relu") && f.metadata().at("squared_relu") == "1") c.gelu = GeluKind::squared_relu;
  c.apply_layernorm_1p = f.metadata().count("apply_layernorm_1p") && f.metadata().at("apply_layernorm_1p") == "1";
  if (f.metadata().count("num_query_groups")) c.num_query_groups = meta_int(f, "num_query_groups");
  c.qk_layernorm = f.metadata().count("qk_layernorm") && f.metadata().at("qk_layernorm") == "1";
  c.qk_l2_norm = f.metadata().count("qk_l2_norm") && f.metadata().at("qk_l2_norm") == "1";
  c.attention_output_gate =
      f.metadata().count("attention_output_gate") && f.metadata().at("attention_output_gate") == "1";
  if (f.metadata().count("window_size")) c.window_size = meta_int(f, "window_size");
  if (f.metadata().count("softmax_type")) c.softmax_type = f.metadata().at("softmax_type");
  if (f.metadata().count("window_attn_skip_freq"))
    c.window_attn_pattern =
        TransformerConfig::parse_window_attn_skip_freq(f.metadata().at("window_attn_skip_freq"), c.num_layers);
  if (f.metadata().count("no_rope_freq"))
    c.no_rope_pattern = TransformerConfig::parse_no_rope_freq(f.metadata().at("no_rope_freq"), c.num_layers);
  if (f.metadata().count("num_experts")) {
    c.num_experts = meta_int(f, "num_experts");
    c.moe_router_topk = meta_int(f, "moe_router_topk");
    c.moe_ffn_hidden_size = meta_int(f, "moe_ffn_hidden_size");
    c.moe_aux_loss_coeff = float(meta_double(f, "moe_aux_loss_coeff"));
    if (f.metadata().count("moe_layer_freq"))
      c.moe_layer_pattern = TransformerConfig::parse_moe_layer_freq(f.metadata().at("moe_layer_freq"), c.num_layers);
    c.moe_router_pre_softmax = f.metadata().count("moe_router_pre_softmax") != 0;
    c.moe_apply_probs_on_input = f.metadata().count("moe_apply_probs_on_input") != 0;
    if (f.metadata().count("moe_shared_expert_intermediate_size"))
      c.moe_shared_expert_intermediate_size = meta_int(f, "moe_shared_expert_intermediate_size");
    c.moe_shared_expert_gate = f.metadata().count("moe_shared_expert_gate") != 0;
    if (f.metadata().count("moe_router_score_function"))
      c.moe_router_score_function = f.metadata().at("moe_router_score_function");
    c.moe_router_enable_expert_bias = f.metadata().count("moe_router_enable_expert_bias") != 0;
    if (c.moe_router_enable_expert_bias)
      c.moe_router_bias_update_rate = float(meta_double(f, "moe_router_bias_update_rate"));
    if (f.metadata().count("moe_router_num_groups")) {
      c.moe_router_num_groups = meta_int(f, "moe_router_num_groups");
      c.moe_router_group_topk = meta_int(f, "moe_router_group_topk");
    }
    if (f.metadata().count("moe_expert_capacity_factor"))
      c.moe_expert_capacity_factor = meta_double(f, "moe_expert_capacity_factor");
    c.moe_sinkhorn = f.metadata().count("moe_router_load_balancing_type") &&
                     f.metadata().at("moe_router_load_balancing_type") == "sinkhorn";
  }
  if (f.metadata().count("position_embedding_type") && f.metadata().at("position_embedding_type") == "none") {
    c.position_embedding_type = "none";
  } else if (f.metadata().count("position_embedding_type")) {
    c.position_embedding_type = f.metadata().at("position_embedding_type");
    c.rotary_percent = meta_double(f, "rotary_percent");
    c.rotary_base = float(meta_double(f, "rotary_base"));
    if (c.yarn()) {
      c.yarn_rotary_scaling_factor = float(meta_double(f, "yarn_rotary_scaling_factor"));
      c.yarn_original_max_position_embeddings = meta_int(f, "yarn_original_max_position_embeddings");
      c.yarn_correction_range_round_to_int = meta_int(f, "yarn_correction_range_round_to_int") != 0;
    }
  }
  if (f.metadata().count("multi_latent_attention")) {
    c.multi_latent_attention = true;
    c.q_lora_rank = meta_int(f, "q_lora_rank");
    c.kv_lora_rank = meta_int(f, "kv_lora_rank");
    c.qk_head_dim = meta_int(f, "qk_head_dim");
    c.qk_pos_emb_head_dim = meta_int(f, "qk_pos_emb_head_dim");
    c.v_head_dim = meta_int(f, "v_head_dim");
  }
  if (f.metadata().count("experimental_attention_variant")) {
    c.experimental_attention_variant = f.metadata().at("experimental_attention_variant");
    c.linear_attention_pattern =
        TransformerConfig::parse_linear_attention_freq(f.metadata().at("linear_attention_freq"), c.num_layers);
    c.linear_num_key_heads = meta_int(f, "linear_num_key_heads");
    c.linear_num_value_heads = meta_int(f, "linear_num_value_heads");
    c.linear_key_head_dim = meta_int(f, "linear_key_head_dim");
    c.linear_value_head_dim = meta_int(f, "linear_value_head_dim");
    c.linear_conv_kernel_dim = meta_int(f, "linear_conv_kernel_dim");
  }
  if (f.metadata().count("mtp_num_layers")) {
    c.mtp_num_layers = meta_int(f, "mtp_num_layers");
    c.mtp_loss_scaling_factor = float(meta_double(f, "mtp_loss_scaling_factor"));
  }
  if (f.metadata().count("hybrid_override_pattern")) {  // MambaModel: num_layers is the pattern's length
    c.hybrid_layer_pattern = f.metadata().at("hybrid_override_pattern");
    c.mamba_state_dim = meta_int(f, "mamba_state_dim");
    c.mamba_head_dim = meta_int(f, "mamba_head_dim");
    c.mamba_num_groups = meta_int(f, "mamba_num_groups");
    c.mamba_num_heads = meta_int(f, "mamba_num_heads");  // resolved (never 0 in a fixture)
  }
  c.finalize();
  return c;
}

// Max |a - b| over the tensor must be <= kRelTol * max |b| (relative to the tensor's scale).
void expect_close(const float* got, const std::vector<float>& want, const std::string& what) {
  double max_ref = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
    double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > max_err) max_err = e, worst = i;
  }
  ASSERT_GT(max_ref, 0.0) << what << " is all zeros in the fixture";
  EXPECT_LE(max_err, kRelTol * max_ref) << what << ": max error " << max_err << " at " << worst
                                        << " (got " << got[worst] << ", want " << want[worst]
                                        << "), scale " << max_ref;
}

// Samples taken from the fixture's tokens [steps, micro_batches, B, T+1], in order.
class FixtureSamples : public SampleSource {
 public:
  FixtureSamples(std::vector<int32_t> tokens, int64_t T) : tokens_(std::move(tokens)), T_(T) {}
  void sample(int64_t index, int32_t* out) const override {
    std::memcpy(out, tokens_.data() + index * (T_ + 1), size_t(T_ + 1) * sizeof(int32_t));
  }
  int64_t seq_length() const override { return T_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t T_;
};

class ModelVsTorch : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelVsTorch, LogitsLossAndGradients) {
  auto f = SafetensorsFile::read(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/" + GetParam());
  TransformerConfig c = fixture_config(f);
  const int64_t B = meta_int(f, "micro_batch_size"), T = meta_int(f, "seq_length");
  GPTModel model(c, B, T);
  load_parameters(model, f);
  std::vector<int32_t> tokens = f.get_i32("tokens");  // first micro-batch: [B, T+1]

  std::vector<int32_t> inputs(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) inputs[b * T + t] = tokens[b * (T + 1) + t];
  std::vector<float> logits(size_t(B * T * c.padded_vocab_size));
  model.forward_logits(inputs.data(), B, T, logits.data());
  expect_close(logits.data(), f.get_f32("logits"), "logits");

  model.params().zero_grad();
  MicroBatchKey key;
  double loss = model.forward_backward(tokens.data(), nullptr, B, T, 1.0f, key);
  const double want_loss = f.get_f32("loss")[0];
  EXPECT_NEAR(loss, want_loss, kRelTol * want_loss);
  if (c.mtp()) {  // --mtp-num-layers: each depth's loss on the shifted targets (the reported loss is the main one)
    const std::vector<float> want = f.get_f32("mtp_losses");
    const std::vector<LossSum> got = model.take_mtp_losses();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].count, 1.0) << "depth " << k;
      EXPECT_NEAR(got[k].sum, want[k], kRelTol * want[k]) << "mtp loss of depth " << k;
    }
  }
  // Evaluation's forward computes the same loss (dropout 0 here), with the tokens an expert capacity
  // drops dropped as in training (Megatron's evaluation drops too); the logits above, generation's,
  // are dropless. (Sinkhorn routing chooses by the gates in evaluation, by the balanced logits in
  // training: another loss.)
  if (!c.moe_sinkhorn)
    EXPECT_NEAR(model.forward_loss(tokens.data(), nullptr, B, T), want_loss, kRelTol * want_loss) << "evaluation loss";
  for (const ParamInfo& p : model.params().infos()) {
    if (p.buffer) {  // the expert bias: no gradient
      const float* g = model.params().grads() + p.offset;
      EXPECT_TRUE(std::all_of(g, g + p.numel, [](float v) { return v == 0.0f; })) << "grad of buffer " << p.name;
      continue;
    }
    expect_close(model.params().grads() + p.offset, f.get_f32("grad." + p.name), "grad of " + p.name);
  }
  // The other way round: every tensor of the reference model (each has its grad.<name>) is one of the model's
  // parameters or buffers, so a parameter the model lacks (a hybrid layer's norm bias, a Mamba mixer's D) fails
  // here instead of going unchecked.
  std::set<std::string> names;
  for (const ParamInfo& p : model.params().infos()) names.insert(p.name);
  for (const std::string& n : f.names()) {
    if (n.rfind("grad.", 0) != 0) continue;
    EXPECT_TRUE(names.count(n.substr(5))) << "the fixture's " << n.substr(5) << " is not a parameter of the model";
  }
}

TEST_P(ModelVsTorch, TenAdamSteps) {
  auto f = SafetensorsFile::read(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/" + GetParam());
  TransformerConfig c = fixture_config(f);
  const int64_t B = meta_int(f, "micro_batch_size"), T = meta_int(f, "seq_length");
  GPTModel model(c, B, T);
  load_parameters(model, f);
  OptimizerConfig oc;
  oc.adam_beta1 = float(meta_double(f, "adam_beta1"));
  oc.adam_beta2 = float(meta_double(f, "adam_beta2"));
  oc.adam_eps = float(meta_double(f, "adam_eps"));
  oc.clip_grad = float(meta_double(f, "clip_grad"));
  Optimizer opt(model.params(), oc);
  FixtureSamples data(f.get_i32("tokens"), T);
  const std::vector<float> want = f.get_f32("adam_losses");
  StepConfig sc{B, 2 * B, T, oc.clip_grad, 1234};
  for (int64_t it = 0; it < int64_t(want.size()); ++it) {
    StepResult r = train_step(model, opt, data, sc, it, meta_double(f, "lr"), meta_double(f, "weight_decay"));
    EXPECT_NEAR(r.lm_loss, want[it], kRelTol * want[it]) << "step " << it;
    if (!c.mtp()) continue;
    const std::vector<float> want_mtp = f.get_f32("adam_mtp_losses");  // [steps, K]
    ASSERT_EQ(r.mtp_losses.size(), size_t(c.mtp_num_layers));
    for (size_t k = 0; k < r.mtp_losses.size(); ++k) {
      const double w = want_mtp[size_t(it) * r.mtp_losses.size() + k];
      EXPECT_NEAR(r.mtp_losses[k], w, kRelTol * w) << "step " << it << " mtp loss of depth " << k;
    }
  }
  // Final parameters. Adam divides by sqrt(v), so where a gradient is pure rounding
  // noise (the key bias, whose gradient is zero by softmax's shift invariance; GELU units
  // that never fire) each step moves a parameter by up to ~lr whatever the implementation.
  // The parameters are therefore compared on the scale of an Adam update: every element
  // must agree to 5% of one step (0.05 * lr = 5e-5). The reference itself moves by up to
  // 2e-5 between its fp32 and fp64 runs; a wrong gradient, moment or bias correction
  // moves parameters by ~lr per step.
  const double lr = meta_double(f, "lr");
  for (const ParamInfo& p : model.params().infos()) {
    std::vector<float> want_p = f.get_f32("final." + p.name);
    const float* got = model.params().params() + p.offset;
    double max_err = 0;
    for (size_t i = 0; i < want_p.size(); ++i) max_err = std::max(max_err, std::fabs(double(got[i]) - want_p[i]));
    EXPECT_LE(max_err, 0.05 * lr) << "final " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelVsTorch,
                         ::testing::Values("gpt_tiny.safetensors", "gpt_tiny_untied_tanh.safetensors",
                                           "gpt_tiny_rope.safetensors", "gpt_tiny_kv24.safetensors",
                                           "gpt_tiny_nobias.safetensors", "gpt_tiny_rmsnorm.safetensors",
                                           "gpt_tiny_swiglu.safetensors", "gpt_tiny_gqa2.safetensors",
                                           "gpt_tiny_nobias_relu2.safetensors",
                                           "gpt_tiny_rope_rmsnorm_ln1p_gqa2_qknorm.safetensors",
                                           "gpt_tiny_rope_gqa2_qknorm.safetensors", "gpt_tiny_rope_gqa2_qkl2.safetensors",
                                           "gpt_tiny_rope_gqa2_swa4.safetensors",
                                           "gpt_tiny_rope_gqa2_swa4_sinks.safetensors", "gpt_tiny_offbyone.safetensors",
                                           "gpt_tiny_nope.safetensors", "gpt_tiny_qgeglu.safetensors",
                                           "gpt_tiny_yarn.safetensors",
                                           "gpt_tiny_rope_rmsnorm_qgeglu_gqa2_swa4_sinks_moe4.safetensors",
                                           "gpt_tiny_nobias_moe4.safetensors",
                                           "gpt_tiny_nobias_swiglu_moe4_shared.safetensors",
                                           "gpt_tiny_nobias_moe4_sigmoid.safetensors",
                                           "gpt_tiny_nobias_moe4_capacity.safetensors",
                                           "gpt_tiny_nobias_moe4_sigmoid_probsin.safetensors",
                                           "gpt_tiny_nobias_moe8_groups.safetensors",
                                           "gpt_tiny_nobias_moe4_sinkhorn2.safetensors",
                                           "gpt_tiny_nobias_moe4_sinkhorn1.safetensors", "gpt_tiny_mtp2.safetensors",
                                           "gpt_tiny_untied_rope_rmsnorm_mtp1.safetensors",
                                           "gpt_tiny_nobias_moe4_mtp1.safetensors",
                                           "gpt_tiny_rope_nobias_rmsnorm_qknorm_mlaq24_kv16.safetensors",
                                           "gpt_tiny_yarn_mlanoq_kv12.safetensors", "gpt_tiny_gate.safetensors",
                                           "gpt_tiny_rope_gqa2_qknorm_gate.safetensors",
                                           "gpt_tiny_rope_rmsnorm_gqa2_qknorm_norope01.safetensors",
                                           "gpt_tiny_nobias_rmsnorm_swiglu_gdn10.safetensors",
                                           "gpt_tiny_swiglu_gdn11.safetensors",
                                           "gpt_tiny_untied_rope_nobias_rmsnorm_swiglu_mtp1_gdn01.safetensors",
                                           "gpt_tiny_nope_nobias_rmsnorm_relu2_hybrid_mfmaf.safetensors",
                                           "gpt_tiny_untied_hybrid_amfm.safetensors",
                                           "gpt_tiny_nobias_relu2_moe4_hybrid_meae.safetensors"));

}  // namespace
}  // namespace lattice
