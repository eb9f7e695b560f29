// HuggingFace Llama and Qwen2 <-> lattice: logits against an independent HF-layout Llama
// (tests/fixtures/make_hf_llama_fixture.py: grouped-query attention with a head_dim wider than
// hidden / heads, untied; one key per head, tied, LlamaConfig's defaults; linear rope scaling;
// Qwen2's q/k/v biases), the round trips in both directions, the tensor layout spelled out, and
// bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_common.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_rope_scaling.h"
#include "model/gpt_inference.h"
#include "model/rotary_embedding.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

void check_fixture_logits(const char* dir) {
  HfModel hf = load_hf_llama(fixture(dir));
  hf_test::expect_fixture_logits(*hf.model, dir);
}

TEST(HfLlama, GroupedUntiedModelMatchesIndependentLogits) {
  check_fixture_logits("hf_llama_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_llama_tiny")).model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 16);  // head_dim: 4 heads of 16 against hidden_size 32
  EXPECT_EQ(c.rotary_base, 500000.0f);
  EXPECT_EQ(c.layernorm_epsilon, 1e-5f);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
}

TEST(HfLlama, TiedModelWithConfigDefaultsMatchesIndependentLogits) {
  check_fixture_logits("hf_llama_tiny_tied");
  const TransformerConfig c = load_hf_llama(fixture("hf_llama_tiny_tied")).model->config();
  EXPECT_FALSE(c.grouped_query_attention());
  EXPECT_EQ(c.rotary_base, 10000.0f);     // LlamaConfig's rope_theta
  EXPECT_EQ(c.layernorm_epsilon, 1e-6f);  // LlamaConfig's rms_norm_eps
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
}

// Qwen2: Llama with biases on q_proj, k_proj and v_proj, which are --add-qkv-bias's linear_qkv.bias.
TEST(HfLlama, Qwen2ModelMatchesIndependentLogits) {
  check_fixture_logits("hf_qwen2_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_qwen2_tiny")).model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear && c.add_qkv_bias);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.rotary_base, 1000000.0f);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  EXPECT_STREQ(hf_llama_family_name(c), "Qwen2");
}

// Qwen3: Llama with q_norm and k_norm, which are --qk-layernorm's q_layernorm and k_layernorm
// (RMSNorm of every head, before the rotation); head_dim wider than hidden / heads.
TEST(HfLlama, Qwen3ModelMatchesIndependentLogits) {
  check_fixture_logits("hf_qwen3_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_qwen3_tiny")).model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear && !c.add_qkv_bias && c.qk_layernorm);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 16);
  EXPECT_EQ(c.layernorm_epsilon, 1e-6f);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  EXPECT_STREQ(hf_llama_family_name(c), "Qwen3");
}

// SmolLM3: Llama with NoPE layers, no_rope_layers 1 for a rotary layer and 0 for one without (lattice's
// --no-rope-freq pattern inverted); without the list every no_rope_layer_interval-th layer is NoPE.
// SmolLM3Config's defaults tie the embeddings.
TEST(HfLlama, SmolLM3ModelsMatchIndependentLogits) {
  check_fixture_logits("hf_smollm3_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_smollm3_tiny")).model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear && !c.qk_layernorm);
  EXPECT_EQ(c.no_rope_pattern, (std::vector<int>{0, 0, 0, 1}));  // no_rope_layers [1,1,1,0]
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 8);  // no head_dim: hidden / heads
  EXPECT_EQ(c.rotary_base, 5000000.0f);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  EXPECT_STREQ(hf_llama_family_name(c), "SmolLM3");
  check_fixture_logits("hf_smollm3_tiny_interval");
  const TransformerConfig i = load_hf_llama(fixture("hf_smollm3_tiny_interval")).model->config();
  EXPECT_EQ(i.no_rope_pattern, (std::vector<int>{0, 1, 0, 1}));  // no list, no_rope_layer_interval 2
  EXPECT_EQ(i.kv_channels, 16);
  EXPECT_TRUE(i.untie_embeddings_and_output_weights);
}

// Mixtral: Llama whose MLPs are block_sparse_moe layers (router gate, experts' w1 w3 w2): lattice's
// --num-experts with SwiGLU experts; softmax over every expert, the top k renormalized, is the
// softmax over the top k logits, lattice's routing.
TEST(HfLlama, MixtralModelMatchesIndependentLogits) {
  check_fixture_logits("hf_mixtral_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_mixtral_tiny")).model->config();
  EXPECT_TRUE(c.moe() && c.swiglu && !c.qk_layernorm);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_hidden_size, 24);
  EXPECT_STREQ(hf_llama_family_name(c), "Mixtral");
}

// Qwen3-MoE: Qwen3's attention with mlp.gate and mlp.experts (norm_topk_prob true).
TEST(HfLlama, Qwen3MoeModelMatchesIndependentLogits) {
  check_fixture_logits("hf_qwen3_moe_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_qwen3_moe_tiny")).model->config();
  EXPECT_TRUE(c.moe() && c.qk_layernorm);
  EXPECT_EQ(c.moe_ffn_hidden_size, 20);
  EXPECT_STREQ(hf_llama_family_name(c), "Qwen3-MoE");
}

// Qwen2-MoE: Qwen2's attention (q/k/v biases), layer 0 dense (mlp_only_layers), layer 1 4 experts with
// norm_topk_prob false (--moe-router-pre-softmax) and the gated shared expert.
TEST(HfLlama, Qwen2MoeModelMatchesIndependentLogits) {
  check_fixture_logits("hf_qwen2_moe_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_qwen2_moe_tiny")).model->config();
  EXPECT_TRUE(c.moe() && c.add_qkv_bias && !c.qk_layernorm);
  EXPECT_TRUE(c.moe_router_pre_softmax);
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1));
  EXPECT_EQ(c.moe_ffn_hidden_size, 20);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 28);
  EXPECT_TRUE(c.moe_shared_expert_gate);
  EXPECT_STREQ(hf_llama_family_name(c), "Qwen2-MoE");
}

// DeepSeek-MoE (v1): Llama's attention, layer 0 dense (first_k_dense_replace), layer 1 4 experts with
// norm_topk_prob false and 2 shared experts as one ungated MLP of 2 x 20.
TEST(HfLlama, DeepseekMoeModelMatchesIndependentLogits) {
  check_fixture_logits("hf_deepseek_moe_tiny");
  const TransformerConfig c = load_hf_llama(fixture("hf_deepseek_moe_tiny")).model->config();
  EXPECT_TRUE(c.moe() && !c.add_qkv_bias && !c.qk_layernorm && c.moe_router_pre_softmax);
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1));
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 40);
  EXPECT_FALSE(c.moe_shared_expert_gate);
  EXPECT_STREQ(hf_llama_family_name(c), "DeepSeek-MoE");
}

// Mistral (sliding_window null): Llama's layers under another model_type; exported back as Llama,
// every tensor the same bits.
TEST(HfLlama, MistralModelMatchesIndependentLogitsAndExportsAsLlama) {
  check_fixture_logits("hf_mistral_tiny");
  HfModel hf = load_hf_llama(fixture("hf_mistral_tiny"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear && !c.add_qkv_bias);
  EXPECT_EQ(c.num_query_groups, 1);
  EXPECT_EQ(c.kv_channels, 16);
  TempDir out("mistral_rt");
  save_hf_llama(out.str(), *hf.model, "");
  std::ifstream cf(out.str() + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf)["model_type"], "llama");
  hf_test::expect_same_tensors("hf_mistral_tiny", out.str());
}

// Mistral with sliding_window 5: every layer's query sees its 5 latest keys, lattice's --window-size 4
// (HuggingFace counts the query's own key); exported back as Mistral with sliding_window 5, every
// tensor the same bits.
TEST(HfLlama, MistralSlidingWindowMatchesIndependentLogitsAndRoundTrips) {
  check_fixture_logits("hf_mistral_tiny_swa");
  HfModel hf = load_hf_llama(fixture("hf_mistral_tiny_swa"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_EQ(c.window_size, 4);
  EXPECT_TRUE(c.window_attn_pattern.empty());
  EXPECT_STREQ(hf_llama_family_name(c), "Mistral");
  EXPECT_EQ(hf_llama_mismatch(c), "");
  TempDir out("mistral_swa_rt");
  save_hf_llama(out.str(), *hf.model, "");
  std::ifstream cf(out.str() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["model_type"], "mistral");
  EXPECT_EQ(j["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(j["sliding_window"], 5);
  hf_test::expect_same_tensors("hf_mistral_tiny_swa", out.str());
  HfModel back = load_hf_llama(out.str());
  EXPECT_EQ(back.model->config().window_size, 4);
  hf_test::expect_fixture_logits(*back.model, "hf_mistral_tiny_swa");
}

// Qwen2 with use_sliding_window, sliding_window 4 and max_window_layers 1: layer 0 attends fully,
// layer 1 through the window (--window-size 3 --window-attn-skip-freq [0,1]); exported back with
// the same three keys.
TEST(HfLlama, Qwen2SlidingWindowLayersMatchIndependentLogitsAndRoundTrip) {
  check_fixture_logits("hf_qwen2_tiny_swa");
  HfModel hf = load_hf_llama(fixture("hf_qwen2_tiny_swa"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_EQ(c.window_size, 3);
  EXPECT_EQ(c.window_attn_pattern, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.attention_window(0), -1);
  EXPECT_EQ(c.attention_window(1), 3);
  EXPECT_EQ(hf_llama_mismatch(c), "");
  TempDir out("qwen2_swa_rt");
  save_hf_llama(out.str(), *hf.model, "");
  std::ifstream cf(out.str() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["use_sliding_window"], true);
  EXPECT_EQ(j["sliding_window"], 4);
  EXPECT_EQ(j["max_window_layers"], 1);
  HfModel back = load_hf_llama(out.str());
  EXPECT_EQ(back.model->config().window_attn_pattern, c.window_attn_pattern);
  hf_test::expect_fixture_logits(*back.model, "hf_qwen2_tiny_swa");
  // layer_types (newer transformers write it) decides over max_window_layers.
  TempDir t("qwen2_swa_layer_types");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_qwen2_tiny_swa", nullptr,
      [](nlohmann::json& k) { k["layer_types"] = {"sliding_attention", "full_attention"}; }, t);
  EXPECT_EQ(load_hf_llama(dir).model->config().window_attn_pattern, (std::vector<int>{1, 0}));
}

// Writes the model into dir as HuggingFace Phi-3 (--hf-model-type phi3) and returns its config.json.
nlohmann::json save_as_phi3(const GPTModel& model, const std::string& dir) {
  hf::ExportOptions phi3;
  phi3.model_type = "phi3";
  save_hf_llama(dir, model, "", phi3);
  std::ifstream cf(dir + "/config.json");
  return nlohmann::json::parse(cf);
}

// Phi-3 (Phi-4-mini's form without its rope_scaling): Llama's model under fused qkv_proj and gate_up_proj,
// half of each head rotated (--rotary-percent 0.5). Exported as Phi-3 with --hf-model-type phi3, every tensor
// the same bits; as Llama it is refused (Llama rotates the whole head), naming the way out.
TEST(HfLlama, Phi3PartialRotationMatchesIndependentLogitsAndRoundTrips) {
  check_fixture_logits("hf_phi3_tiny");
  HfModel hf = load_hf_llama(fixture("hf_phi3_tiny"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.rope() && c.rmsnorm() && c.swiglu && !c.add_bias_linear && !c.add_qkv_bias);
  EXPECT_EQ(c.rotary_percent, 0.5);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.rotary_base, 250000.0f);
  EXPECT_EQ(c.window_size, -1);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  std::ifstream in(fixture("hf_phi3_tiny") + "/config.json");
  EXPECT_EQ(hf_llama_family_name(nlohmann::json::parse(in)), "Phi-3");
  EXPECT_NE(hf_llama_mismatch(c).find("--hf-model-type phi3"), std::string::npos) << hf_llama_mismatch(c);
  EXPECT_EQ(hf_llama_mismatch(c, true), "");
  TempDir llama("phi3_as_llama");
  hf_test::expect_one_line_error([&] { save_hf_llama(llama.str() + "/x", *hf.model, ""); },
                                 {"--rotary-percent 0.5", "--hf-model-type phi3"});
  EXPECT_FALSE(std::filesystem::exists(llama.str() + "/x/config.json"));
  TempDir out("phi3_rt");
  const nlohmann::json j = save_as_phi3(*hf.model, out.str());
  EXPECT_EQ(j["model_type"], "phi3");
  EXPECT_EQ(j["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ(j["partial_rotary_factor"], 0.5);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_FALSE(j.contains("head_dim"));
  hf_test::expect_same_tensors("hf_phi3_tiny", out.str());
  hf_test::expect_fixture_logits(*load_hf_llama(out.str()).model, "hf_phi3_tiny");
}

// Phi-3-mini-4k's form: the whole head rotated, sliding_window 5 (Mistral's window, --window-size 4),
// untied. Round trips as Phi-3; Llama's writer gives it as Mistral, the same model.
TEST(HfLlama, Phi3SlidingWindowMatchesIndependentLogitsAndRoundTrips) {
  check_fixture_logits("hf_phi3_tiny_swa");
  HfModel hf = load_hf_llama(fixture("hf_phi3_tiny_swa"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_EQ(c.rotary_percent, 1.0);
  EXPECT_EQ(c.window_size, 4);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  TempDir out("phi3_swa_rt");
  const nlohmann::json j = save_as_phi3(*hf.model, out.str());
  EXPECT_EQ(j["model_type"], "phi3");
  EXPECT_EQ(j["sliding_window"], 5);
  EXPECT_EQ(j["partial_rotary_factor"], 1.0);
  hf_test::expect_same_tensors("hf_phi3_tiny_swa", out.str());
  hf_test::expect_fixture_logits(*load_hf_llama(out.str()).model, "hf_phi3_tiny_swa");
  TempDir mistral("phi3_as_mistral");
  save_hf_llama(mistral.str(), *hf.model, "");
  std::ifstream mf(mistral.str() + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(mf)["model_type"], "mistral");
  hf_test::expect_fixture_logits(*load_hf_llama(mistral.str()).model, "hf_phi3_tiny_swa");
}

// Max |a - b| over rows [0, T) of logits [T, Vp] against want [T, V].
double max_logit_error(const std::vector<float>& logits, const std::vector<float>& want, int64_t T, int64_t V, int64_t Vp) {
  double err = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) err = std::max(err, std::fabs(double(logits[size_t(t * Vp + v)]) - want[size_t(t * V + v)]));
  return err;
}

// Phi-3.5's LongRoPE (rope_scaling longrope, original context 8): the 16 tokens' logits by the long factors,
// the first 8's alone by the short ones, both as the independent reference computes them; the KV cache
// rotates by the context's length at each step as transformers does (the first 8 positions one at a time:
// the short factors' logits; all 16 at once: the long ones'). Round trips as Phi-3, the factors and the
// attention factor kept; training flags and --use-checkpoint-args carry them (test_convert_generate.sh).
TEST(HfLlama, Phi3LongRopeMatchesIndependentLogitsByLengthAndRoundTrips) {
  check_fixture_logits("hf_phi3_tiny_longrope");
  HfModel hf = load_hf_llama(fixture("hf_phi3_tiny_longrope"));
  const TransformerConfig& c = hf.model->config();
  ASSERT_TRUE(c.longrope());
  EXPECT_EQ(c.longrope_short_factor, (std::vector<float>{1.0f, 1.5f}));
  EXPECT_EQ(c.longrope_long_factor, (std::vector<float>{3.0f, 7.0f}));
  EXPECT_EQ(c.longrope_original_max_position_embeddings, 8);
  EXPECT_FLOAT_EQ(c.longrope_attention_factor, std::sqrt(2.0f));  // sqrt(1 + ln(64 / 8) / ln 8)
  SafetensorsFile ref = SafetensorsFile::read(fixture("hf_phi3_tiny_longrope") + "/expected_logits.safetensors");
  const std::vector<int32_t> tokens = ref.get_i32("tokens");
  const std::vector<float> long_logits = ref.get_f32("logits"), short_logits = ref.get_f32("logits_short");
  const int64_t V = c.vocab_size, Vp = c.padded_vocab_size, S = 8, T = int64_t(tokens.size());
  std::vector<float> logits(size_t(T * Vp));
  hf.model->forward_logits(tokens.data(), 1, S, logits.data());
  EXPECT_LE(max_logit_error(logits, short_logits, S, V, Vp), 1e-5);
  GPTInference steps(*hf.model);
  std::vector<float> one(static_cast<size_t>(Vp));
  for (int64_t p = 0; p < S; ++p) {
    steps.append(&tokens[size_t(p)], 1, one.data());
    EXPECT_LE(max_logit_error(one, std::vector<float>(short_logits.begin() + p * V, short_logits.begin() + (p + 1) * V), 1,
                              V, Vp),
              1e-5)
        << "position " << p;
  }
  GPTInference whole(*hf.model);
  whole.append(tokens.data(), T, logits.data(), true);
  EXPECT_LE(max_logit_error(logits, long_logits, T, V, Vp), 1e-5);
  // Round trip: rope_scaling longrope with the factors, the original context, no attention_factor (the
  // default one); then with the context changed, the attention factor written.
  TempDir out("phi3_longrope_rt");
  const nlohmann::json j = save_as_phi3(*hf.model, out.str());
  EXPECT_EQ(j["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(j["rope_scaling"]["short_factor"], nlohmann::json({1.0, 1.5}));
  EXPECT_EQ(j["rope_scaling"]["long_factor"], nlohmann::json({3.0, 7.0}));
  EXPECT_FALSE(j["rope_scaling"].contains("attention_factor"));
  EXPECT_EQ(j["original_max_position_embeddings"], 8);
  EXPECT_EQ(j["max_position_embeddings"], 64);
  hf_test::expect_same_tensors("hf_phi3_tiny_longrope", out.str());
  hf_test::expect_fixture_logits(*load_hf_llama(out.str()).model, "hf_phi3_tiny_longrope");
  TransformerConfig shorter = c;
  shorter.max_position_embeddings = 32;
  const nlohmann::json k = hf_llama_config_json(shorter, "", true);
  EXPECT_FLOAT_EQ(k["rope_scaling"]["attention_factor"].get<float>(), std::sqrt(2.0f));
  // Llama has no LongRoPE: refused, naming Phi-3.
  EXPECT_NE(hf_llama_mismatch(c).find("LongRoPE"), std::string::npos) << hf_llama_mismatch(c);
}

// What Phi-3's form cannot hold, and LongRoPE factors that do not fit, are one-line errors naming them.
TEST(HfLlama, Phi3RefusalsNameTheSetting) {
  TempDir t("phi3_longrope");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_phi3_tiny", nullptr,
      [](nlohmann::json& j) {
        j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.0, 1.0}}, {"long_factor", {2.0, 4.0, 4.0}}};
      },
      t);
  hf_test::expect_one_line_error([&] { load_hf_llama(dir); },
                                 {"config.json", "rope_scaling longrope has 3 short and 3 long factors", "2 pairs"});
  TempDir t2("phi3_longrope_nolong");
  const std::string dir2 = hf_test::rewritten_fixture(
      "hf_phi3_tiny", nullptr, [](nlohmann::json& j) { j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.0}}}; },
      t2);
  hf_test::expect_one_line_error([&] { load_hf_llama(dir2); }, {"config.json", "rope_scaling longrope has no long_factor"});
  const TransformerConfig qwen3 = load_hf_llama(fixture("hf_qwen3_tiny")).model->config();
  EXPECT_NE(hf_llama_mismatch(qwen3, true).find("--qk-layernorm"), std::string::npos);
  const TransformerConfig llama = load_hf_llama(fixture("hf_llama_tiny")).model->config();  // head_dim 16 > 32 / 4
  EXPECT_NE(hf_llama_mismatch(llama, true).find("--kv-channels other than hidden / heads"), std::string::npos);
  TransformerConfig scaled = load_hf_llama(fixture("hf_phi3_tiny")).model->config();
  scaled.rotary_seq_len_interpolation_factor = 2.0f;
  EXPECT_NE(hf_llama_mismatch(scaled, true).find("rope scaling"), std::string::npos);
  HfModel phi = load_hf_llama(fixture("hf_phi3_tiny"));
  hf::ExportOptions other;
  other.model_type = "qwen3_next";
  TempDir o("phi3_other_type");
  hf_test::expect_one_line_error([&] { save_hf_llama(o.str() + "/x", *phi.model, "", other); },
                                 {"--hf-model-type qwen3_next", "phi3"});
}

// Windows HuggingFace cannot express are refused on export, naming the flag.
TEST(HfLlama, WindowPatternsWithoutAnHfFormAreRefused) {
  TransformerConfig c = load_hf_llama(fixture("hf_mistral_tiny_swa")).model->config();
  c.window_attn_pattern = {1, 0};
  EXPECT_NE(hf_llama_mismatch(c).find("--window-attn-skip-freq in a Mistral-style model"), std::string::npos);
  TransformerConfig q = load_hf_llama(fixture("hf_qwen2_tiny_swa")).model->config();
  q.window_attn_pattern = {1, 0};  // a full layer after a window layer
  EXPECT_NE(hf_llama_mismatch(q).find("full-attention layer after a window layer"), std::string::npos);
  q.window_attn_pattern = {};
  EXPECT_EQ(hf_llama_mismatch(q), "");  // every layer: max_window_layers 0
}

// rope_scaling linear (factor 4): lattice's --rotary-seq-len-interpolation-factor.
TEST(HfLlama, LinearRopeScalingMatchesIndependentLogits) {
  check_fixture_logits("hf_llama_tiny_scaled");
  EXPECT_EQ(load_hf_llama(fixture("hf_llama_tiny_scaled")).model->config().rotary_seq_len_interpolation_factor, 4.0f);
}

// rope_scaling llama3 (Llama 3.1's frequency-dependent scaling; original context 32 so that the
// fixture's 8 frequencies fall in all three bands): --use-rope-scaling and its four values; written
// back as the same rope_scaling.
TEST(HfLlama, Llama3RopeScalingMatchesIndependentLogits) {
  check_fixture_logits("hf_llama_tiny_llama3");
  HfModel hf = load_hf_llama(fixture("hf_llama_tiny_llama3"));
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.use_rope_scaling);
  EXPECT_EQ(c.rope_scaling_factor, 8.0f);
  EXPECT_EQ(c.rope_scaling_low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope_scaling_high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling_original_max_position_embeddings, 32);
  const nlohmann::json written = hf_llama_config_json(c, "");
  const nlohmann::json want = {{"rope_type", "llama3"},       {"factor", 8.0},
                               {"low_freq_factor", 1.0},      {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 32}};
  EXPECT_EQ(written["rope_scaling"], want);
}

// rope_scaling yarn (GPT-OSS's and long-context Qwen's; the fixture's ramp over dims 2.01 to 5.03 of
// 8 pairs, not truncated, and the attention factor 0.1 ln 4 + 1): --position-embedding-type yarn
// and its fields, against the fixture's independent logits; written back as the same rope_scaling;
// the other forms transformers reads (mscale with mscale_all_dim, attention_factor), and the config
// whose factor transformers versions read differently, refused.
TEST(HfLlama, YarnRopeScalingMatchesIndependentLogits) {
  check_fixture_logits("hf_llama_tiny_yarn");
  HfModel hf = load_hf_llama(fixture("hf_llama_tiny_yarn"), 128, 16);
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.yarn() && c.rope());
  EXPECT_EQ(c.yarn_rotary_scaling_factor, 4.0f);
  EXPECT_EQ(c.yarn_original_max_position_embeddings, 2048);
  EXPECT_EQ(c.yarn_beta_fast, 32.0f);
  EXPECT_EQ(c.yarn_beta_slow, 1.0f);
  EXPECT_FALSE(c.yarn_correction_range_round_to_int);
  EXPECT_EQ(c.yarn_mscale, 1.0f);
  EXPECT_EQ(c.yarn_mscale_all_dim, 0.0f);
  const nlohmann::json written = hf_llama_config_json(c, "");
  const nlohmann::json want = {{"rope_type", "yarn"}, {"factor", 4.0},    {"original_max_position_embeddings", 2048},
                               {"beta_fast", 32.0},   {"beta_slow", 1.0}, {"truncate", false}};
  EXPECT_EQ(written["rope_scaling"], want);
  EXPECT_EQ(written["max_position_embeddings"], 8192);

  nlohmann::json config = hf::read_config(fixture("hf_llama_tiny_yarn"));
  auto read = [&](const nlohmann::json& rope_scaling) {
    nlohmann::json j = config;
    j["rope_scaling"] = rope_scaling;
    return hf_llama_config(j, "x", 128);
  };
  nlohmann::json s = config["rope_scaling"];
  s["mscale"] = 0.707;  // DeepSeek's pair: the factor m(4, 0.707) / m(4, 0.707) = 1
  s["mscale_all_dim"] = 0.707;
  TransformerConfig d = read(s);
  EXPECT_FLOAT_EQ(float(yarn_attention_factor(d)), 1.0f);
  EXPECT_EQ(hf::yarn_rope_scaling_json(d)["attention_factor"], 1.0);
  s.erase("mscale_all_dim");  // mscale alone: transformers ignores it
  EXPECT_FLOAT_EQ(float(yarn_attention_factor(read(s))), float(0.1 * std::log(4.0) + 1.0));
  s = config["rope_scaling"];
  s["attention_factor"] = 1.25;
  d = read(s);
  EXPECT_NEAR(yarn_attention_factor(d), 1.25, 1e-6);
  EXPECT_NEAR(hf::yarn_rope_scaling_json(d)["attention_factor"].get<double>(), 1.25, 1e-6);
  s = config["rope_scaling"];
  config["max_position_embeddings"] = 2048;  // Qwen2.5's form: the factor ambiguous between versions
  try {
    read(s);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings 2048 is not factor 4"), std::string::npos) << e.what();
  }
  s["attention_factor"] = 1.1;  // an explicit factor settles it
  EXPECT_NEAR(yarn_attention_factor(read(s)), 1.1, 1e-6);
}

TEST(HfLlama, HfToLatticeToHfIsIdentity) {
  for (const char* dir :
       {"hf_llama_tiny", "hf_llama_tiny_tied", "hf_llama_tiny_scaled", "hf_llama_tiny_llama3", "hf_llama_tiny_yarn",
        "hf_qwen2_tiny",
        "hf_qwen3_tiny", "hf_mixtral_tiny", "hf_qwen3_moe_tiny", "hf_qwen2_moe_tiny", "hf_deepseek_moe_tiny",
        "hf_smollm3_tiny", "hf_smollm3_tiny_interval"}) {
    TempDir out(std::string("llama_rt_") + dir);
    HfModel hf = load_hf_llama(fixture(dir));
    save_hf_llama(out.str() + "/hf", *hf.model, "");
    SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
    SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
    size_t compared = 0;
    for (const std::string& name : a.names()) {
      if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
      ASSERT_TRUE(b.has(name)) << name;
      EXPECT_EQ(a.get(name).shape, b.get(name).shape) << name;
      EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
      ++compared;
    }
    EXPECT_EQ(compared, b.names().size()) << "the export has tensors the original does not";
    std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
    const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
    for (const char* key : {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                            "intermediate_size", "vocab_size", "max_position_embeddings", "model_type", "hidden_act",
                            "tie_word_embeddings", "rope_scaling", "architectures"})  // absent: null
      EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << dir << ": config.json " << key;
    for (const char* key : {"num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                            "shared_expert_intermediate_size", "norm_topk_prob", "mlp_only_layers", "n_routed_experts",
                            "n_shared_experts", "first_k_dense_replace", "moe_layer_freq"})
      EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << dir << ": config.json " << key;
    if (ja["model_type"] == "smollm3") {  // the list written out, the interval kept (the list derived from it)
      std::vector<int> want;
      for (int64_t l = 0; l < ja["num_hidden_layers"].get<int64_t>(); ++l)
        want.push_back(ja.contains("no_rope_layers") ? ja["no_rope_layers"][size_t(l)].get<int>()
                                                     : int((l + 1) % ja["no_rope_layer_interval"].get<int64_t>() != 0));
      EXPECT_EQ(jb["no_rope_layers"].get<std::vector<int>>(), want) << dir;
      EXPECT_EQ(ja["no_rope_layer_interval"], jb["no_rope_layer_interval"]) << dir;
    }
    EXPECT_EQ(ja.value("rope_theta", 10000.0), jb["rope_theta"].get<double>()) << dir;
    EXPECT_EQ(ja.value("rms_norm_eps", 1e-6), jb["rms_norm_eps"].get<double>()) << dir;
    if (ja["model_type"] == "qwen2" || ja["model_type"] == "qwen2_moe" || ja["model_type"] == "deepseek")
      EXPECT_FALSE(jb.contains("head_dim")) << dir << ": Qwen2Config and DeepseekConfig have no head_dim";
    else
      EXPECT_EQ(ja.value("head_dim", 8), jb["head_dim"]) << dir;
  }
}

// A Llama-style model with every parameter (padded rows too) random, so any misplaced element
// shows: 4 heads of 8 in 2 query groups against hidden size 24, ffn 20.
// qkv_bias: Qwen2's form (--add-qkv-bias), with heads of 6 = hidden / heads as Qwen2 has them;
// qk_layernorm: Qwen3's (--qk-layernorm).
std::unique_ptr<GPTModel> random_llama(bool untie, bool qkv_bias = false, bool qk_layernorm = false,
                                       int64_t experts = 0) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 24;
  c.num_attention_heads = 4;
  c.kv_channels = qkv_bias ? 6 : 8;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 20;
  c.vocab_size = 70;
  c.make_vocab_size_divisible_by = 32;
  c.max_position_embeddings = 12;
  c.position_embedding_type = "rope";
  c.rotary_base = 20000.0f;
  c.normalization = "RMSNorm";
  c.layernorm_epsilon = 1e-6f;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = qkv_bias;
  c.qk_layernorm = qk_layernorm;
  c.num_experts = experts;  // of width 14, top-2
  c.moe_ffn_hidden_size = 14;
  c.untie_embeddings_and_output_weights = untie;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  auto m = std::make_unique<GPTModel>(c, 1, c.max_position_embeddings);
  hf_test::randomize_parameters(*m, untie ? 9 : qkv_bias ? 11 : qk_layernorm ? 12 : 10, false);
  return m;
}

TEST(HfLlama, LatticeToHfToLatticeKeepsEveryRealParameterAndLogit) {
  for (bool untie : {false, true}) {
    auto model = random_llama(untie);
    const TransformerConfig& c = model->config();
    EXPECT_EQ(hf_llama_mismatch(c), "");
    EXPECT_NE(hf_gpt2_mismatch(c), "");
    TempDir out(untie ? "llama_l2h_untied" : "llama_l2h_tied");
    save_hf_llama(out.str(), *model, "ByteTokenizer");
    HfModel back = load_hf_llama(out.str(), c.make_vocab_size_divisible_by);
    EXPECT_EQ(back.tokenizer_type, "ByteTokenizer");
    const TransformerConfig& b = back.model->config();
    EXPECT_EQ(b.padded_vocab_size, c.padded_vocab_size);
    EXPECT_EQ(b.num_query_groups, c.num_query_groups);
    EXPECT_EQ(b.kv_channels, c.kv_channels);
    EXPECT_EQ(b.ffn_hidden_size, c.ffn_hidden_size);
    EXPECT_EQ(b.rotary_base, c.rotary_base);
    EXPECT_EQ(b.layernorm_epsilon, c.layernorm_epsilon);
    EXPECT_EQ(b.untie_embeddings_and_output_weights, untie);
    hf_test::expect_same_model(*model, *back.model);
  }
}

TEST(HfLlama, Qwen2LatticeToHfToLatticeKeepsTheQkvBias) {
  auto model = random_llama(false, true);
  const TransformerConfig& c = model->config();
  EXPECT_EQ(hf_llama_mismatch(c), "");
  TempDir out("qwen2_l2h");
  save_hf_llama(out.str(), *model, "");
  std::ifstream cf(out.str() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  HfModel back = load_hf_llama(out.str(), c.make_vocab_size_divisible_by);
  EXPECT_TRUE(back.model->config().add_qkv_bias);
  hf_test::expect_same_model(*model, *back.model);
  // linear_qkv.bias [(H + 2G) D]: per group its heads' q_proj.bias, then k_proj's and v_proj's.
  SafetensorsFile f = SafetensorsFile::read(out.str() + "/model.safetensors");
  const ParamBuffer& pb = model->params();
  const float* qkv = pb.params() + pb.info("decoder.layers.1.self_attention.linear_qkv.bias").offset;
  const std::vector<float> q = f.get_f32("model.layers.1.self_attn.q_proj.bias");
  const std::vector<float> k = f.get_f32("model.layers.1.self_attn.k_proj.bias");
  const std::vector<float> v = f.get_f32("model.layers.1.self_attn.v_proj.bias");
  const int64_t D = c.kv_channels, G = c.num_query_groups, R = c.num_attention_heads / G;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t r = 0; r < R; ++r) ASSERT_EQ(q[(g * R + r) * D + d], qkv[(g * (R + 2) + r) * D + d]);
      ASSERT_EQ(k[g * D + d], qkv[(g * (R + 2) + R) * D + d]);
      ASSERT_EQ(v[g * D + d], qkv[(g * (R + 2) + R + 1) * D + d]);
    }
  EXPECT_FALSE(f.has("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(f.has("model.layers.0.mlp.down_proj.bias"));
}

// Qwen3: q_layernorm.weight and k_layernorm.weight are q_norm.weight and k_norm.weight as they
// are; config.json is Qwen3Config's (head_dim kept, no biases). --qk-layernorm with
// --add-qkv-bias has no Qwen3 form (its attention_bias also biases o_proj).
TEST(HfLlama, Qwen3LatticeToHfToLatticeKeepsTheQkNorms) {
  auto model = random_llama(false, false, true);
  const TransformerConfig& c = model->config();
  EXPECT_EQ(hf_llama_mismatch(c), "");
  TempDir out("qwen3_l2h");
  save_hf_llama(out.str(), *model, "");
  std::ifstream cf(out.str() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j["head_dim"], c.kv_channels);
  EXPECT_EQ(j["attention_bias"], false);
  HfModel back = load_hf_llama(out.str(), c.make_vocab_size_divisible_by);
  EXPECT_TRUE(back.model->config().qk_layernorm);
  hf_test::expect_same_model(*model, *back.model);
  SafetensorsFile f = SafetensorsFile::read(out.str() + "/model.safetensors");
  const ParamBuffer& pb = model->params();
  for (const char* part : {"q", "k"}) {
    const std::string lat = std::string("decoder.layers.1.self_attention.") + part + "_layernorm.weight";
    const std::vector<float> hf = f.get_f32(std::string("model.layers.1.self_attn.") + part + "_norm.weight");
    ASSERT_EQ(int64_t(hf.size()), c.kv_channels);
    EXPECT_TRUE(std::equal(hf.begin(), hf.end(), pb.params() + pb.info(lat).offset)) << lat;
  }
  TransformerConfig both = c;
  both.add_qkv_bias = true;
  EXPECT_NE(hf_llama_mismatch(both).find("--qk-layernorm with --add-qkv-bias"), std::string::npos);
}

// --no-rope-freq: a Llama-style model with NoPE layers is exported as SmolLM3 (no_rope_layers the pattern
// inverted; the interval when one makes the list); back, the same model. With another family's features
// (SmolLM3 is a dense Llama) it is refused, naming both flags.
TEST(HfLlama, NoRopeLayersLatticeToHfToLatticeIsSmolLM3) {
  for (const std::vector<int>& pattern : {std::vector<int>{0, 1}, std::vector<int>{1, 0}}) {
    auto base = random_llama(false);
    TransformerConfig c = base->config();
    c.no_rope_pattern = pattern;
    c.finalize();
    GPTModel model(c, 1, c.max_position_embeddings);
    std::memcpy(model.params().params(), base->params().params(), size_t(base->params().numel()) * sizeof(float));
    EXPECT_EQ(hf_llama_mismatch(c), "");
    TempDir out(pattern[0] ? "smollm3_l2h_10" : "smollm3_l2h_01");
    save_hf_llama(out.str(), model, "");
    std::ifstream cf(out.str() + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(cf);
    EXPECT_EQ(j["model_type"], "smollm3");
    EXPECT_EQ(j["architectures"][0], "SmolLM3ForCausalLM");
    EXPECT_EQ(j["no_rope_layers"].get<std::vector<int>>(), (std::vector<int>{1 - pattern[0], 1 - pattern[1]}));
    if (pattern[1])  // [0, 1]: every second layer, the interval 2
      EXPECT_EQ(j["no_rope_layer_interval"], 2);
    else  // [1, 0]: no interval makes it
      EXPECT_FALSE(j.contains("no_rope_layer_interval"));
    EXPECT_EQ(j["use_sliding_window"], false);
    HfModel back = load_hf_llama(out.str(), c.make_vocab_size_divisible_by);
    EXPECT_EQ(back.model->config().no_rope_pattern, pattern);
    hf_test::expect_same_model(model, *back.model);
  }
  TransformerConfig c = random_llama(false)->config();
  c.no_rope_pattern = {0, 1};
  TransformerConfig qk = c;
  qk.qk_layernorm = true;
  EXPECT_NE(hf_llama_mismatch(qk).find("--no-rope-freq with --qk-layernorm"), std::string::npos) << hf_llama_mismatch(qk);
  TransformerConfig window = c;
  window.window_size = 3;
  EXPECT_NE(hf_llama_mismatch(window).find("--no-rope-freq with --window-size"), std::string::npos);
}

// Mixture of experts: exported as Mixtral, or with --qk-layernorm as Qwen3-MoE; back, the same
// model (every expert's fc1 the gate's rows over the up projection's, as the dense MLP's).
TEST(HfLlama, MixtureOfExpertsLatticeToHfToLatticeKeepsEveryExpert) {
  for (bool qk : {false, true}) {
    auto model = random_llama(true, false, qk, 3);
    const TransformerConfig& c = model->config();
    EXPECT_EQ(hf_llama_mismatch(c), "");
    TempDir out(qk ? "qwen3_moe_l2h" : "mixtral_l2h");
    save_hf_llama(out.str(), *model, "");
    std::ifstream cf(out.str() + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(cf);
    EXPECT_EQ(j["model_type"], qk ? "qwen3_moe" : "mixtral");
    HfModel back = load_hf_llama(out.str(), c.make_vocab_size_divisible_by);
    EXPECT_EQ(back.model->config().num_experts, 3);
    EXPECT_EQ(back.model->config().moe_ffn_hidden_size, 14);
    hf_test::expect_same_model(*model, *back.model);
    SafetensorsFile f = SafetensorsFile::read(out.str() + "/model.safetensors");
    const std::string x = qk ? "model.layers.1.mlp.experts.2." : "model.layers.1.block_sparse_moe.experts.2.";
    const std::vector<float> up = f.get_f32(x + (qk ? "up_proj.weight" : "w3.weight"));
    const ParamBuffer& pb = model->params();
    const float* fc1 = pb.params() + pb.info("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight").offset;
    EXPECT_TRUE(std::equal(up.begin(), up.end(), fc1 + 14 * c.hidden_size)) << "the up projection is fc1's second half";
  }
}

// The layout itself, spelled out: linear_qkv row (g (R + 2) + r) D + d is q_proj row (g R + r) D + d
// for the group's R query heads, then k_proj's and v_proj's rows g D + d; linear_fc1 is gate_proj
// over up_proj.
TEST(HfLlama, TensorLayout) {
  auto model = random_llama(true);
  const TransformerConfig& c = model->config();
  const int64_t C = c.hidden_size, D = c.kv_channels, G = c.num_query_groups, R = c.num_attention_heads / G;
  const int64_t F = c.ffn_hidden_size;
  TempDir out("llama_layout");
  export_hf_llama_tensors(*model).write(out.str() + "/model.safetensors");
  SafetensorsFile f = SafetensorsFile::read(out.str() + "/model.safetensors");
  const ParamBuffer& pb = model->params();
  auto lat = [&](const std::string& n) { return pb.params() + pb.info(n).offset; };
  const float* qkv = lat("decoder.layers.1.self_attention.linear_qkv.weight");  // [(H + 2G) D, C]
  const std::vector<float> q = f.get_f32("model.layers.1.self_attn.q_proj.weight");
  const std::vector<float> k = f.get_f32("model.layers.1.self_attn.k_proj.weight");
  const std::vector<float> v = f.get_f32("model.layers.1.self_attn.v_proj.weight");
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t i = 0; i < C; ++i) {
        for (int64_t r = 0; r < R; ++r)
          ASSERT_EQ(q[((g * R + r) * D + d) * C + i], qkv[((g * (R + 2) + r) * D + d) * C + i]);
        ASSERT_EQ(k[(g * D + d) * C + i], qkv[((g * (R + 2) + R) * D + d) * C + i]);
        ASSERT_EQ(v[(g * D + d) * C + i], qkv[((g * (R + 2) + R + 1) * D + d) * C + i]);
      }
  const float* fc1 = lat("decoder.layers.0.mlp.linear_fc1.weight");  // [2F, C]
  const std::vector<float> gate = f.get_f32("model.layers.0.mlp.gate_proj.weight");
  const std::vector<float> up = f.get_f32("model.layers.0.mlp.up_proj.weight");
  for (int64_t o = 0; o < F; ++o)
    for (int64_t i = 0; i < C; ++i) {
      ASSERT_EQ(gate[o * C + i], fc1[o * C + i]);
      ASSERT_EQ(up[o * C + i], fc1[(F + o) * C + i]);
    }
  EXPECT_EQ(f.get("model.embed_tokens.weight").shape, (Shape{c.vocab_size, C}));
  EXPECT_EQ(f.get("lm_head.weight").shape, (Shape{c.vocab_size, C}));
  EXPECT_EQ(f.get("model.layers.0.self_attn.o_proj.weight").shape, (Shape{C, c.attention_width()}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(HfLlama, ModelsWithoutALlamaFormAreNamed) {
  TransformerConfig c = random_llama(true)->config();
  auto why = [&](auto edit) {
    TransformerConfig e = c;
    edit(e);
    return hf_llama_mismatch(e);
  };
  EXPECT_NE(why([](TransformerConfig& e) { e.rotary_percent = 0.5; }).find("--rotary-percent 0.5"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.rotary_interleaved = true; }).find("--rotary-interleaved"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.normalization = "LayerNorm"; }).find("LayerNorm"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.swiglu = false; }).find("GELU"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.swiglu = false, e.quick_geglu = true; }).find("--quick-geglu"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.glu_linear_offset = 1.0f; }).find("--glu-linear-offset"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.activation_func_clamp_value = 7.0f; }).find("--activation-func-clamp-value"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.add_bias_linear = true; }).find("--disable-bias-linear"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& e) { e.position_embedding_type = "learned_absolute"; }).find("learned"),
            std::string::npos);
  // Qwen2 computes head_dim as hidden / heads: the 4 heads of 8 against hidden 24 have no Qwen2 form.
  EXPECT_NE(why([](TransformerConfig& e) { e.add_qkv_bias = true; }).find("--kv-channels"), std::string::npos);
  TempDir out("llama_refused");
  TransformerConfig biased = c;
  biased.add_bias_linear = true;
  GPTModel m(biased, 1, 4);
  try {
    save_hf_llama(out.str() + "/x", m, "");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--to-hf " + out.str() + "/x"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(out.path / "x")) << "a refused export wrote something";
}

// The fixture sharded as save_pretrained shards a large model: layer 0 in one file, the rest in
// another, and model.safetensors.index.json's weight_map naming each tensor's file. `edit` may
// change the map (tensor -> file) before it is written.
std::string sharded_fixture(TempDir& tmp, const std::function<void(nlohmann::json&)>& edit = nullptr) {
  const SafetensorsFile f = SafetensorsFile::read(fixture("hf_llama_tiny") + "/model.safetensors");
  SafetensorsWriter a, b;
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : f.names()) {
    const bool first = name.find("layers.0.") != std::string::npos;
    const SafeTensor& t = f.get(name);
    (first ? a : b).add(name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(tmp.str() + "/model-00001-of-00002.safetensors");
  b.write(tmp.str() + "/model-00002-of-00002.safetensors");
  if (edit) edit(map);
  std::ofstream(tmp.str() + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 114000}}}, {"weight_map", map}}.dump(2);
  std::filesystem::copy_file(fixture("hf_llama_tiny") + "/config.json", tmp.str() + "/config.json");
  return tmp.str();
}

TEST(HfLlama, ShardedModelLoadsAsTheWholeFile) {
  TempDir t("llama_sharded");
  HfModel whole = load_hf_llama(fixture("hf_llama_tiny"));
  HfModel sharded = load_hf_llama(sharded_fixture(t));
  ASSERT_EQ(whole.model->params().numel(), sharded.model->params().numel());
  EXPECT_EQ(0, std::memcmp(whole.model->params().params(), sharded.model->params().params(),
                           size_t(whole.model->params().numel()) * sizeof(float)));
}

TEST(HfLlama, InconsistentShardIndexIsAnErrorNamingTheFile) {
  auto expect_msg = [](const std::string& dir, const std::vector<std::string>& needles) {
    try {
      load_hf_llama(dir);
      ADD_FAILURE() << "no error; expected one mentioning " << needles[0];
    } catch (const Error& e) {
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
  };
  {
    TempDir t("llama_shard_missing");
    expect_msg(sharded_fixture(t, [](nlohmann::json& m) { m["model.norm.weight"] = "model-00003-of-00002.safetensors"; }),
               {"model-00003-of-00002.safetensors does not exist"});
  }
  {
    TempDir t("llama_shard_wrong");  // a tensor of the second shard mapped to the first
    expect_msg(sharded_fixture(t, [](nlohmann::json& m) { m["model.norm.weight"] = "model-00001-of-00002.safetensors"; }),
               {"model-00001-of-00002.safetensors: no tensor model.norm.weight"});
  }
  {
    TempDir t("llama_shard_unlisted");  // a tensor no entry of the map names
    expect_msg(sharded_fixture(t, [](nlohmann::json& m) { m.erase("model.norm.weight"); }),
               {"model-00002-of-00002.safetensors: tensor model.norm.weight is not in"});
  }
  {
    TempDir t("llama_shard_twice");  // the same tensor in two shards
    const std::string dir = sharded_fixture(t);
    std::vector<SafetensorsFile> parts;
    parts.push_back(SafetensorsFile::read(dir + "/model-00001-of-00002.safetensors"));
    parts.push_back(SafetensorsFile::read(dir + "/model-00001-of-00002.safetensors"));
    try {
      SafetensorsFile::combine("index", std::move(parts));
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("index: tensor model.layers.0."), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("is in both"), std::string::npos) << e.what();
    }
  }
  {
    TempDir t("llama_shard_escape");
    expect_msg(sharded_fixture(t, [](nlohmann::json& m) { m["model.norm.weight"] = "../x.safetensors"; }),
               {"model.safetensors.index.json", "not a file in"});
  }
}

std::string corrupted(const std::function<void(Tensors&)>& edit_tensors,
                      const std::function<void(nlohmann::json&)>& edit_config, TempDir& tmp) {
  return hf_test::rewritten_fixture("hf_llama_tiny", edit_tensors, edit_config, tmp);
}

void expect_error(const std::string& dir, const std::vector<std::string>& needles) {
  hf_test::expect_one_line_error([&] { load_hf_llama(dir); }, needles);
}

TEST(HfLlama, BadInputIsOneLineErrorNamingTheProblem) {
  const std::string k1 = "model.layers.1.self_attn.k_proj.weight";
  {
    TempDir t("llama_missing");
    expect_error(corrupted([&](Tensors& ts) { ts.erase(k1); }, nullptr, t),
                 {"model.safetensors", "missing tensor " + k1});
  }
  {
    TempDir t("llama_shape");  // k_proj as wide as q_proj: num_key_value_heads says otherwise
    expect_error(corrupted([&](Tensors& ts) { ts.find(k1)->shape = {64, 16}; }, nullptr, t),
                 {k1, "[64, 16]", "config.json implies [32, 32]"});
  }
  {
    TempDir t("llama_layers");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["num_hidden_layers"] = 1; }, t),
                 {"unexpected tensor model.layers.1.", "num_hidden_layers 1"});
  }
  {
    TempDir t("llama_kv");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["num_key_value_heads"] = 3; }, t),
                 {"config.json", "num_key_value_heads 3 does not divide num_attention_heads 4"});
  }
  {
    TempDir t("llama_kv_shapes");  // one key per head: k_proj would be [64, 32]
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["num_key_value_heads"] = 4; }, t),
                 {"self_attn.k_proj.weight has shape [32, 32]", "config.json implies [64, 32]"});
  }
  {
    TempDir t("llama_scaling");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}}; },
                           t),
                 {"config.json", "rope_scaling", "dynamic", "none, linear, llama3 or yarn"});
  }
  {
    TempDir t("llama_scaling_factor");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", -2.0}}; },
                           t),
                 {"config.json rope_scaling", "factor must be a positive number"});
  }
  {
    TempDir t("llama_llama3_incomplete");  // llama3 needs all four values
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; },
                           t),
                 {"config.json", "rope_scaling llama3 has no low_freq_factor"});
  }
  {
    TempDir t("llama_bias");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["attention_bias"] = true; }, t),
                 {"config.json", "attention_bias"});
  }
  {
    TempDir t("smollm3_entry");
    expect_error(hf_test::rewritten_fixture("hf_smollm3_tiny", nullptr,
                                            [](nlohmann::json& j) { j["no_rope_layers"] = {1, 1, 2, 0}; }, t),
                 {"config.json", "no_rope_layers entry 2 is not 0 (NoPE) or 1 (rotary)"});
  }
  {
    TempDir t("smollm3_short");
    expect_error(hf_test::rewritten_fixture("hf_smollm3_tiny", nullptr,
                                            [](nlohmann::json& j) { j["no_rope_layers"] = {1, 1, 1}; }, t),
                 {"config.json", "no_rope_layers is not a list of at least 4 entries"});
  }
  {
    TempDir t("smollm3_window");
    expect_error(hf_test::rewritten_fixture("hf_smollm3_tiny", nullptr,
                                            [](nlohmann::json& j) {
                                              j["use_sliding_window"] = true;
                                              j["sliding_window"] = 8;
                                            },
                                            t),
                 {"config.json", "use_sliding_window true is not supported"});
  }
  {
    TempDir t("qwen2_sliding");  // max_window_layers 2 of 2 layers: no layer has the window
    const std::string dir = hf_test::rewritten_fixture("hf_qwen2_tiny", nullptr,
                                                       [](nlohmann::json& j) { j["use_sliding_window"] = true; }, t);
    EXPECT_EQ(load_hf_llama(dir).model->config().window_size, -1);
  }
  {
    TempDir t("qwen2_sliding_zero");
    expect_error(hf_test::rewritten_fixture("hf_qwen2_tiny_swa", nullptr,
                                            [](nlohmann::json& j) { j["sliding_window"] = 0; }, t),
                 {"config.json", "sliding_window must be a positive integer, got 0"});
  }
  {
    TempDir t("qwen2_layer_types");
    expect_error(hf_test::rewritten_fixture("hf_qwen2_tiny_swa", nullptr,
                                            [](nlohmann::json& j) { j["layer_types"] = {"chunked_attention", "full_attention"}; },
                                            t),
                 {"config.json", "layer_types entry \"chunked_attention\" is not supported"});
  }
  {
    TempDir t("mistral_sliding");  // Mistral 7B v0.1: a 4096-token window in a 32768-token context
    const std::string dir =
        hf_test::rewritten_fixture("hf_mistral_tiny", nullptr, [](nlohmann::json& j) { j["sliding_window"] = 16; }, t);
    EXPECT_EQ(load_hf_llama(dir).model->config().window_size, 15);
  }
  {
    TempDir t("mistral_window_wide");  // a window as wide as the context is no window
    const std::string dir =
        hf_test::rewritten_fixture("hf_mistral_tiny", nullptr, [](nlohmann::json& j) { j["sliding_window"] = 64; }, t);
    EXPECT_EQ(load_hf_llama(dir).model->config().num_query_groups, 1);
    EXPECT_EQ(load_hf_llama(dir).model->config().window_size, -1);
  }
  {
    TempDir t("qwen3_moe_unnormalized");  // weights = the softmax over every expert, not renormalized
    const std::string dir = hf_test::rewritten_fixture("hf_qwen3_moe_tiny", nullptr,
                                                       [](nlohmann::json& j) { j["norm_topk_prob"] = false; }, t);
    EXPECT_TRUE(load_hf_llama(dir).model->config().moe_router_pre_softmax);
    EXPECT_FALSE(load_hf_llama(fixture("hf_qwen3_moe_tiny")).model->config().moe_router_pre_softmax);
  }
  {
    TempDir t("qwen3_moe_dense_layers");  // layer 1 dense: its experts are not its tensors
    expect_error(hf_test::rewritten_fixture("hf_qwen3_moe_tiny", nullptr,
                                            [](nlohmann::json& j) { j["mlp_only_layers"] = {1}; }, t),
                 {"model.safetensors", "missing tensor model.layers.1.mlp."});
  }
  {
    TempDir t("qwen2_moe_no_shared_expert");
    expect_error(hf_test::rewritten_fixture("hf_qwen2_moe_tiny", nullptr,
                                            [](nlohmann::json& j) { j.erase("shared_expert_intermediate_size"); }, t),
                 {"config.json", "shared_expert_intermediate_size"});
  }
  {
    TempDir t("deepseek_sigmoid");  // DeepSeek-V3's scoring (with MLA: another model)
    expect_error(hf_test::rewritten_fixture("hf_deepseek_moe_tiny", nullptr,
                                            [](nlohmann::json& j) { j["scoring_func"] = "sigmoid"; }, t),
                 {"config.json", "scoring_func \"sigmoid\" is not supported"});
  }
  {
    TempDir t("qwen3_moe_dense_layer_range");
    expect_error(hf_test::rewritten_fixture("hf_qwen3_moe_tiny", nullptr,
                                            [](nlohmann::json& j) { j["mlp_only_layers"] = {7}; }, t),
                 {"config.json", "mlp_only_layers entry 7 is not a layer in [0, 2)"});
  }
  {
    TempDir t("qwen3_moe_sparse_step");
    expect_error(hf_test::rewritten_fixture("hf_qwen3_moe_tiny", nullptr,
                                            [](nlohmann::json& j) { j["decoder_sparse_step"] = 0; }, t),
                 {"config.json", "decoder_sparse_step must be a positive integer, got 0"});
  }
  {
    TempDir t("mixtral_no_expert");
    const std::string w2 = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
    expect_error(hf_test::rewritten_fixture("hf_mixtral_tiny", [&](Tensors& ts) { ts.erase(w2); }, nullptr, t),
                 {"model.safetensors", "missing tensor " + w2});
  }
  {
    TempDir t("qwen3_sliding");  // use_sliding_window without a window size
    expect_error(hf_test::rewritten_fixture("hf_qwen3_tiny", nullptr,
                                            [](nlohmann::json& j) { j["use_sliding_window"] = true; }, t),
                 {"config.json", "sliding_window"});
  }
  {
    TempDir t("qwen3_bias");
    expect_error(hf_test::rewritten_fixture("hf_qwen3_tiny", nullptr,
                                            [](nlohmann::json& j) { j["attention_bias"] = true; }, t),
                 {"config.json", "attention_bias", "o_proj"});
  }
  {
    TempDir t("qwen3_no_norm");
    const std::string k1 = "model.layers.1.self_attn.k_norm.weight";
    expect_error(hf_test::rewritten_fixture("hf_qwen3_tiny", [&](Tensors& ts) { ts.erase(k1); }, nullptr, t),
                 {"model.safetensors", "missing tensor " + k1});
  }
  {
    TempDir t("qwen3_norm_shape");  // q_norm over the whole projection (OLMo 2's form), not a head
    const std::string q0 = "model.layers.0.self_attn.q_norm.weight";
    expect_error(hf_test::rewritten_fixture("hf_qwen3_tiny",
                                            [&](Tensors& ts) {
                                              auto it = ts.find(q0);
                                              it->shape = {64};
                                              it->bytes.resize(64 * 4);
                                            },
                                            nullptr, t),
                 {"model.safetensors", q0, "[64]", "[16]"});
  }
  {
    TempDir t("qwen2_no_bias");
    const std::string q0 = "model.layers.0.self_attn.q_proj.bias";
    expect_error(hf_test::rewritten_fixture("hf_qwen2_tiny", [&](Tensors& ts) { ts.erase(q0); }, nullptr, t),
                 {"model.safetensors", "missing tensor " + q0});
  }
  {
    TempDir t("llama_act");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, t),
                 {"config.json", "hidden_act", "gelu"});
  }
  {
    TempDir t("llama_theta");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["rope_theta"] = -1; }, t),
                 {"config.json", "rope_theta must be a positive number"});
  }
  {
    TempDir t("llama_no_key");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j.erase("intermediate_size"); }, t),
                 {"config.json", "missing intermediate_size"});
  }
  {
    TempDir t("llama_tied_head");  // tied, but the stored lm_head is not embed_tokens
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["tie_word_embeddings"] = true; }, t),
                 {"lm_head.weight differs from model.embed_tokens.weight"});
  }
  {
    TempDir t("llama_dtype");
    expect_error(corrupted([](Tensors& ts) { ts.find("model.norm.weight")->dtype = "I32"; }, nullptr, t),
                 {"model.norm.weight", "I32"});
  }
  {
    TempDir t("llama_not_llama");
    expect_error(corrupted(nullptr, [](nlohmann::json& j) { j["model_type"] = "gemma"; }, t),
                 {"config.json", "not a Llama, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Mistral, Mixtral, DeepSeek-MoE, SmolLM3 or Phi-3 config",
                  "gemma"});
  }
}

}  // namespace
}  // namespace lattice
