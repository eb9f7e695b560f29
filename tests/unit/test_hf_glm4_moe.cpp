// HuggingFace GLM-4.5 <-> lattice: logits against independent HF-layout models
// (tests/fixtures/make_hf_glm4_moe_fixture.py: GLM-4.5's form with q/k norms, q/k/v biases, half of each
// head rotated, sigmoid routing with the choice's bias and routed_scaling_factor 2.5, a shared expert, a
// dense first layer and the multi-token prediction layer; GLM-4.5-Air's without q/k norms, whose
// config.json counts a prediction layer its file does not hold), the main and the depth's losses, the round
// trips in both directions, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "checkpoint/hf_deepseek_mla.h"
#include "checkpoint/hf_glm4_moe.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::expect_same_tensors;
using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

// Loading dir fails with one line that contains `needle`.
void expect_load_error(const std::string& dir, const std::string& needle) {
  hf_test::expect_one_line_error([&] { load_hf_glm4_moe(dir); }, {needle});
}

TEST(HfGlm4Moe, Glm45MatchesIndependentLogitsAndLosses) {
  const char* dir = "hf_glm4_moe_tiny";
  HfModel hf = load_hf_glm4_moe(fixture(dir));
  GPTModel& m = *hf.model;
  hf_test::expect_fixture_logits(m, dir);
  const TransformerConfig& c = m.config();
  EXPECT_TRUE(c.add_qkv_bias && !c.add_bias_linear && c.qk_layernorm && c.rmsnorm() && c.swiglu);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 16);  // head_dim: the attention 64 wide, hidden 32
  EXPECT_EQ(c.rotary_percent, 0.5);
  EXPECT_EQ(c.rotary_base, 1e6f);
  EXPECT_TRUE(c.moe_router_sigmoid() && c.moe_router_enable_expert_bias && !c.moe_router_pre_softmax);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 2.5f);
  EXPECT_EQ(c.moe_router_num_groups, 0);  // n_group 1
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 12);
  EXPECT_FALSE(c.moe_layer(0));
  EXPECT_TRUE(c.moe_layer(1) && c.moe_layer(2));
  EXPECT_EQ(c.mtp_num_layers, 1);
  EXPECT_EQ(hf_glm4_moe_mismatch(c), "");
  // The prediction layer is lattice's depth: the main and the depth's losses of one micro-batch.
  hf_test::expect_fixture_losses(m, dir, "mtp_tokens");
}

// GLM-4.5-Air's form; its config.json counts a prediction layer (as transformers keeps the count when it saves
// a model without one) that the file does not hold: the model has none, and the export counts none.
TEST(HfGlm4Moe, AirMatchesIndependentLogitsWithoutThePredictionLayer) {
  const char* dir = "hf_glm4_moe_air_tiny";
  HfModel hf = load_hf_glm4_moe(fixture(dir));
  hf_test::expect_fixture_logits(*hf.model, dir);
  const TransformerConfig& c = hf.model->config();
  EXPECT_FALSE(c.qk_layernorm);
  EXPECT_TRUE(c.add_qkv_bias);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 1.0f);
  EXPECT_EQ(c.mtp_num_layers, 0);
  TempDir out("glm_air_rt");
  save_hf_glm4_moe(out.str() + "/hf", *hf.model, "");
  expect_same_tensors(dir, out.str() + "/hf");
  std::ifstream in(out.str() + "/hf/config.json");
  EXPECT_EQ(nlohmann::json::parse(in)["num_nextn_predict_layers"], 0);
}

TEST(HfGlm4Moe, HfToLatticeToHfIsIdentity) {
  const char* dir = "hf_glm4_moe_tiny";
  TempDir out("glm_rt");
  HfModel hf = load_hf_glm4_moe(fixture(dir));
  save_hf_glm4_moe(out.str() + "/hf", *hf.model, "");
  expect_same_tensors(dir, out.str() + "/hf");
  std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
  const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
  for (const char* key :
       {"model_type", "architectures", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "attention_bias", "use_qk_norm",
        "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "first_k_dense_replace",
        "n_group", "topk_group", "norm_topk_prob", "tie_word_embeddings", "num_nextn_predict_layers", "rope_scaling"})
    EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << "config.json " << key;
  for (const char* key : {"routed_scaling_factor", "rope_theta", "rms_norm_eps", "partial_rotary_factor"})
    EXPECT_EQ(ja[key].get<double>(), jb[key].get<double>()) << "config.json " << key;
  HfModel again = load_hf_glm4_moe(out.str() + "/hf");  // and back: the same logits
  hf_test::expect_fixture_logits(*again.model, dir);
  EXPECT_EQ(again.model->config().mtp_num_layers, 1);
}

// A GLM-4.5-form lattice model with every parameter random (the expert biases too) out to HF and back: every
// real parameter's bits and the logits kept.
TEST(HfGlm4Moe, LatticeToHfToLatticeKeepsEveryParameter) {
  HfModel base = load_hf_glm4_moe(fixture("hf_glm4_moe_tiny"));
  GPTModel& m = *base.model;
  hf_test::randomize_parameters(m, 7, true);
  TempDir out("glm_lattice_rt");
  save_hf_glm4_moe(out.str() + "/hf", m, "GPT2BPETokenizer");
  HfModel back = load_hf_glm4_moe(out.str() + "/hf");
  EXPECT_EQ(back.tokenizer_type, "GPT2BPETokenizer");
  hf_test::expect_same_model(m, *back.model);
}

// transformers 5 saves a GLM-4.5 (and DeepSeek-V3, Kimi-K2, GLM-4.7-Flash) model's routed experts fused: 3-D
// gate_up_proj and down_proj per layer. They load as the per-expert tensors do; export writes the Hub's per-expert
// form.
TEST(HfGlm4Moe, FusedExpertsLoadAsPerExpertOnes) {
  for (const char* dir : {"hf_glm4_moe_tiny", "hf_deepseek_v3_tiny", "hf_glm4_moe_lite_tiny"}) {
    SCOPED_TRACE(dir);
    int fused = 0;
    TempDir t(std::string("fused_") + dir);
    const std::string path =
        hf_test::rewritten_fixture(dir, [&](Tensors& ts) { fused = hf_test::fuse_experts(ts); }, nullptr, t);
    EXPECT_GE(fused, 2);  // layers 1, 2 (and the prediction layer 3 where there is one)
    HfModel hf = std::string(dir) == "hf_glm4_moe_tiny" ? load_hf_glm4_moe(path) : load_hf_deepseek_mla(path);
    hf_test::expect_fixture_logits(*hf.model, dir);
    TempDir out(std::string("fused_out_") + dir);
    if (std::string(dir) == "hf_glm4_moe_tiny") {
      save_hf_glm4_moe(out.str() + "/hf", *hf.model, "");
      const SafetensorsFile written = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
      EXPECT_TRUE(written.has("model.layers.1.mlp.experts.7.down_proj.weight"));
      EXPECT_FALSE(written.has("model.layers.1.mlp.experts.gate_up_proj"));
    }
  }
  TempDir bad("fused_bad");  // a fused tensor of the wrong shape is named
  expect_load_error(hf_test::rewritten_fixture("hf_glm4_moe_tiny",
                                               [](Tensors& ts) {
                                                 hf_test::fuse_experts(ts);
                                                 ts.find("model.layers.2.mlp.experts.down_proj")->shape = {8, 12, 32};
                                               },
                                               nullptr, bad),
                    "model.layers.2.mlp.experts.down_proj has shape");
}

// DeepSeek-V3-style copies of the embedding and lm_head inside the prediction layer are accepted when they
// are the model's (and not written back), refused naming both tensors when they differ.
TEST(HfGlm4Moe, PredictionLayerCopiesMustBeTheModels) {
  const char* dir = "hf_glm4_moe_tiny";
  auto add_copies = [](bool differ) {
    return [differ](Tensors& t) {
      SafeTensor embed = *t.find("model.embed_tokens.weight"), head = *t.find("lm_head.weight");
      if (differ) head.bytes[0] ^= 1;
      t.list.push_back({"model.layers.3.embed_tokens.weight", embed});
      t.list.push_back({"model.layers.3.shared_head.head.weight", head});
    };
  };
  TempDir same("glm_copies");
  const std::string with = hf_test::rewritten_fixture(dir, add_copies(false), nullptr, same);
  HfModel hf = load_hf_glm4_moe(with);
  hf_test::expect_fixture_logits(*hf.model, dir);
  TempDir bad("glm_copies_bad");
  expect_load_error(hf_test::rewritten_fixture(dir, add_copies(true), nullptr, bad),
                    "model.layers.3.shared_head.head.weight differs from lm_head.weight");
}

TEST(HfGlm4Moe, BadInputIsOneLineErrorNamingTheProblem) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"norm", [](nlohmann::json& j) { j["norm_topk_prob"] = false; }, "norm_topk_prob false"},
      {"act", [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, "hidden_act \"gelu\" is not supported"},
      {"rope scaling", [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2}}; },
       "rope_scaling {\"factor\":2,\"rope_type\":\"linear\"} is not supported"},
      {"partial", [](nlohmann::json& j) { j["partial_rotary_factor"] = 1.5; }, "partial_rotary_factor 1.5 exceeds 1"},
      {"kv heads", [](nlohmann::json& j) { j["num_key_value_heads"] = 3; }, "num_key_value_heads 3 does not divide"},
      {"moe freq", [](nlohmann::json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq 2 is not supported"},
      {"first dense", [](nlohmann::json& j) { j["first_k_dense_replace"] = 9; }, "first_k_dense_replace 9 is not in"},
      {"groups", [](nlohmann::json& j) { j["n_group"] = 4; j["topk_group"] = 1; },
       "num_experts_per_tok 4 is not 2 x topk_group 1"},
      {"nextn", [](nlohmann::json& j) { j["num_nextn_predict_layers"] = -1; }, "num_nextn_predict_layers -1 is not"},
      {"prediction layer unannounced", [](nlohmann::json& j) { j["num_nextn_predict_layers"] = 0; },
       "unexpected tensor model.layers.3."},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    TempDir t(std::string("glm_bad_") + k.name);
    expect_load_error(hf_test::rewritten_fixture("hf_glm4_moe_tiny", nullptr, k.edit, t), k.expect);
  }
  TempDir missing("glm_missing");
  expect_load_error(hf_test::rewritten_fixture("hf_glm4_moe_tiny",
                                               [](Tensors& t) { t.erase("model.layers.1.self_attn.k_proj.bias"); },
                                               nullptr, missing),
                    "missing tensor model.layers.1.self_attn.k_proj.bias");
}

// A lattice model without GLM-4.5's form says why, before anything is written.
TEST(HfGlm4Moe, ModelsWithoutTheFormAreNamed) {
  const TransformerConfig glm = load_hf_glm4_moe(fixture("hf_glm4_moe_tiny")).model->config();
  auto reason = [&](const std::function<void(TransformerConfig&)>& edit) {
    TransformerConfig c = glm;
    edit(c);
    return hf_glm4_moe_mismatch(c);
  };
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_router_score_function = "softmax"; }).find("a router other than"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_router_enable_expert_bias = false; }).find("a router other than"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.add_bias_linear = true; }).find("linear biases"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.normalization = "LayerNorm"; }).find("LayerNorm"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.rotary_interleaved = true; }).find("--rotary-interleaved"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_layer_pattern = {1, 0, 1}; }).find("dense layer after an MoE"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.moe_shared_expert_intermediate_size = 0; }).find("shared experts"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.num_experts = 0; }).find("no mixture of experts"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.window_size = 4; }).find("sliding-window"), std::string::npos);
}

}  // namespace
}  // namespace lattice
