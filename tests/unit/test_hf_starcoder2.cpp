// HuggingFace StarCoder2 <-> lattice: logits against an independent HF-layout StarCoder2
// (tests/fixtures/make_hf_llama_fixture.py's starcoder2_forward: LayerNorm with biases, every linear layer
// biased, gelu_pytorch_tanh, rope, grouped-query attention, a sliding window of 6, tied), the round trip
// byte for byte, the forms it cannot hold and bad config.json values.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "checkpoint/hf_starcoder2.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;

TEST(HfStarcoder2, MatchesIndependentLogitsAndRoundTrips) {
  HfModel hf = load_hf_starcoder2(fixture("hf_starcoder2_tiny"));
  hf_test::expect_fixture_logits(*hf.model, "hf_starcoder2_tiny");
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.rope() && !c.rmsnorm() && c.add_bias_linear && c.gelu == GeluKind::tanh && !c.gated_linear_unit());
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.window_size, 5);  // sliding_window 6 counts the query's own key
  EXPECT_EQ(c.rotary_base, 100000.0f);
  EXPECT_FALSE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(hf_starcoder2_mismatch(c), "");
  TempDir out("starcoder2_rt");
  save_hf_starcoder2(out.str(), *hf.model, "");
  std::ifstream cf(out.str() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cf);
  EXPECT_EQ(j["model_type"], "starcoder2");
  EXPECT_EQ(j["sliding_window"], 6);
  EXPECT_EQ(j["hidden_act"], "gelu_pytorch_tanh");
  hf_test::expect_same_tensors("hf_starcoder2_tiny", out.str());
  hf_test::expect_fixture_logits(*load_hf_starcoder2(out.str()).model, "hf_starcoder2_tiny");
}

TEST(HfStarcoder2, FormsItCannotHoldAndBadConfigsAreNamed) {
  TransformerConfig c = load_hf_starcoder2(fixture("hf_starcoder2_tiny")).model->config();
  TransformerConfig erf = c;
  erf.gelu = GeluKind::erf;
  EXPECT_NE(hf_starcoder2_mismatch(erf).find("--openai-gelu"), std::string::npos);
  TransformerConfig rms = c;
  rms.normalization = "RMSNorm";
  EXPECT_NE(hf_starcoder2_mismatch(rms).find("RMSNorm"), std::string::npos);
  TransformerConfig half = c;
  half.rotary_percent = 0.5;
  EXPECT_NE(hf_starcoder2_mismatch(half).find("--rotary-percent"), std::string::npos);
  auto error_of = [](const std::function<void(nlohmann::json&)>& edit) {
    TempDir t("starcoder2_bad");
    const std::string dir = hf_test::rewritten_fixture("hf_starcoder2_tiny", nullptr, edit, t);
    try {
      load_hf_starcoder2(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of([](nlohmann::json& j) { j["use_bias"] = false; }).find("config.json: use_bias false is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["hidden_act"] = "gelu"; }).find("hidden_act \"gelu\" is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}}; })
                .find("rope_scaling"),
            std::string::npos);
  EXPECT_NE(error_of([](nlohmann::json& j) { j["num_key_value_heads"] = 3; }).find("num_key_value_heads"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
