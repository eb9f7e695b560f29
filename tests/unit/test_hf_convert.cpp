// HuggingFace GPT-2 <-> lattice: logits against an independent HF-layout GPT-2
// (tests/fixtures/make_hf_gpt2_fixture.py), the round trips in both directions, the tensor
// layout, and every kind of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;
using hf_test::Tensors;

// The fixture's logits (hf_test::expect_fixture_logits), and its padded vocabulary rows zero.
void check_fixture_logits(const char* dir) {
  HfGpt2Model hf = load_hf_gpt2(fixture(dir));
  hf_test::expect_fixture_logits(*hf.model, dir);
  // Padded vocabulary rows are zero.
  const TransformerConfig& c = hf.model->config();
  const ParamInfo& wte = hf.model->params().info("embedding.word_embeddings.weight");
  const float* w = hf.model->params().params() + wte.offset;
  for (int64_t i = c.vocab_size * c.hidden_size; i < c.padded_vocab_size * c.hidden_size; ++i)
    ASSERT_EQ(w[i], 0.0f) << "padded wte row";
}

TEST(HfConvert, TiedGeluNewMatchesIndependentLogits) {
  check_fixture_logits("hf_gpt2_tiny");
  HfGpt2Model hf = load_hf_gpt2(fixture("hf_gpt2_tiny"));
  EXPECT_EQ(hf.model->config().gelu, GeluKind::tanh);
  EXPECT_FALSE(hf.model->config().untie_embeddings_and_output_weights);
  EXPECT_EQ(hf.model->config().ffn_hidden_size, 4 * hf.model->config().hidden_size);
}

TEST(HfConvert, UntiedErfGeluMatchesIndependentLogits) {
  check_fixture_logits("hf_gpt2_tiny_untied");
  HfGpt2Model hf = load_hf_gpt2(fixture("hf_gpt2_tiny_untied"));
  EXPECT_EQ(hf.model->config().gelu, GeluKind::erf);
  EXPECT_TRUE(hf.model->config().untie_embeddings_and_output_weights);
  EXPECT_EQ(hf.model->config().ffn_hidden_size, 48);
}

// Every tensor of `a` except the attention buffers is in `b` with the same dtype, shape, bytes.
void expect_same_tensors(const SafetensorsFile& a, const SafetensorsFile& b) {
  size_t compared = 0;
  for (const std::string& name : a.names()) {
    if (name.find(".attn.bias") != std::string::npos || name.find(".attn.masked_bias") != std::string::npos)
      continue;
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_EQ(a.get(name).dtype, b.get(name).dtype) << name;
    EXPECT_EQ(a.get(name).shape, b.get(name).shape) << name;
    EXPECT_TRUE(a.get(name).bytes == b.get(name).bytes) << name << " differs after the round trip";
    ++compared;
  }
  EXPECT_EQ(compared, b.names().size()) << "the export has tensors the original does not";
}

TEST(HfConvert, HfToLatticeToHfIsIdentity) {
  for (const char* dir : {"hf_gpt2_tiny", "hf_gpt2_tiny_untied"}) {
    TempDir out(std::string("rt_") + dir);
    HfGpt2Model hf = load_hf_gpt2(fixture(dir));
    save_hf_gpt2(out.str() + "/hf", *hf.model, "");
    expect_same_tensors(SafetensorsFile::read(fixture(dir) + "/model.safetensors"),
                        SafetensorsFile::read(out.str() + "/hf/model.safetensors"));
    std::ifstream a(fixture(dir) + "/config.json"), b(out.str() + "/hf/config.json");
    nlohmann::json ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
    for (const char* key : {"n_layer", "n_embd", "n_head", "n_positions", "n_inner", "vocab_size",
                            "activation_function", "layer_norm_epsilon", "model_type"})
      EXPECT_EQ(ja[key], jb[key]) << dir << ": config.json " << key;
    EXPECT_EQ(ja.value("tie_word_embeddings", true), jb.value("tie_word_embeddings", true)) << dir;
  }
}

// A model with every parameter (padded rows too) random, so any misplaced element shows.
std::unique_ptr<GPTModel> random_model(bool untie, GeluKind gelu, int64_t ffn) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 24;
  c.num_attention_heads = 3;
  c.ffn_hidden_size = ffn;
  c.vocab_size = 70;
  c.make_vocab_size_divisible_by = 32;
  c.max_position_embeddings = 12;
  c.gelu = gelu;
  c.untie_embeddings_and_output_weights = untie;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  auto m = std::make_unique<GPTModel>(c, 1, c.max_position_embeddings);
  hf_test::randomize_parameters(*m, untie ? 7 : 8, false);
  return m;
}

TEST(HfConvert, LatticeToHfToLatticeKeepsEveryRealParameterAndLogit) {
  for (GeluKind kind : {GeluKind::tanh, GeluKind::erf, GeluKind::squared_relu}) {
    const bool untie = kind == GeluKind::erf;
    auto model = random_model(untie, kind, untie ? 40 : 0);
    const TransformerConfig& c = model->config();
    TempDir out(untie ? "l2h_untied" : kind == GeluKind::tanh ? "l2h_tied" : "l2h_relu2");
    save_hf_gpt2(out.str(), *model, "ByteTokenizer");
    // HuggingFace's names: gelu_new (tanh), gelu (erf), relu2 (ReLUSquaredActivation).
    std::ifstream config_file(out.str() + "/config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config.at("activation_function"),
              kind == GeluKind::tanh ? "gelu_new" : kind == GeluKind::erf ? "gelu" : "relu2");
    HfGpt2Model back = load_hf_gpt2(out.str(), c.make_vocab_size_divisible_by);
    EXPECT_EQ(back.tokenizer_type, "ByteTokenizer");
    const TransformerConfig& b = back.model->config();
    EXPECT_EQ(b.padded_vocab_size, c.padded_vocab_size);
    EXPECT_EQ(b.ffn_hidden_size, c.ffn_hidden_size);
    EXPECT_EQ(b.gelu, c.gelu);
    EXPECT_EQ(b.layernorm_epsilon, c.layernorm_epsilon);
    EXPECT_EQ(b.untie_embeddings_and_output_weights, untie);
    hf_test::expect_same_model(*model, *back.model);
  }
}

// The layout itself, spelled out: HF c_attn column j*C + h*D + d (j: q, k, v) holds lattice
// linear_qkv row (h*3 + j)*D + d; Conv1D weights are transposed.
TEST(HfConvert, TensorLayout) {
  auto model = random_model(false, GeluKind::tanh, 0);
  const TransformerConfig& c = model->config();
  const int64_t C = c.hidden_size, H = c.num_attention_heads, D = c.kv_channels, F = c.ffn_hidden_size;
  TempDir out("layout");
  export_hf_gpt2_tensors(*model).write(out.str() + "/model.safetensors");
  SafetensorsFile f = SafetensorsFile::read(out.str() + "/model.safetensors");
  const ParamBuffer& pb = model->params();
  auto lat = [&](const std::string& n) { return pb.params() + pb.info(n).offset; };
  const float* qkv = lat("decoder.layers.1.self_attention.linear_qkv.weight");   // [3C, C]
  const float* qkv_b = lat("decoder.layers.1.self_attention.linear_qkv.bias");   // [3C]
  const std::vector<float> c_attn = f.get_f32("transformer.h.1.attn.c_attn.weight");  // [C, 3C]
  const std::vector<float> c_attn_b = f.get_f32("transformer.h.1.attn.c_attn.bias");
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t col = j * C + h * D + d, row = (h * 3 + j) * D + d;
        ASSERT_EQ(c_attn_b[col], qkv_b[row]);
        for (int64_t i = 0; i < C; ++i) ASSERT_EQ(c_attn[i * 3 * C + col], qkv[row * C + i]);
      }
  const float* fc1 = lat("decoder.layers.0.mlp.linear_fc1.weight");             // [F, C]
  const std::vector<float> c_fc = f.get_f32("transformer.h.0.mlp.c_fc.weight");   // [C, F]
  for (int64_t o = 0; o < F; ++o)
    for (int64_t i = 0; i < C; ++i) ASSERT_EQ(c_fc[i * F + o], fc1[o * C + i]);
  EXPECT_EQ(f.get("transformer.wte.weight").shape, (Shape{c.vocab_size, C}));
  EXPECT_FALSE(f.has("lm_head.weight")) << "a tied model has no lm_head.weight, as save_pretrained writes it";
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

std::string corrupted(const std::string& tag, const std::function<void(Tensors&)>& edit_tensors,
                      const std::function<void(nlohmann::json&)>& edit_config, TempDir& tmp) {
  return hf_test::rewritten_fixture("hf_gpt2_tiny", edit_tensors, edit_config, tmp);
}

void expect_error(const std::string& dir, const std::vector<std::string>& needles) {
  hf_test::expect_one_line_error([&] { load_hf_gpt2(dir); }, needles);
}

TEST(HfConvert, NamesWithoutTransformerPrefixAndOtherDtypesLoad) {
  TempDir tmp("prefixless_bf16");
  // GPT-2's original checkpoints name tensors "h.0...." (no prefix); store them as BF16
  // (the top 16 bits of each float, so the expected values are the truncated floats).
  const std::string dir = corrupted("prefixless", [](Tensors& ts) {
    for (auto& [name, t] : ts.list) {
      if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
      if (t.dtype != "F32") continue;
      std::vector<uint8_t> bf(t.bytes.size() / 2);
      for (size_t i = 0; i < bf.size(); i += 2) bf[i] = t.bytes[2 * i + 2], bf[i + 1] = t.bytes[2 * i + 3];
      t.bytes = bf;
      t.dtype = "BF16";
    }
  }, nullptr, tmp);
  HfGpt2Model ref = load_hf_gpt2(fixture("hf_gpt2_tiny"));
  HfGpt2Model got = load_hf_gpt2(dir);
  for (int64_t i = 0; i < ref.model->params().numel(); ++i) {
    float want = ref.model->params().params()[i];
    uint32_t bits;
    std::memcpy(&bits, &want, 4);
    bits &= 0xffff0000u;
    std::memcpy(&want, &bits, 4);
    ASSERT_EQ(got.model->params().params()[i], want) << "element " << i;
  }
}

TEST(HfConvert, BadInputIsOneLineErrorNamingTheProblem) {
  {
    TempDir t("missing");
    expect_error(corrupted("m", [](Tensors& ts) { ts.erase("transformer.h.1.mlp.c_fc.bias"); }, nullptr, t),
                 {"model.safetensors", "missing tensor transformer.h.1.mlp.c_fc.bias"});
  }
  {
    TempDir t("shape");
    expect_error(corrupted("s", [](Tensors& ts) {
      SafeTensor* x = ts.find("transformer.h.0.attn.c_attn.weight");
      x->shape = {x->shape[1], x->shape[0]};  // stored [out, in]: not a Conv1D layout
    }, nullptr, t), {"transformer.h.0.attn.c_attn.weight", "[96, 32]", "[32, 96]"});
  }
  {
    TempDir t("extra_layer");
    expect_error(corrupted("e", nullptr, [](nlohmann::json& j) { j["n_layer"] = 1; }, t),
                 {"unexpected tensor transformer.h.1.", "n_layer 1"});
  }
  {
    TempDir t("more_layers");
    expect_error(corrupted("l", nullptr, [](nlohmann::json& j) { j["n_layer"] = 3; }, t),
                 {"missing tensor transformer.h.2."});
  }
  {
    TempDir t("lm_head");
    expect_error(corrupted("h", [](Tensors& ts) {
      SafeTensor w = *ts.find("transformer.wte.weight");
      w.bytes[5] ^= 0x40;
      ts.list.push_back({"lm_head.weight", w});
    }, nullptr, t), {"lm_head.weight differs", "tie_word_embeddings"});
  }
  {
    TempDir t("lm_head_equal");  // a tied file that stores lm_head = wte loads fine
    const std::string dir = corrupted("h2", [](Tensors& ts) {
      ts.list.push_back({"lm_head.weight", *ts.find("transformer.wte.weight")});
    }, nullptr, t);
    EXPECT_NO_THROW(load_hf_gpt2(dir));
  }
  {
    TempDir t("untied_no_head");
    expect_error(corrupted("u", nullptr, [](nlohmann::json& j) { j["tie_word_embeddings"] = false; }, t),
                 {"missing tensor lm_head.weight"});
  }
  {
    TempDir t("dtype");
    expect_error(corrupted("d", [](Tensors& ts) { ts.find("transformer.ln_f.bias")->dtype = "I32"; }, nullptr, t),
                 {"transformer.ln_f.bias", "I32"});
  }
  {
    TempDir t("activation");
    expect_error(corrupted("a", nullptr, [](nlohmann::json& j) { j["activation_function"] = "relu"; }, t),
                 {"config.json", "activation_function", "relu"});
  }
  {
    TempDir t("no_key");
    expect_error(corrupted("k", nullptr, [](nlohmann::json& j) { j.erase("n_embd"); }, t),
                 {"config.json", "missing n_embd"});
  }
  {
    TempDir t("model_type");
    expect_error(corrupted("t", nullptr, [](nlohmann::json& j) { j["model_type"] = "llama"; }, t),
                 {"config.json", "model_type", "llama"});
  }
  {
    TempDir t("scale");
    expect_error(corrupted("c", nullptr, [](nlohmann::json& j) { j["scale_attn_by_inverse_layer_idx"] = true; }, t),
                 {"config.json", "scale_attn_by_inverse_layer_idx"});
  }
  {
    TempDir t("json");
    corrupted("j", nullptr, nullptr, t);
    std::ofstream(t.str() + "/config.json") << "{\"n_layer\": 2,";
    expect_error(t.str(), {"config.json", "invalid JSON"});
  }
  {
    TempDir t("no_model");
    corrupted("n", nullptr, nullptr, t);
    fs::remove(t.path / "model.safetensors");
    expect_error(t.str(), {"model.safetensors", "does not exist"});
  }
}

}  // namespace
}  // namespace lattice
