// HuggingFace DeepSeek-V3 and V2 <-> lattice: logits against independent HF-layout models
// (tests/fixtures/make_hf_llama_fixture.py: DeepSeek-V3 with a query latent and YaRN's mscale_all_dim,
// grouped sigmoid routing with the choice's bias, a dense first layer; DeepSeek-V3 with linear_q_proj,
// values wider than the queries, every layer MoE; DeepSeek-V2-Lite's form: linear_q_proj, YaRN with
// mscale 0.707, the softmax router unnormalized and scaled), the round trips in both directions, the
// multi-token prediction layers a file may carry, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "checkpoint/hf_deepseek_mla.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

// Loading dir fails with one line that contains `needle`.
void expect_load_error(const std::string& dir, const std::string& needle) {
  hf_test::expect_one_line_error([&] { load_hf_deepseek_mla(dir); }, {needle});
}

TEST(HfDeepseekV3, QueryLatentYarnGroupsMatchIndependentLogits) {
  HfModel hf = load_hf_deepseek_mla(fixture("hf_deepseek_v3_tiny"));
  hf_test::expect_fixture_logits(*hf.model, "hf_deepseek_v3_tiny");
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.multi_latent_attention && c.mla_latent_norms() && c.yarn() && c.moe_router_sigmoid() &&
              c.moe_router_enable_expert_bias);
  EXPECT_EQ(c.q_lora_rank, 24);
  EXPECT_EQ(c.kv_lora_rank, 16);
  EXPECT_EQ(c.kv_channels, 12);  // max(Dq 8 + 4, Dv 8)
  EXPECT_EQ(c.yarn_mscale_all_dim, 1.0f);
  EXPECT_EQ(c.moe_router_num_groups, 4);
  EXPECT_EQ(c.moe_router_group_topk, 2);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 2.5f);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 12);
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1) && c.moe_layer(2));
}

TEST(HfDeepseekV3, LinearQProjWideValuesMatchIndependentLogits) {
  HfModel hf = load_hf_deepseek_mla(fixture("hf_deepseek_v3_tiny_noq"));
  hf_test::expect_fixture_logits(*hf.model, "hf_deepseek_v3_tiny_noq");
  const TransformerConfig& c = hf.model->config();
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.kv_channels, 16);  // max(Dq 12, Dv 16)
  EXPECT_EQ(c.moe_router_num_groups, 0);
  EXPECT_FALSE(c.yarn());
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 24);
}

TEST(HfDeepseekV2, LiteModelMatchesIndependentLogits) {
  HfModel hf = load_hf_deepseek_mla(fixture("hf_deepseek_v2_lite_tiny"));
  hf_test::expect_fixture_logits(*hf.model, "hf_deepseek_v2_lite_tiny");
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.multi_latent_attention && c.yarn() && !c.moe_router_sigmoid() && !c.moe_router_enable_expert_bias);
  EXPECT_TRUE(c.moe_router_pre_softmax);  // norm_topk_prob false
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 1.5f);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FLOAT_EQ(c.yarn_mscale_all_dim, 0.707f);
  EXPECT_STREQ(hf_deepseek_family_name(c), "DeepSeek-V2");
}

TEST(HfDeepseekV3, HfToLatticeToHfIsIdentity) {
  for (const char* dir : {"hf_deepseek_v3_tiny", "hf_deepseek_v3_tiny_noq", "hf_deepseek_v2_lite_tiny"}) {
    SCOPED_TRACE(dir);
    TempDir out(std::string("ds3_rt_") + dir);
    HfModel hf = load_hf_deepseek_mla(fixture(dir));
    save_hf_deepseek_mla(out.str() + "/hf", *hf.model, "");
    SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
    SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
    EXPECT_EQ(a.names().size(), b.names().size());
    for (const std::string& name : a.names()) {
      ASSERT_TRUE(b.has(name)) << name;
      EXPECT_EQ(a.get(name).shape, b.get(name).shape) << name;
      EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
    }
    std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
    const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
    for (const char* key :
         {"model_type", "architectures", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "vocab_size", "max_position_embeddings", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
          "qk_rope_head_dim", "qk_head_dim", "v_head_dim", "head_dim", "n_routed_experts", "n_shared_experts",
          "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace", "n_group", "topk_group",
          "norm_topk_prob", "scoring_func", "topk_method", "tie_word_embeddings", "rope_interleave", "moe_layer_freq"})
      EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << "config.json " << key;
    for (const char* key : {"routed_scaling_factor", "rope_theta", "rms_norm_eps"})
      EXPECT_EQ(ja[key].get<double>(), jb[key].get<double>()) << "config.json " << key;
    EXPECT_EQ(ja["rope_scaling"].is_null(), jb["rope_scaling"].is_null());
    if (!ja["rope_scaling"].is_null())
      for (const char* key : {"type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                              "mscale_all_dim"})
        EXPECT_EQ(ja["rope_scaling"][key], jb["rope_scaling"][key]) << "rope_scaling " << key;
    // and back: the same logits
    HfModel again = load_hf_deepseek_mla(out.str() + "/hf");
    hf_test::expect_fixture_logits(*again.model, dir);
  }
}

// A DeepSeek-V3-form lattice model with every parameter random (the expert biases too) out to HF and
// back: every real parameter's bits and the logits kept.
TEST(HfDeepseekV3, LatticeToHfToLatticeKeepsEveryParameter) {
  HfModel base = load_hf_deepseek_mla(fixture("hf_deepseek_v3_tiny"));
  GPTModel& m = *base.model;
  hf_test::randomize_parameters(m, 5, true);
  TempDir out("ds3_lattice_rt");
  save_hf_deepseek_mla(out.str() + "/hf", m, "GPT2BPETokenizer");
  HfModel back = load_hf_deepseek_mla(out.str() + "/hf");
  EXPECT_EQ(back.tokenizer_type, "GPT2BPETokenizer");
  hf_test::expect_same_model(m, *back.model);
}

// DeepSeek-V3's multi-token prediction module (num_nextn_predict_layers 1: layer 3's enorm, hnorm, eh_proj,
// decoder layer and shared_head) is lattice's prediction depth: the main logits, the main loss and the depth's
// loss of a micro-batch as the independent reference computes them; the module's copies of the embedding and
// lm_head must be the model's; out and back bit for bit.
TEST(HfDeepseekV3, MultiTokenPredictionModuleIsThePredictionDepth) {
  const char* dir = "hf_deepseek_v3_tiny_mtp";
  HfModel hf = load_hf_deepseek_mla(fixture(dir));
  GPTModel& m = *hf.model;
  EXPECT_EQ(m.config().mtp_num_layers, 1);
  hf_test::expect_fixture_logits(m, dir);
  hf_test::expect_fixture_losses(m, dir, "mtp_tokens");
  TempDir out("ds3_mtp_rt");
  save_hf_deepseek_mla(out.str() + "/hf", m, "");
  SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
  EXPECT_EQ(a.names().size(), b.names().size());
  for (const std::string& name : a.names()) {
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
  }
  TempDir bad("ds3_mtp_copy");
  const std::string edited = hf_test::rewritten_fixture(
      dir, [](Tensors& t) { t.find("model.layers.3.embed_tokens.weight")->bytes[0] ^= 1; }, nullptr, bad);
  expect_load_error(edited, "model.layers.3.embed_tokens.weight differs from model.embed_tokens.weight");
  TempDir without("ds3_no_nextn");  // the module's tensors with num_nextn_predict_layers 0: not this model
  const std::string none = hf_test::rewritten_fixture(
      dir, nullptr, [](nlohmann::json& j) { j["num_nextn_predict_layers"] = 0; }, without);
  expect_load_error(none, "unexpected tensor model.layers.3.");
  // num_nextn_predict_layers 1 without the module's tensors (transformers' save_pretrained writes none): the
  // main model alone; the module half there is a missing tensor.
  TempDir saved("ds3_hf_saved");
  const std::string main_only = hf_test::rewritten_fixture(
      dir, [](Tensors& t) { std::erase_if(t.list, [](const auto& e) { return e.first.starts_with("model.layers.3."); }); },
      nullptr, saved);
  HfModel plain = load_hf_deepseek_mla(main_only);
  EXPECT_EQ(plain.model->config().mtp_num_layers, 0);
  hf_test::expect_fixture_logits(*plain.model, dir);
  TempDir half("ds3_half_module");
  expect_load_error(hf_test::rewritten_fixture(dir, [](Tensors& t) { t.erase("model.layers.3.hnorm.weight"); },
                                               nullptr, half),
                    "missing tensor model.layers.3.hnorm.weight");
}

// Kimi-K2 ships DeepSeek-V3's architecture and config under model_type kimi_k2: read as DeepSeek-V3, written
// back as kimi_k2 when asked (--hf-model-type; convert asks when the checkpoint came from Kimi-K2), with the
// same tensors; a softmax-routed model has no such form.
TEST(HfDeepseekV3, KimiK2IsDeepSeekV3UnderItsOwnModelType) {
  TempDir kimi("kimi_k2");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_deepseek_v3_tiny", nullptr, [](nlohmann::json& j) { j["model_type"] = "kimi_k2"; }, kimi);
  std::ifstream in(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_TRUE(is_hf_deepseek_mla_config(config));
  EXPECT_EQ(hf_deepseek_family_name(config), "Kimi-K2");
  HfModel hf = load_hf_deepseek_mla(dir);
  hf_test::expect_fixture_logits(*hf.model, "hf_deepseek_v3_tiny");
  TempDir out("kimi_k2_out");
  hf::ExportOptions options;
  options.model_type = "kimi_k2";
  save_hf_deepseek_mla(out.str() + "/hf", *hf.model, "", options);
  std::ifstream written(out.str() + "/hf/config.json");
  const nlohmann::json j = nlohmann::json::parse(written);
  EXPECT_EQ(j["model_type"], "kimi_k2");
  EXPECT_EQ(j["architectures"][0], "DeepseekV3ForCausalLM");
  SafetensorsFile a = SafetensorsFile::read(fixture("hf_deepseek_v3_tiny") + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
  EXPECT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name;
  HfModel v2 = load_hf_deepseek_mla(fixture("hf_deepseek_v2_lite_tiny"));
  EXPECT_EQ(hf_deepseek_model_type(v2.model->config(), ""), "deepseek_v2");
  hf_test::expect_one_line_error([&] { hf_deepseek_model_type(v2.model->config(), "kimi_k2"); },
                                 {"--hf-model-type kimi_k2", "deepseek_v2"});
}

// GLM-4.7-Flash (glm4_moe_lite) is DeepSeek-V3's attention and experts with GLM's config: mlp_layer_types,
// rope_parameters, rms_norm_eps 1e-5 for the model's norms while the latents keep 1e-6 (the fixture's latents are
// small enough that the other epsilon moves its logits by 0.028), its prediction layer without copies.
TEST(HfGlm4MoeLite, MatchesIndependentLogitsAndLossesAndRoundTrips) {
  const char* dir = "hf_glm4_moe_lite_tiny";
  HfModel hf = load_hf_deepseek_mla(fixture(dir));
  GPTModel& m = *hf.model;
  hf_test::expect_fixture_logits(m, dir);
  const TransformerConfig& c = m.config();
  EXPECT_EQ(c.layernorm_epsilon, 1e-5f);
  EXPECT_EQ(c.mla_latent_eps(), 1e-6f);
  EXPECT_EQ(c.rotary_base, 1e6f);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 1.8f);
  EXPECT_TRUE(!c.moe_layer(0) && c.moe_layer(1) && c.moe_layer(2));
  EXPECT_EQ(c.mtp_num_layers, 1);
  hf_test::expect_fixture_losses(m, dir, "mtp_tokens");
  TempDir out("glm_lite_rt");
  hf::ExportOptions options;
  options.model_type = "glm4_moe_lite";
  save_hf_deepseek_mla(out.str() + "/hf", m, "", options);
  SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
  EXPECT_EQ(a.names(), b.names());  // no copies written
  for (const std::string& name : a.names()) EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name;
  std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
  const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
  for (const char* key : {"model_type", "architectures", "mlp_layer_types", "num_nextn_predict_layers", "q_lora_rank",
                          "kv_lora_rank", "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_group"})
    EXPECT_EQ(ja[key], jb[key]) << "config.json " << key;
  for (const char* key : {"rms_norm_eps", "routed_scaling_factor"})
    EXPECT_EQ(ja[key].get<double>(), jb[key].get<double>()) << "config.json " << key;
  EXPECT_EQ(ja["rope_parameters"]["rope_theta"].get<double>(), jb["rope_parameters"]["rope_theta"].get<double>());
  HfModel again = load_hf_deepseek_mla(out.str() + "/hf");
  hf_test::expect_fixture_logits(*again.model, dir);
  TransformerConfig other = c;  // the latents normalized with another epsilon: no HF DeepSeek form
  other.mla_latent_norm_epsilon = 1e-5f;
  EXPECT_NE(hf_deepseek_mla_mismatch(other).find("--mla-latent-norm-epsilon"), std::string::npos);
  TempDir bad("glm_lite_types");
  expect_load_error(hf_test::rewritten_fixture(dir, nullptr,
                                               [](nlohmann::json& j) { j["mlp_layer_types"][1] = "moe"; }, bad),
                    "mlp_layer_types entry \"moe\" is not \"dense\" or \"sparse\"");
}

TEST(HfDeepseekV3, BadInputIsOneLineErrorNamingTheProblem) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"softmax", [](nlohmann::json& j) { j["scoring_func"] = "softmax"; }, "scoring_func \"softmax\" is not supported"},
      {"groups", [](nlohmann::json& j) { j["num_experts_per_tok"] = 2; }, "num_experts_per_tok 2 is not 2 x topk_group 2"},
      {"norm", [](nlohmann::json& j) { j["norm_topk_prob"] = false; }, "norm_topk_prob false"},
      {"kv heads", [](nlohmann::json& j) { j["num_key_value_heads"] = 2; }, "num_key_value_heads 2 is not num_attention_heads"},
      {"qk_head_dim", [](nlohmann::json& j) { j["qk_head_dim"] = 16; }, "qk_head_dim 16 is not qk_nope_head_dim + qk_rope_head_dim"},
      {"interleave", [](nlohmann::json& j) { j["rope_interleave"] = false; }, "rope_interleave false is not supported"},
      {"moe freq", [](nlohmann::json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq 2 is not supported"},
      {"attention factor", [](nlohmann::json& j) { j["rope_scaling"]["attention_factor"] = 1.2; },
       "attention_factor is not supported"},
      {"linear rope", [](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}}; },
       "rope_scaling {\"factor\":2,\"type\":\"linear\"} is not supported"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    TempDir t(std::string("ds3_bad_") + k.name);
    const std::string dir = hf_test::rewritten_fixture("hf_deepseek_v3_tiny", nullptr, k.edit, t);
    expect_load_error(dir, k.expect);
  }
  const Case v2_cases[] = {
      {"v2 sigmoid", [](nlohmann::json& j) { j["scoring_func"] = "sigmoid"; },
       "scoring_func \"sigmoid\" is not supported (softmax in deepseek_v2)"},
      {"v2 groups", [](nlohmann::json& j) { j["topk_method"] = "group_limited_greedy"; },
       "topk_method \"group_limited_greedy\" is not supported"},
      {"v2 normalized and scaled", [](nlohmann::json& j) { j["norm_topk_prob"] = true; },
       "norm_topk_prob true with routed_scaling_factor 1.5 is not supported"},
  };
  for (const Case& k : v2_cases) {
    SCOPED_TRACE(k.name);
    TempDir t(std::string("ds2_bad_") + k.name);
    const std::string dir = hf_test::rewritten_fixture("hf_deepseek_v2_lite_tiny", nullptr, k.edit, t);
    expect_load_error(dir, k.expect);
  }
  TempDir missing("ds3_missing");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_deepseek_v3_tiny", [](Tensors& t) { t.erase("model.layers.1.mlp.gate.e_score_correction_bias"); }, nullptr,
      missing);
  expect_load_error(dir, "missing tensor model.layers.1.mlp.gate.e_score_correction_bias");
}

// A lattice model without DeepSeek-V3's form says why, before anything is written.
TEST(HfDeepseekV3, ModelsWithoutTheFormAreNamed) {
  const TransformerConfig ds3 = load_hf_deepseek_mla(fixture("hf_deepseek_v3_tiny")).model->config();
  EXPECT_EQ(hf_deepseek_mla_mismatch(ds3), "");
  auto reason = [&](const std::function<void(TransformerConfig&)>& edit) {
    TransformerConfig c = ds3;
    edit(c);
    return hf_deepseek_mla_mismatch(c);
  };
  EXPECT_NE(reason([](TransformerConfig& c) { c.qk_layernorm = false; }).find("without --qk-layernorm"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_router_score_function = "softmax"; }).find("a router neither"),
            std::string::npos);
  TransformerConfig v2 = load_hf_deepseek_mla(fixture("hf_deepseek_v2_lite_tiny")).model->config();
  EXPECT_EQ(hf_deepseek_mla_mismatch(v2), "");
  v2.moe_router_pre_softmax = false;  // renormalized and scaled: ambiguous between DeepSeek-V2 versions
  EXPECT_NE(hf_deepseek_mla_mismatch(v2).find("--moe-router-topk-scaling-factor"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_layer_pattern = {1, 0, 1}; }).find("dense layer after an MoE layer"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.layernorm_epsilon = 1e-5f; }).find("--norm-epsilon"), std::string::npos);
  EXPECT_EQ(reason([](TransformerConfig& c) {  // the model's norms at 1e-5, the latents' at 1e-6: HF's form
              c.layernorm_epsilon = 1e-5f;
              c.mla_latent_norm_epsilon = 1e-6f;
            }),
            "");
  EXPECT_NE(reason([](TransformerConfig& c) { c.multi_latent_attention = false; }).find("no multi-latent attention"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
