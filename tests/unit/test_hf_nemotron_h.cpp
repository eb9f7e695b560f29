// HuggingFace Nemotron-H <-> lattice: logits against independent HF-layout models
// (tests/fixtures/make_hf_nemotron_h_fixture.py: Nemotron-H's form, Mamba-2, attention-only and squared-ReLU MLP
// layers, no position embedding, untied; and a tied one with three heads' groups), the round trips in both
// directions (the Hub's backbone. names and transformers 5's model. ones), Python's Infinity in config.json,
// and bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/hf_nemotron_h.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::expect_same_tensors;
using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

void expect_load_error(const std::string& dir, const std::string& needle) {
  hf_test::expect_one_line_error([&] { load_hf_nemotron_h(dir); }, {needle});
}

TEST(HfNemotronH, MatchesIndependentLogits) {
  for (const char* dir :
       {"hf_nemotron_h_tiny", "hf_nemotron_h_tiny_tied", "hf_nemotron_h_moe_tiny", "hf_nemotron_h_latent_moe_tiny"}) {
    SCOPED_TRACE(dir);
    HfModel hf = load_hf_nemotron_h(fixture(dir));
    hf_test::expect_fixture_logits(*hf.model, dir);
    // The loss of one micro-batch (inputs all but the last token, labels all but the first) and its backward.
    SafetensorsFile ref = SafetensorsFile::read(fixture(dir) + "/expected_logits.safetensors");
    const std::vector<int32_t> tokens = ref.get_i32("tokens");
    const double loss = hf.model->forward_backward(tokens.data(), nullptr, 1, int64_t(tokens.size()) - 1, 1.0f, {});
    EXPECT_NEAR(loss, ref.get_f32("main_loss")[0], 1e-5 * loss);
    const TransformerConfig& c = hf.model->config();
    EXPECT_TRUE(c.hybrid() && c.rmsnorm() && !c.add_bias_linear && c.gelu == GeluKind::squared_relu);
    EXPECT_EQ(c.position_embedding_type, "none");
    EXPECT_EQ(hf_nemotron_h_mismatch(c), "");
  }
  const TransformerConfig c = load_hf_nemotron_h(fixture("hf_nemotron_h_tiny")).model->config();
  EXPECT_EQ(c.hybrid_layer_pattern, "M-M*-");
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(c.mamba_heads(), 8);
  EXPECT_EQ(c.mamba_num_groups, 2);
  EXPECT_FALSE(load_hf_nemotron_h(fixture("hf_nemotron_h_tiny_tied")).model->config().untie_embeddings_and_output_weights);
  // Nemotron-3's MoE layers: DeepSeek-V3's router (sigmoid, the choice's bias, 2 groups of which 1 kept, gates
  // normalized x 2.5) over ungated relu2 experts and one shared expert, the E layers of the pattern.
  const TransformerConfig e = load_hf_nemotron_h(fixture("hf_nemotron_h_moe_tiny")).model->config();
  EXPECT_EQ(e.hybrid_layer_pattern, "ME*E");
  EXPECT_EQ(e.num_experts, 8);
  EXPECT_TRUE(e.moe_router_sigmoid() && e.moe_router_enable_expert_bias && !e.swiglu);
  EXPECT_EQ(e.moe_router_num_groups, 2);
  EXPECT_EQ(e.moe_router_topk_scaling_factor, 2.5f);
  EXPECT_EQ(e.moe_shared_expert_intermediate_size, 32);
  EXPECT_TRUE(e.moe_layer(1) && e.moe_layer(3) && !e.moe_layer(0) && !e.moe_layer(2));
  EXPECT_EQ(e.moe_latent_size, 0);
  // Nemotron-3-Super's LatentMoE: the routed experts in a latent space of 40 (--moe-latent-size).
  const TransformerConfig l = load_hf_nemotron_h(fixture("hf_nemotron_h_latent_moe_tiny")).model->config();
  EXPECT_EQ(l.moe_latent_size, 40);
  EXPECT_EQ(l.moe_expert_width(), 40);
  EXPECT_EQ(l.hybrid_layer_pattern, "E*ME");
}

// transformers 5 saves the routed experts fused (experts.up_proj [E, Fe, Ce], experts.down_proj [E, Ce, Fe]; Ce the
// hidden size, or the latent size): they load as the per-expert ones; export writes the Hub's per-expert form.
TEST(HfNemotronH, FusedExpertsLoadAsPerExpertOnes) {
  for (const auto& [dir, layers] : std::vector<std::pair<const char*, std::vector<int>>>{
           {"hf_nemotron_h_moe_tiny", {1, 3}}, {"hf_nemotron_h_latent_moe_tiny", {0, 3}}}) {
    SCOPED_TRACE(dir);
    TempDir t(std::string("nemotron_fused_") + dir);
    const std::vector<int> moe_layers = layers;
    const std::string path = hf_test::rewritten_fixture(
        dir,
        [&](Tensors& ts) {
          for (int l : moe_layers) {
            const std::string mx = "backbone.layers." + std::to_string(l) + ".mixer.experts.";
            for (const char* proj : {"up_proj", "down_proj"}) {
              SafeTensor fused = *ts.find(mx + "0." + proj + ".weight");
              fused.shape.insert(fused.shape.begin(), 8);
              std::vector<uint8_t> bytes;
              for (int e = 0; e < 8; ++e) {
                const std::string name = mx + std::to_string(e) + "." + proj + ".weight";
                const SafeTensor& one = *ts.find(name);
                bytes.insert(bytes.end(), one.bytes.begin(), one.bytes.end());
                ts.erase(name);
              }
              fused.bytes = std::move(bytes);
              ts.list.push_back({mx + proj, fused});
            }
          }
        },
        nullptr, t);
    HfModel hf = load_hf_nemotron_h(path);
    hf_test::expect_fixture_logits(*hf.model, dir);
    TempDir out(std::string("nemotron_fused_out_") + dir);
    save_hf_nemotron_h(out.str() + "/hf", *hf.model, "");
    expect_same_tensors(dir, out.str() + "/hf");
  }
}

TEST(HfNemotronH, HfToLatticeToHfIsIdentity) {
  for (const char* dir :
       {"hf_nemotron_h_tiny", "hf_nemotron_h_tiny_tied", "hf_nemotron_h_moe_tiny", "hf_nemotron_h_latent_moe_tiny"}) {
    SCOPED_TRACE(dir);
    TempDir out(std::string("nemotron_rt_") + dir);
    HfModel hf = load_hf_nemotron_h(fixture(dir));
    save_hf_nemotron_h(out.str() + "/hf", *hf.model, "");
    expect_same_tensors(dir, out.str() + "/hf");
    std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
    const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
    for (const char* key : {"model_type", "architectures", "hybrid_override_pattern", "num_hidden_layers", "hidden_size",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                            "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel",
                            "mlp_hidden_act", "tie_word_embeddings", "use_conv_bias", "use_bias", "moe_latent_size"})
      EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << "config.json " << key;
    EXPECT_EQ(ja["layer_norm_epsilon"].get<double>(), jb["layer_norm_epsilon"].get<double>());
    HfModel again = load_hf_nemotron_h(out.str() + "/hf");
    hf_test::expect_fixture_logits(*again.model, dir);
  }
}

// A Nemotron-H-form lattice model with every parameter random out to HF and back: every real parameter's bits
// and the logits kept.
TEST(HfNemotronH, LatticeToHfToLatticeKeepsEveryParameter) {
  HfModel base = load_hf_nemotron_h(fixture("hf_nemotron_h_tiny"));
  GPTModel& m = *base.model;
  hf_test::randomize_parameters(m, 7, true);
  TempDir out("nemotron_lattice_rt");
  save_hf_nemotron_h(out.str() + "/hf", m, "GPT2BPETokenizer");
  HfModel back = load_hf_nemotron_h(out.str() + "/hf");
  EXPECT_EQ(back.tokenizer_type, "GPT2BPETokenizer");
  hf_test::expect_same_model(m, *back.model);
}

// transformers 5 names the tensors model.* where the Hub's files have backbone.*; newer configs give
// layers_block_type for the pattern, and Python writes time_step_limit's infinity as Infinity: all read alike.
TEST(HfNemotronH, Transformers5NamesAndConfigsLoad) {
  TempDir t("nemotron_t5");
  const std::string path = hf_test::rewritten_fixture(
      "hf_nemotron_h_tiny",
      [](Tensors& ts) {
        for (auto& [name, tensor] : ts.list)
          if (name.rfind("backbone.", 0) == 0) name = "model." + name.substr(9);
      },
      [](nlohmann::json& j) {
        j.erase("hybrid_override_pattern");
        j["attention_head_dim"] = j["head_dim"];  // NVIDIA's remote-code name for it
        j.erase("head_dim");
        j["layers_block_type"] = {"mamba", "mlp", "linear_attention", "full_attention", "mlp"};
      },
      t);
  {  // time_step_limit [0.0, Infinity], as Python's json writes it
    std::ifstream in(path + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["time_step_limit"] = {0.0, 12345.0};
    std::string text = j.dump(2);
    text.replace(text.find("12345.0"), 7, "Infinity");
    std::ofstream(path + "/config.json") << text;
  }
  HfModel hf = load_hf_nemotron_h(path);
  EXPECT_EQ(hf.model->config().hybrid_layer_pattern, "M-M*-");
  hf_test::expect_fixture_logits(*hf.model, "hf_nemotron_h_tiny");
}

// Python's json writes float('inf') and float('nan') as bare Infinity and NaN: read as 1e308 and null, and
// left as they are inside strings.
TEST(HfNemotronH, PythonJsonNumbersBecomeStandard) {
  EXPECT_EQ(hf::python_json_numbers(R"({"a": [0.0, Infinity], "b": -Infinity, "c": NaN, "s": "Infinity \"NaN\""})"),
            R"({"a": [0.0, 1e308], "b": -1e308, "c": null, "s": "Infinity \"NaN\""})");
}

TEST(HfNemotronH, BadInputIsOneLineErrorNamingTheProblem) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"moe without experts", [](nlohmann::json& j) { j["hybrid_override_pattern"] = "M-E*-"; },
       "missing n_routed_experts"},
      {"pattern", [](nlohmann::json& j) { j["hybrid_override_pattern"] = "M-M*x"; }, "'x' at layer 4 is not M"},
      {"layers", [](nlohmann::json& j) { j["num_hidden_layers"] = 4; }, "num_hidden_layers 4 is not the 5 layers"},
      {"act", [](nlohmann::json& j) { j["mlp_hidden_act"] = "silu"; }, "mlp_hidden_act \"silu\" is not supported"},
      {"bias", [](nlohmann::json& j) { j["use_bias"] = true; }, "use_bias true is not supported"},
      {"conv", [](nlohmann::json& j) { j["conv_kernel"] = 3; }, "conv_kernel 3 is not supported"},
      {"dt limit", [](nlohmann::json& j) { j["time_step_limit"] = {0.0, 0.1}; }, "time_step_limit [0.0,0.1] clamps"},
      {"eps", [](nlohmann::json& j) { j["layer_norm_epsilon"] = 1e-6; }, "layer_norm_epsilon 1e-06 is not supported"},
      {"groups", [](nlohmann::json& j) { j["n_groups"] = 3; }, "--mamba-num-groups 3 does not divide the Mamba heads 8"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    TempDir t(std::string("nemotron_bad_") + k.name);
    expect_load_error(hf_test::rewritten_fixture("hf_nemotron_h_tiny", nullptr, k.edit, t), k.expect);
  }
  for (const auto& [name, edit, expect] : std::vector<std::tuple<const char*, std::function<void(nlohmann::json&)>, const char*>>{
           {"latent", [](nlohmann::json& j) { j["moe_latent_size"] = 16; },
            "tensor backbone.layers.1.mixer.experts.0.down_proj.weight has shape [64, 24], config.json implies [16, 24]"},
           {"shared", [](nlohmann::json& j) { j["n_shared_experts"] = 2; }, "n_shared_experts 2 is not supported"},
           {"groups", [](nlohmann::json& j) { j["topk_group"] = 2; j["n_group"] = 4; },
            "num_experts_per_tok 2 is not 2 x topk_group 2"}}) {
    SCOPED_TRACE(name);
    TempDir t(std::string("nemotron_bad_moe_") + name);
    expect_load_error(hf_test::rewritten_fixture("hf_nemotron_h_moe_tiny", nullptr, edit, t), expect);
  }
  TempDir missing("nemotron_missing");
  expect_load_error(hf_test::rewritten_fixture("hf_nemotron_h_tiny",
                                               [](Tensors& t) { t.erase("backbone.layers.2.mixer.D"); }, nullptr,
                                               missing),
                    "missing tensor backbone.layers.2.mixer.D");
  TempDir extra("nemotron_extra");  // a tied model's file with an lm_head, or any tensor config.json does not explain
  expect_load_error(hf_test::rewritten_fixture("hf_nemotron_h_tiny", nullptr,
                                               [](nlohmann::json& j) { j["tie_word_embeddings"] = true; }, extra),
                    "unexpected tensor lm_head.weight");
  TempDir shape("nemotron_shape");
  expect_load_error(hf_test::rewritten_fixture("hf_nemotron_h_tiny",
                                               [](Tensors& t) {
                                                 SafeTensor* b = t.find("backbone.layers.0.mixer.conv1d.bias");
                                                 b->shape = {9};
                                                 b->bytes.resize(9 * sizeof(float));
                                               },
                                               nullptr, shape),
                    "backbone.layers.0.mixer.conv1d.bias");
}

// Nemotron-3's multi-token prediction (hf_nemotron_h_mtp_tiny: hf_nemotron_h_moe_tiny's model with
// num_nextn_predict_layers 2 of mtp_hybrid_override_pattern "*E", the depths' blocks one flat list mtp.layers.0..3):
// lattice's hybrid depths "ME*E/*E/*E", each depth's loss as the reference computes it; out and back keeps every
// tensor; transformers 5's mtp_layers_block_type (or neither key: its default ["attention", "moe"]) reads alike; a
// file without the depths' tensors is the main model alone.
TEST(HfNemotronH, MultiTokenPredictionDepthsMatchIndependentLosses) {
  const char* dir = "hf_nemotron_h_mtp_tiny";
  HfModel hf = load_hf_nemotron_h(fixture(dir));
  GPTModel& m = *hf.model;
  const TransformerConfig& c = m.config();
  EXPECT_EQ(c.mtp_num_layers, 2);
  EXPECT_EQ(c.hybrid_override_pattern(), "ME*E/*E/*E");
  EXPECT_FALSE(c.mtp_use_repeated_layer);
  EXPECT_TRUE(c.moe_layer(c.num_layers) && c.moe_layer(c.num_layers + 1));
  hf_test::expect_fixture_logits(m, dir);
  hf_test::expect_fixture_losses(m, dir, "tokens");
  TempDir out("nemotron_mtp_rt");
  save_hf_nemotron_h(out.str() + "/hf", m, "");
  expect_same_tensors(dir, out.str() + "/hf");
  std::ifstream in(out.str() + "/hf/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.value("num_nextn_predict_layers", 0), 2);
  EXPECT_EQ(j.value("mtp_hybrid_override_pattern", ""), "*E");
  for (const auto& [name, edit] : std::vector<std::pair<const char*, std::function<void(nlohmann::json&)>>>{
           {"list", [](nlohmann::json& j) {
              j.erase("mtp_hybrid_override_pattern");
              j["mtp_layers_block_type"] = {"attention", "moe"};
            }},
           {"default", [](nlohmann::json& j) { j.erase("mtp_hybrid_override_pattern"); }}}) {
    SCOPED_TRACE(name);
    TempDir t(std::string("nemotron_mtp_") + name);
    HfModel again = load_hf_nemotron_h(hf_test::rewritten_fixture(dir, nullptr, edit, t));
    EXPECT_EQ(again.model->config().hybrid_override_pattern(), "ME*E/*E/*E");
    hf_test::expect_fixture_losses(*again.model, dir, "tokens");
  }
  TempDir saved("nemotron_mtp_main_only");  // transformers' save_pretrained keeps the key and drops the tensors
  HfModel main_only = load_hf_nemotron_h(hf_test::rewritten_fixture(
      dir, [](Tensors& t) { std::erase_if(t.list, [](const auto& e) { return e.first.starts_with("mtp."); }); },
      nullptr, saved));
  EXPECT_EQ(main_only.model->config().mtp_num_layers, 0);
  hf_test::expect_fixture_logits(*main_only.model, dir);
}

// Depths that repeat one layer (--mtp-use-repeated-layer, Megatron's Nemotron-3 recipe) are written once,
// num_nextn_predict_layers 1, as NVIDIA publishes Nemotron-3: read back, one depth with every parameter's bits.
TEST(HfNemotronH, RepeatedPredictionLayerIsWrittenOnce) {
  TransformerConfig c = load_hf_nemotron_h(fixture("hf_nemotron_h_mtp_tiny")).model->config();
  c.mtp_use_repeated_layer = true;
  c.padded_vocab_size = 0;
  c.finalize();
  GPTModel m(c, 1, c.max_position_embeddings);
  hf_test::randomize_parameters(m, 11, true);
  TempDir out("nemotron_mtp_repeated");
  save_hf_nemotron_h(out.str() + "/hf", m, "");
  SafetensorsFile f = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
  EXPECT_TRUE(f.has("mtp.layers.0.eh_proj.weight") && f.has("mtp.layers.1.final_layernorm.weight"));
  for (const std::string& name : f.names()) EXPECT_FALSE(name.starts_with("mtp.layers.2.")) << name;
  std::ifstream in(out.str() + "/hf/config.json");
  EXPECT_EQ(nlohmann::json::parse(in).value("num_nextn_predict_layers", 0), 1);
  HfModel back = load_hf_nemotron_h(out.str() + "/hf");
  EXPECT_EQ(back.model->config().mtp_num_layers, 1);
  hf_test::expect_same_model(m, *back.model);
}

TEST(HfNemotronH, BadPredictionDepthsAreOneLineErrors) {
  const char* dir = "hf_nemotron_h_mtp_tiny";
  for (const auto& [name, edit, expect] : std::vector<std::tuple<const char*, std::function<void(nlohmann::json&)>, const char*>>{
           {"form", [](nlohmann::json& j) { j["mtp_hybrid_override_pattern"] = "E*"; },
            "the prediction layers' pattern 'E*' is not a mixer"},
           {"count", [](nlohmann::json& j) { j["num_nextn_predict_layers"] = "two"; },
            "num_nextn_predict_layers \"two\" is not a count"},
           {"kind", [](nlohmann::json& j) {
              j.erase("mtp_hybrid_override_pattern");
              j["mtp_layers_block_type"] = {"attention", "dense"};
            }, "mtp_layers_block_type has an unknown kind \"dense\""},
           {"more", [](nlohmann::json& j) { j["num_nextn_predict_layers"] = 3; }, "missing tensor mtp.layers.4."},
           {"fewer", [](nlohmann::json& j) { j["num_nextn_predict_layers"] = 1; }, "unexpected tensor mtp.layers.2."},
           {"blocks", [](nlohmann::json& j) { j["mtp_hybrid_override_pattern"] = "*-"; },
            "missing tensor mtp.layers.1.mixer."}}) {
    SCOPED_TRACE(name);
    TempDir t(std::string("nemotron_bad_mtp_") + name);
    expect_load_error(hf_test::rewritten_fixture(dir, nullptr, edit, t), expect);
  }
}

// A lattice model without Nemotron-H's form says why, before anything is written.
TEST(HfNemotronH, ModelsWithoutTheFormAreNamed) {
  const TransformerConfig nemotron = load_hf_nemotron_h(fixture("hf_nemotron_h_tiny")).model->config();
  auto reason = [&](const std::function<void(TransformerConfig&)>& edit) {
    TransformerConfig c = nemotron;
    edit(c);
    return hf_nemotron_h_mismatch(c);
  };
  EXPECT_NE(reason([](TransformerConfig& c) { c.hybrid_layer_pattern.clear(); }).find("no --hybrid-override-pattern"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.position_embedding_type = "rope"; }).find("a position embedding"),
            std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.normalization = "LayerNorm"; }).find("LayerNorm"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.add_bias_linear = true; }).find("linear biases"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.gelu = GeluKind::erf; }).find("squared ReLU"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.qk_layernorm = true; }).find("query and key norms"), std::string::npos);
  EXPECT_NE(reason([](TransformerConfig& c) { c.layernorm_epsilon = 1e-6f; }).find("--norm-epsilon"), std::string::npos);
  TempDir out("nemotron_refused");
  HfModel hf = load_hf_nemotron_h(fixture("hf_nemotron_h_tiny"));
  TransformerConfig c = hf.model->config();
  c.normalization = "LayerNorm";
  c.padded_vocab_size = 0;
  c.finalize();
  GPTModel layernorm(c, 1, 8);
  hf_test::expect_one_line_error([&] { save_hf_nemotron_h(out.str() + "/hf", layernorm, ""); },
                                 {"--to-hf", "LayerNorm (HuggingFace Nemotron-H has RMSNorm)"});
  EXPECT_FALSE(std::ifstream(out.str() + "/hf/config.json").good()) << "a refused export wrote config.json";
}

}  // namespace
}  // namespace lattice
