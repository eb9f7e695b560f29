// HuggingFace GPT-OSS <-> lattice (checkpoint/hf_gpt_oss.h): tiny GPT-OSS models made by an
// independent PyTorch script (tests/fixtures/make_hf_gpt_oss_fixture.py: attention with biases,
// sinks and a window on the sliding layer, YaRN, experts of the clamped quick GEGLU with biases, in
// the dequantized and the MXFP4 form) give their logits within 1e-5; the config maps to GPT-OSS's
// settings; HF -> lattice -> HF gives every tensor back bit for bit; MXFP4 decodes as the FP4 table
// says; bad input is a one-line error naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "checkpoint/hf_gpt_oss.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"
#include "test_util.h"

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;
using test_util::error_of;

constexpr int64_t kSeq = 16;  // the models' sequence length in these tests (the fixtures' T is 12)

TEST(HfGptOss, DequantizedModelMatchesIndependentLogits) {
  HfModel hf = load_hf_gpt_oss(fixture("hf_gpt_oss_tiny"), 128, kSeq);
  hf_test::expect_fixture_logits(*hf.model, "hf_gpt_oss_tiny");
  const TransformerConfig& c = hf.model->config();
  EXPECT_TRUE(c.moe() && c.moe_layer_pattern.empty());
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_hidden_size, 32);
  EXPECT_TRUE(c.quick_geglu && c.add_bias_linear && c.rmsnorm() && c.learnable_softmax_offset());
  EXPECT_EQ(c.glu_linear_offset, 1.0f);
  EXPECT_EQ(c.activation_func_clamp_value, 0.3f);
  EXPECT_EQ(c.window_size, 3);  // sliding_window 4 keys, the query's own among them
  EXPECT_EQ(c.attention_window(0), 3);
  EXPECT_EQ(c.attention_window(1), -1);
  EXPECT_TRUE(c.yarn());
  EXPECT_EQ(c.yarn_rotary_scaling_factor, 4.0f);
  EXPECT_FALSE(c.yarn_correction_range_round_to_int);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 16);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(hf_gpt_oss_mismatch(c), "");
  EXPECT_NE(hf_llama_mismatch(c), "");
}

TEST(HfGptOss, Mxfp4ModelMatchesIndependentLogits) {
  HfModel hf = load_hf_gpt_oss(fixture("hf_gpt_oss_tiny_mxfp4"), 128, kSeq);
  hf_test::expect_fixture_logits(*hf.model, "hf_gpt_oss_tiny_mxfp4");
}

// Each code's FP4 value, the low nibble first, times the block's power of two.
TEST(HfGptOss, Mxfp4DecodesByTheTable) {
  TempDir dir("gpt_oss_mxfp4");
  uint8_t blocks[2][16] = {};
  blocks[0][0] = 0x21;  // 0.5, 1.0
  blocks[0][1] = 0xF8;  // -0.0, -6.0
  blocks[1][0] = 0x7C;  // -2.0, 6.0
  const uint8_t scales[2] = {127, 125};  // 2^0, 2^-2
  SafetensorsWriter w;
  w.add("b", "U8", {2, 16}, blocks, sizeof(blocks));
  w.add("s", "U8", {2}, scales, sizeof(scales));
  w.add("f", "F32", {2}, std::vector<float>{1.0f, 2.0f}.data(), 8);
  w.write(dir.str() + "/m.safetensors");
  const SafetensorsFile f = SafetensorsFile::read(dir.str() + "/m.safetensors");
  const std::vector<float> v = decode_mxfp4(f, "b", "s");
  ASSERT_EQ(v.size(), 64u);
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 0.0f);
  EXPECT_TRUE(std::signbit(v[2]));
  EXPECT_EQ(v[3], -6.0f);
  EXPECT_EQ(v[4], 0.0f);
  EXPECT_EQ(v[32], -0.5f);  // -2 x 2^-2
  EXPECT_EQ(v[33], 1.5f);   // 6 x 2^-2
  EXPECT_NE(error_of([&] { decode_mxfp4(f, "f", "s"); }).find("tensor f is F32, MXFP4 needs U8"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_mxfp4(f, "b", "b"); }).find("do not pair"), std::string::npos);
  // A range of groups (an expert's, as the import decodes them): those groups' values, in order.
  const std::vector<float> second = decode_mxfp4(f, "b", "s", 1, 1);
  EXPECT_EQ(second, std::vector<float>(v.begin() + 32, v.end()));
  EXPECT_TRUE(decode_mxfp4(f, "b", "s", 2, 0).empty());
  EXPECT_NE(error_of([&] { decode_mxfp4(f, "b", "s", 1, 2); }).find("MXFP4 groups [1, 3) of tensor s (2 groups)"),
            std::string::npos);
}

// HF -> lattice -> HF: every tensor's bytes back (the MXFP4 model's experts as their decoded floats).
TEST(HfGptOss, HfToLatticeToHfIsIdentity) {
  for (const char* dir : {"hf_gpt_oss_tiny", "hf_gpt_oss_tiny_mxfp4"}) {
    SCOPED_TRACE(dir);
    TempDir out(std::string("gpt_oss_rt_") + dir);
    HfModel hf = load_hf_gpt_oss(fixture(dir), 128, kSeq);
    save_hf_gpt_oss(out.str() + "/hf", *hf.model, "");
    const SafetensorsFile a = SafetensorsFile::read(fixture(dir) + "/model.safetensors");
    const SafetensorsFile b = SafetensorsFile::read(out.str() + "/hf/model.safetensors");
    size_t compared = 0;
    for (const std::string& name : b.names()) {
      const bool quantized = !a.has(name);
      if (quantized) {  // gate_up_proj [E, C, 2I] is the decoded [E, 2I, C] transposed; down_proj likewise
        const std::vector<float> dec = decode_mxfp4(a, name + "_blocks", name + "_scales");
        const std::vector<float> got = b.get_f32(name);
        const Shape& s = b.get(name).shape;  // [E, cols, rows]
        ASSERT_EQ(got.size(), dec.size()) << name;
        for (int64_t e = 0; e < s[0]; ++e)
          for (int64_t k = 0; k < s[1]; ++k)
            for (int64_t r = 0; r < s[2]; ++r)
              ASSERT_EQ(got[size_t((e * s[1] + k) * s[2] + r)], dec[size_t((e * s[2] + r) * s[1] + k)])
                  << name << " " << e << "," << k << "," << r;
      } else {
        EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name;
      }
      ++compared;
    }
    EXPECT_EQ(compared, b.names().size());
    EXPECT_GT(compared, 30u);
    // The written config reads back as the same model.
    const TransformerConfig back = hf_gpt_oss_config(hf::read_config(out.str() + "/hf"), "back");
    EXPECT_EQ(hf_gpt_oss_config_json(back, ""), hf_gpt_oss_config_json(hf.model->config(), ""));
    HfModel again = load_hf_gpt_oss(out.str() + "/hf", 128, kSeq);
    hf_test::expect_fixture_logits(*again.model, dir);
  }
}

TEST(HfGptOss, BadInputIsOneLineErrorNamingTheProblem) {
  auto load_error = [](const std::function<void(Tensors&)>& tensors, const std::function<void(nlohmann::json&)>& config,
                       const char* name = "hf_gpt_oss_tiny") {
    TempDir tmp("gpt_oss_bad");
    const std::string dir = hf_test::rewritten_fixture(name, tensors, config, tmp);
    return error_of([&] { load_hf_gpt_oss(dir, 128, kSeq); });
  };
  struct Case {
    std::function<void(Tensors&)> tensors;
    std::function<void(nlohmann::json&)> config;
    std::string want;
  };
  const Case cases[] = {
      {nullptr, [](nlohmann::json& j) { j["attention_bias"] = false; }, "attention_bias false"},
      {nullptr, [](nlohmann::json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; }, "mxfp4 only"},
      {nullptr, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8}}; },
       "rope_scaling"},
      {nullptr, [](nlohmann::json& j) { j["layer_types"][1] = "chunked_attention"; }, "layer_types[1]"},
      {nullptr, [](nlohmann::json& j) { j.erase("num_local_experts"); }, "num_local_experts"},
      {[](Tensors& t) { t.erase("model.layers.1.self_attn.sinks"); }, nullptr, "missing tensor model.layers.1.self_attn.sinks"},
      {[](Tensors& t) { t.find("model.layers.0.mlp.experts.down_proj")->shape = {4, 32, 16, 2}; }, nullptr,
       "model.layers.0.mlp.experts.down_proj has shape"},
      {[](Tensors& t) { t.list.push_back({"model.layers.0.mlp.experts.extra", *t.find("model.norm.weight")}); }, nullptr,
       "unexpected tensor model.layers.0.mlp.experts.extra"},
      {nullptr, [](nlohmann::json& j) { j["quantization_config"] = {{"quant_method", "mxfp4"}}; },
       "missing tensor model.layers.0.mlp.experts.down_proj_blocks"},
  };
  for (const Case& c : cases) {
    const std::string msg = load_error(c.tensors, c.config);
    EXPECT_NE(msg.find(c.want), std::string::npos) << "want '" << c.want << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  const std::string msg = load_error([](Tensors& t) { t.find("model.layers.1.mlp.experts.gate_up_proj_scales")->dtype = "I8"; },
                                     nullptr, "hf_gpt_oss_tiny_mxfp4");
  EXPECT_NE(msg.find("gate_up_proj_scales is I8, MXFP4 needs U8"), std::string::npos) << msg;
}

// A model without GPT-OSS's form is refused before anything is written, naming what differs.
TEST(HfGptOss, ExportRefusesOtherModels) {
  HfModel hf = load_hf_gpt_oss(fixture("hf_gpt_oss_tiny"), 128, kSeq);
  auto why = [&](const std::function<void(TransformerConfig&)>& edit) {
    TransformerConfig c = hf.model->config();
    edit(c);
    return hf_gpt_oss_mismatch(c);
  };
  EXPECT_NE(why([](TransformerConfig& c) { c.softmax_type = "vanilla"; }).find("--softmax-type learnable"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& c) { c.quick_geglu = false, c.swiglu = true; }).find("--quick-geglu"),
            std::string::npos);
  EXPECT_NE(why([](TransformerConfig& c) { c.moe_layer_pattern = {0, 1}; }).find("dense MLP layers"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& c) { c.moe_router_pre_softmax = true; }).find("routing"), std::string::npos);
  EXPECT_NE(why([](TransformerConfig& c) { c.add_bias_linear = false; }).find("no linear biases"), std::string::npos);
  TransformerConfig plain = hf.model->config();
  plain.softmax_type = "vanilla";
  GPTModel m(plain, 1, 4);
  TempDir out("gpt_oss_refused");
  const std::string msg = error_of([&] { save_hf_gpt_oss(out.str() + "/x", m, ""); });
  EXPECT_NE(msg.find("--to-hf " + out.str() + "/x"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(out.path / "x"));
}

}  // namespace
}  // namespace lattice
