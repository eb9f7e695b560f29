// HuggingFace Qwen3-Next, Qwen3.5 and Qwen3.5-MoE <-> lattice (checkpoint/hf_qwen3_next.h): logits against an
// independent HF-layout reference (tests/fixtures/make_hf_llama_fixture.py: three Gated DeltaNet layers and a
// gated attention layer with partial rotary dims; Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba and experts
// with the gated shared expert, Qwen3.5's flat projections, dense MLP and tied embeddings, Qwen3.5-MoE's fused
// experts in its released multimodal folder), the round trip HF -> lattice -> HF, the multimodal Qwen3.5
// layout, and bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "checkpoint/hf_common.h"
#include "checkpoint/hf_qwen3_next.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

// The logits' bound: the reference's own forward pass in float32 ends 8.4e-6 (Qwen3-Next) and 5.2e-6 (Qwen3.5)
// from its float64 one (the gated delta rule's normalized heads and the gated norm over 6 values amplify
// float32 rounding), so these models get twice the 1e-5 of the other HF fixtures; lattice's worst token is
// 1.4e-5 and 7.8e-6 away. A layout mistake (an interleave read flat) moves a logit by 2.7.
constexpr double kLogitTol = 2e-5;

TEST(HfQwen3Next, Qwen3NextMatchesIndependentLogits) {
  HfModel hf = load_hf_qwen3_next(fixture("hf_qwen3_next_tiny"));
  hf_test::expect_fixture_logits(*hf.model, "hf_qwen3_next_tiny", kLogitTol);
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.gated_delta_net() && c.attention_output_gate && c.qk_layernorm && c.apply_layernorm_1p);
  EXPECT_EQ(c.linear_attention_pattern, (std::vector<int>{1, 1, 1, 0}));
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_DOUBLE_EQ(c.rotary_percent, 0.25);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 24);
  EXPECT_TRUE(c.moe_shared_expert_gate);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(hf_qwen3_next_family_name(c), "Qwen3-Next");
}

TEST(HfQwen3Next, Qwen35TextMatchesIndependentLogits) {
  HfModel hf = load_hf_qwen3_next(fixture("hf_qwen3_5_text_tiny"));
  hf_test::expect_fixture_logits(*hf.model, "hf_qwen3_5_text_tiny", kLogitTol);
  const TransformerConfig& c = hf.model->config();
  EXPECT_FALSE(c.moe());
  EXPECT_EQ(c.ffn_hidden_size, 48);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(c.rotary_base, 10000.0f);  // from rope_parameters
  EXPECT_EQ(hf_qwen3_next_family_name(c), "Qwen3.5");
}

TEST(HfQwen3Next, HfToLatticeToHfKeepsEveryTensor) {
  for (const char* dir : {"hf_qwen3_next_tiny", "hf_qwen3_5_text_tiny"}) {
    TempDir out(std::string("qwen3_next_rt_") + dir);
    HfModel hf = load_hf_qwen3_next(fixture(dir));
    save_hf_qwen3_next(out.str() + "/hf", *hf.model, "");
    SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
    SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
    EXPECT_EQ(a.names().size(), b.names().size()) << dir;
    for (const std::string& name : a.names()) {
      ASSERT_TRUE(b.has(name)) << dir << ": " << name;
      EXPECT_EQ(a.get(name).shape, b.get(name).shape) << name;
      if (name.find("linear_attn.norm.weight") == std::string::npos) {
        EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << dir << ": " << name << " differs after the round trip";
        continue;
      }
      // out_norm is stored as HF's weight - 1: back within the rounding of w - 1 + 1
      const std::vector<float> wa = hf::read_float_tensor(a, name), wb = hf::read_float_tensor(b, name);
      for (size_t i = 0; i < wa.size(); ++i) EXPECT_NEAR(wa[i], wb[i], 1e-7) << name << "[" << i << "]";
    }
    std::ifstream ia(fixture(dir) + "/config.json"), ib(out.str() + "/hf/config.json");
    const nlohmann::json ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
    for (const char* key : {"model_type", "architectures", "num_hidden_layers", "hidden_size", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "layer_types", "linear_num_key_heads",
                            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                            "linear_conv_kernel_dim", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
                            "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob"})
      EXPECT_EQ(ja.value(key, nlohmann::json()), jb.value(key, nlohmann::json())) << dir << ": config.json " << key;
    // The exported folder reads back to the same logits.
    HfModel back = load_hf_qwen3_next(out.str() + "/hf");
    hf_test::expect_fixture_logits(*back.model, dir, kLogitTol);
  }
}


// Qwen3.5's multi-token prediction module (mtp_num_hidden_layers 1: pre_fc_norm_embedding, pre_fc_norm_hidden,
// fc, one full-attention layer, norm) is lattice's prediction depth: the losses as the reference computes
// them; out and back keeps every tensor.
TEST(HfQwen3Next, MultiTokenPredictionModuleIsThePredictionDepth) {
  const char* dir = "hf_qwen3_5_text_tiny_mtp";
  HfModel hf = load_hf_qwen3_next(fixture(dir));
  GPTModel& m = *hf.model;
  hf_test::expect_fixture_logits(m, dir, kLogitTol);
  hf_test::expect_fixture_losses(m, dir, "tokens");
  TempDir out("qwen3_5_mtp_rt");
  save_hf_qwen3_next(out.str() + "/hf", m, "");
  SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
  EXPECT_EQ(a.names().size(), b.names().size());
  for (const std::string& name : a.names()) {
    ASSERT_TRUE(b.has(name)) << name;
    if (name.find("linear_attn.norm.weight") == std::string::npos)
      EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
  }
  std::ifstream jb(out.str() + "/hf/config.json");
  EXPECT_EQ(nlohmann::json::parse(jb).value("mtp_num_hidden_layers", 0), 1);
  // Without the key the module's tensors are not this model's: skipped; with 2 layers: refused.
  TempDir none("qwen3_5_mtp_none"), two("qwen3_5_mtp_two");
  HfModel plain = load_hf_qwen3_next(hf_test::rewritten_fixture(
      dir, nullptr, [](nlohmann::json& j) { j.erase("mtp_num_hidden_layers"); }, none));
  EXPECT_EQ(plain.model->config().mtp_num_layers, 0);
  // The key without the module's tensors (transformers' save_pretrained writes none): the main model alone.
  TempDir saved("qwen3_5_mtp_hf_saved");
  HfModel main_only = load_hf_qwen3_next(hf_test::rewritten_fixture(
      dir, [](Tensors& t) { std::erase_if(t.list, [](const auto& e) { return e.first.starts_with("mtp."); }); }, nullptr,
      saved));
  EXPECT_EQ(main_only.model->config().mtp_num_layers, 0);
  hf_test::expect_fixture_logits(*main_only.model, dir, kLogitTol);
  try {
    load_hf_qwen3_next(hf_test::rewritten_fixture(
        dir, nullptr, [](nlohmann::json& j) { j["mtp_num_hidden_layers"] = 2; }, two));
    ADD_FAILURE() << "mtp_num_hidden_layers 2 loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mtp_num_hidden_layers 2"), std::string::npos) << e.what();
  }
}

// Qwen3.5's released checkpoints are multimodal: config.json model_type qwen3_5 with the language model's
// settings in text_config, its tensors under model.language_model. beside model.visual. and mtp. (not read).
TEST(HfQwen3Next, MultimodalQwen35LayoutReadsItsLanguageModel) {
  TempDir tmp("qwen3_5_multimodal");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_qwen3_5_text_tiny",
      [](Tensors& ts) {
        for (auto& [name, t] : ts.list)
          if (name.rfind("model.", 0) == 0) name = "model.language_model." + name.substr(6);
        ts.list.push_back({"model.visual.patch_embed.weight", ts.list.front().second});
        ts.list.push_back({"mtp.fc.weight", ts.list.front().second});
      },
      [](nlohmann::json& j) {
        nlohmann::json text = j;
        text["model_type"] = "qwen3_5_text";
        j = {{"model_type", "qwen3_5"}, {"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"text_config", text}};
      },
      tmp);
  HfModel hf = load_hf_qwen3_next(dir);
  hf_test::expect_fixture_logits(*hf.model, "hf_qwen3_5_text_tiny", kLogitTol);
}

// Qwen3.5-MoE's released folder (hf_qwen3_5_moe_tiny: the multimodal qwen3_5_moe config with its text_config,
// model.language_model.*, a vision tensor, every layer's experts fused as experts.gate_up_proj [E, 2 I, H] and
// experts.down_proj [E, H, I], the prediction module's per expert): the reference's logits and losses.
TEST(HfQwen3Next, Qwen35MoeMatchesIndependentLogitsAndLosses) {
  const char* dir = "hf_qwen3_5_moe_tiny";
  HfModel hf = load_hf_qwen3_next(fixture(dir));
  GPTModel& m = *hf.model;
  const TransformerConfig& c = m.config();
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_hidden_size, 12);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 20);
  EXPECT_TRUE(c.moe_shared_expert_gate);
  EXPECT_FALSE(c.moe_router_pre_softmax);  // the top-k gates renormalized
  for (int64_t l = 0; l <= c.num_layers; ++l) EXPECT_TRUE(c.moe_layer(l)) << l;
  EXPECT_EQ(c.rotary_base, 10000000.0f);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  std::ifstream in(fixture(dir) + "/config.json");
  EXPECT_EQ(hf_qwen3_next_family_name(nlohmann::json::parse(in)), "Qwen3.5-MoE");
  hf_test::expect_fixture_logits(m, dir, kLogitTol);
  hf_test::expect_fixture_losses(m, dir, "tokens");
}

// Written as Qwen3.5-MoE's text model (--hf-model-type qwen3_5_moe): every tensor of the fixture's language model
// and prediction module, byte for byte, under model. (the vision tower not written); read back, the same
// logits and losses. Written as Qwen3-Next (the default for a GDN model with experts: the same model in its
// interleaved, per-expert layout), read back, the same too.
TEST(HfQwen3Next, Qwen35MoeRoundTripsAndConvertsToQwen3Next) {
  const char* dir = "hf_qwen3_5_moe_tiny";
  HfModel hf = load_hf_qwen3_next(fixture(dir));
  TempDir out("qwen3_5_moe_rt");
  hf::ExportOptions moe35;
  moe35.model_type = "qwen3_5_moe";
  EXPECT_EQ(hf_qwen3_next_family_name(hf.model->config(), "qwen3_5_moe"), "Qwen3.5-MoE");
  save_hf_qwen3_next(out.str() + "/moe35", *hf.model, "", moe35);
  SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
  SafetensorsFile b = SafetensorsFile::read(out.str() + "/moe35/model.safetensors");
  size_t compared = 0;
  for (std::string name : a.names()) {
    if (name.rfind("model.visual.", 0) == 0) continue;
    const std::string from = name;
    if (name.rfind("model.language_model.", 0) == 0) name = "model." + name.substr(21);
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_EQ(a.get(from).shape, b.get(name).shape) << name;
    ++compared;
    if (name.find("linear_attn.norm.weight") == std::string::npos)
      EXPECT_TRUE(a.get(from).bytes == b.get(name).bytes) << name << " differs after the round trip";
  }
  EXPECT_EQ(compared, b.names().size());
  EXPECT_TRUE(b.has("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(b.has("mtp.layers.0.mlp.experts.3.down_proj.weight"));
  std::ifstream jin(out.str() + "/moe35/config.json");
  const nlohmann::json j = nlohmann::json::parse(jin);
  EXPECT_EQ(j.value("model_type", ""), "qwen3_5_moe_text");
  EXPECT_EQ(j["architectures"][0], "Qwen3_5MoeForCausalLM");
  EXPECT_FALSE(j.contains("norm_topk_prob") || j.contains("mlp_only_layers") || j.contains("intermediate_size"));
  EXPECT_EQ(j.value("num_experts", 0), 4);
  HfModel back = load_hf_qwen3_next(out.str() + "/moe35");
  hf_test::expect_fixture_logits(*back.model, dir, kLogitTol);
  hf_test::expect_fixture_losses(*back.model, dir, "tokens");
  save_hf_qwen3_next(out.str() + "/next", *hf.model, "");
  SafetensorsFile n = SafetensorsFile::read(out.str() + "/next/model.safetensors");
  EXPECT_TRUE(n.has("model.layers.0.linear_attn.in_proj_qkvz.weight") && n.has("model.layers.0.mlp.experts.3.up_proj.weight"));
  HfModel next = load_hf_qwen3_next(out.str() + "/next");
  EXPECT_EQ(hf_qwen3_next_family_name(next.model->config()), "Qwen3-Next");
  hf_test::expect_fixture_logits(*next.model, dir, kLogitTol);
  hf_test::expect_fixture_losses(*next.model, dir, "tokens");
}

// The family a converted checkpoint recorded (its config.json's model_type) is written again by default when
// the model can take it: a model with experts as Qwen3.5-MoE or Qwen3-Next, a dense one as Qwen3.5; another
// model_type, or a family of the other kind of MLP, leaves the default.
TEST(HfQwen3Next, RecordedModelTypeWhenTheModelFitsIt) {
  const TransformerConfig moe = load_hf_qwen3_next(fixture("hf_qwen3_5_moe_tiny")).model->config();
  const TransformerConfig dense = load_hf_qwen3_next(fixture("hf_qwen3_5_text_tiny")).model->config();
  ASSERT_TRUE(moe.moe());
  ASSERT_FALSE(dense.moe());
  for (const char* t : {"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}) {
    EXPECT_EQ(hf_qwen3_next_recorded_type(moe, t), t);
    EXPECT_EQ(hf_qwen3_next_recorded_type(dense, t), "") << t;
  }
  for (const char* t : {"qwen3_5", "qwen3_5_text"}) {
    EXPECT_EQ(hf_qwen3_next_recorded_type(dense, t), t);
    EXPECT_EQ(hf_qwen3_next_recorded_type(moe, t), "") << t;
  }
  for (const char* t : {"", "llama", "qwen3_moe"}) {
    EXPECT_EQ(hf_qwen3_next_recorded_type(moe, t), "") << t;
    EXPECT_EQ(hf_qwen3_next_recorded_type(dense, t), "") << t;
  }
}

// Qwen3.6's files keep the prediction module's experts fused as the layers' are: read so too.
TEST(HfQwen3Next, FusedPredictionModuleExpertsRead) {
  TempDir tmp("qwen3_6_mtp_fused");
  const std::string dir = hf_test::rewritten_fixture(
      "hf_qwen3_5_moe_tiny",
      [](Tensors& ts) {
        const std::string x = "mtp.layers.0.mlp.experts.";
        std::vector<uint8_t> gate_up, down;
        std::vector<int64_t> up_shape, down_shape;
        for (int e = 0; e < 4; ++e) {
          const std::string p = x + std::to_string(e) + ".";
          for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
            const SafeTensor& t = *ts.find(p + part);
            gate_up.insert(gate_up.end(), t.bytes.begin(), t.bytes.end());
            up_shape = t.shape;
          }
          const SafeTensor& d = *ts.find(p + "down_proj.weight");
          down.insert(down.end(), d.bytes.begin(), d.bytes.end());
          down_shape = d.shape;
        }
        std::erase_if(ts.list, [&](const auto& t) { return t.first.rfind(x, 0) == 0; });
        ts.list.push_back({x + "gate_up_proj", {"F32", {4, 2 * up_shape[0], up_shape[1]}, gate_up}});
        ts.list.push_back({x + "down_proj", {"F32", {4, down_shape[0], down_shape[1]}, down}});
      },
      nullptr, tmp);
  HfModel hf = load_hf_qwen3_next(dir);
  hf_test::expect_fixture_losses(*hf.model, "hf_qwen3_5_moe_tiny", "tokens");
}

TEST(HfQwen3Next, BadInputIsAnErrorNamingTheFileAndTheKey) {
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TempDir a("qwen3_next_bad_a"), b("qwen3_next_bad_b"), c("qwen3_next_bad_c"), d("qwen3_next_bad_d");
  expect_error([&] {
    load_hf_qwen3_next(hf_test::rewritten_fixture("hf_qwen3_next_tiny", nullptr,
                                                  [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, a));
  }, "hidden_act");
  expect_error([&] {
    load_hf_qwen3_next(hf_test::rewritten_fixture(
        "hf_qwen3_next_tiny", nullptr, [](nlohmann::json& j) { j["layer_types"][0] = "sliding_attention"; }, b));
  }, "layer_types");
  expect_error([&] {  // config.json's value heads not the file's
    load_hf_qwen3_next(hf_test::rewritten_fixture(
        "hf_qwen3_next_tiny", nullptr, [](nlohmann::json& j) { j["linear_num_value_heads"] = 2; }, c));
  }, "config.json implies");
  expect_error([&] {
    load_hf_qwen3_next(hf_test::rewritten_fixture(
        "hf_qwen3_next_tiny",
        [](Tensors& ts) { ts.list.push_back({"model.layers.9.linear_attn.A_log", ts.list.back().second}); }, nullptr, d));
  }, "unexpected tensor model.layers.9.linear_attn.A_log");
}

TEST(HfQwen3Next, AModelWithoutTheFormIsRefusedAndNothingIsWritten) {
  HfModel hf = load_hf_qwen3_next(fixture("hf_qwen3_5_text_tiny"));
  TransformerConfig c = hf.model->config();
  c.apply_layernorm_1p = false;
  EXPECT_NE(hf_qwen3_next_mismatch(c).find("zero-centered"), std::string::npos);
  c = hf.model->config();
  c.experimental_attention_variant.clear();
  c.linear_attention_pattern.clear();
  EXPECT_NE(hf_qwen3_next_mismatch(c).find("Gated DeltaNet"), std::string::npos);
  EXPECT_EQ(hf_qwen3_next_mismatch(hf.model->config()), "");
  // --hf-model-type: a family of the other kind of MLP, or none of these, is refused naming the flag; so is a
  // Qwen3.5-MoE export of a model with a dense layer.
  TempDir out("qwen3_5_moe_refused");
  hf::ExportOptions moe35;
  moe35.model_type = "qwen3_5_moe";
  auto expect_refused = [&](const GPTModel& m, const hf::ExportOptions& o, const std::string& needle) {
    try {
      save_hf_qwen3_next(out.str() + "/hf", m, "", o);
      ADD_FAILURE() << "written; expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(out.str() + "/hf"));
  };
  expect_refused(*hf.model, moe35, "--hf-model-type qwen3_5_moe: Qwen3.5-MoE has experts");
  hf::ExportOptions llama;
  llama.model_type = "llama";
  expect_refused(*hf.model, llama, "--hf-model-type llama");
  TempDir dense("qwen3_5_moe_dense_layer");
  HfModel mixed = load_hf_qwen3_next(hf_test::rewritten_fixture(
      "hf_qwen3_next_tiny", [](Tensors& ts) {
        // layer 1 dense: Qwen3-Next's mlp_only_layers (its MLP from layer 0's shared expert, 24 wide)
        std::erase_if(ts.list, [](const auto& t) { return t.first.rfind("model.layers.1.mlp.", 0) == 0; });
        for (const char* part : {"gate_proj", "up_proj", "down_proj"}) {
          const SafeTensor t = *ts.find(std::string("model.layers.0.mlp.shared_expert.") + part + ".weight");
          ts.list.push_back({std::string("model.layers.1.mlp.") + part + ".weight", t});
        }
      },
      [](nlohmann::json& j) {
        j["mlp_only_layers"] = {1};
        j["intermediate_size"] = 24;
      },
      dense));
  expect_refused(*mixed.model, moe35, "a dense layer 1");
}

}  // namespace
}  // namespace lattice
