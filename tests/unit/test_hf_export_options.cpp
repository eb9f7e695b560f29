// lattice convert --to-hf's --hf-dtype and --max-shard-size (checkpoint/hf_common.h): a model
// written in bfloat16 or float16 holds each parameter rounded to nearest even and loads back as
// exactly that; one larger than the shard size is split as transformers' save_pretrained splits
// it (model-0000i-of-0000N.safetensors, model.safetensors.index.json) and loads back the same;
// a value float16 cannot hold and bad flag values are one-line errors naming them, with nothing
// written.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "checkpoint/hf_common.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"
#include "kernels/cast_math.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using hf_test::TempDir;

// Every parameter random (N(0, 0.3)): GPT-2's form, or Llama's (rope, RMSNorm, SwiGLU, no biases).
std::unique_ptr<GPTModel> random_model(bool llama, uint32_t seed) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 60;
  c.make_vocab_size_divisible_by = 32;
  c.max_position_embeddings = 12;
  c.hidden_dropout = c.attention_dropout = 0;
  if (llama) {
    c.position_embedding_type = "rope";
    c.normalization = "RMSNorm";
    c.swiglu = true;
    c.add_bias_linear = false;
    c.ffn_hidden_size = 48;
  }
  c.finalize();
  auto m = std::make_unique<GPTModel>(c, 1, c.max_position_embeddings);
  hf_test::randomize_parameters(*m, seed, false);
  return m;
}

// The model's parameters rounded as the export rounds them (bf16 or fp16, nearest even).
void round_params(GPTModel& m, bool bf16) {
  for (int64_t i = 0; i < m.params().numel(); ++i) {
    float& v = m.params().params()[i];
    v = bf16 ? math::bf16_to_fp32(math::fp32_to_bf16(v)) : math::fp16_to_fp32(math::fp32_to_fp16(v));
  }
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Sharded in bfloat16 (shards of at most 8 KB; GPT-2's 8 KB fc weights each alone in one), as the
// index says: the shards hold every tensor once, each where the weight_map puts it, total_size
// their bytes; the model loads back as its bf16-rounded self, logits too.
TEST(HfExport, ShardedBfloat16LoadsBackAsTheRoundedModel) {
  for (const bool llama : {false, true}) {
    auto model = random_model(llama, llama ? 3 : 4);
    TempDir out(llama ? "export_bf16_llama" : "export_bf16_gpt2");
    const std::string dir = out.str() + "/hf";
    const hf::ExportOptions options = hf::parse_export_options("bf16", "8KB");
    ASSERT_EQ(options.dtype, "bfloat16");
    ASSERT_EQ(options.max_shard_bytes, 8000u);
    if (llama)
      save_hf_llama(dir, *model, "", options);
    else
      save_hf_gpt2(dir, *model, "", options);
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors")) << "a sharded model has no model.safetensors";
    const nlohmann::json index = read_json(dir + "/model.safetensors.index.json");
    EXPECT_EQ(read_json(dir + "/config.json").at("torch_dtype"), "bfloat16");
    std::map<std::string, int> files;  // shard -> tensors
    for (const auto& [name, file] : index.at("weight_map").items()) files[file.get<std::string>()]++;
    ASSERT_GT(files.size(), 2u);
    uint64_t total = 0;
    size_t tensors = 0, i = 0;
    for (const auto& [file, count] : files) {
      char expected[64];
      std::snprintf(expected, sizeof expected, "model-%05zu-of-%05zu.safetensors", ++i, files.size());
      EXPECT_EQ(file, expected);
      SafetensorsFile shard = SafetensorsFile::read(dir + "/" + file);
      EXPECT_EQ(shard.names().size(), size_t(count)) << file;
      uint64_t bytes = 0;
      for (const std::string& n : shard.names()) {
        EXPECT_EQ(index["weight_map"][n], file) << n;
        EXPECT_EQ(shard.get(n).dtype, "BF16") << n;
        bytes += shard.get(n).bytes.size();
      }
      EXPECT_TRUE(bytes <= 8000u || shard.names().size() == 1) << file << ": " << bytes << " bytes";
      total += bytes;
      tensors += shard.names().size();
    }
    EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
    std::unique_ptr<GPTModel> back = llama ? std::move(load_hf_llama(dir, 32).model) : std::move(load_hf_gpt2(dir, 32).model);
    round_params(*model, true);
    hf_test::expect_same_model(*model, *back);
    // One file when the model fits (the default 5GB), with the same tensors.
    TempDir one(llama ? "export_bf16_llama_one" : "export_bf16_gpt2_one");
    if (llama)
      save_hf_llama(one.str(), *back, "", hf::parse_export_options("bfloat16", ""));
    else
      save_hf_gpt2(one.str(), *back, "", hf::parse_export_options("bfloat16", ""));
    EXPECT_FALSE(fs::exists(one.str() + "/model.safetensors.index.json"));
    EXPECT_EQ(SafetensorsFile::read(one.str() + "/model.safetensors").names().size(), tensors);
  }
}

// float16: each value rounded to nearest even, and a value beyond its range refused naming the
// tensor, before anything is written.
TEST(HfExport, Float16RoundsAndRefusesWhatItCannotHold) {
  auto model = random_model(false, 5);
  TempDir out("export_fp16");
  save_hf_gpt2(out.str() + "/hf", *model, "", hf::parse_export_options("float16", ""));
  EXPECT_EQ(read_json(out.str() + "/hf/config.json").at("torch_dtype"), "float16");
  EXPECT_EQ(SafetensorsFile::read(out.str() + "/hf/model.safetensors").get("transformer.h.0.attn.c_attn.weight").dtype,
            "F16");
  HfGpt2Model back = load_hf_gpt2(out.str() + "/hf", 32);
  round_params(*model, false);
  hf_test::expect_same_model(*model, *back.model);

  const ParamInfo& fc = model->params().info("decoder.layers.1.mlp.linear_fc1.weight");
  model->params().params()[fc.offset + 7] = 1e5f;
  try {
    save_hf_gpt2(out.str() + "/big", *model, "", hf::parse_export_options("fp16", ""));
    ADD_FAILURE() << "a value of 1e5 exported as float16";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("float16's range"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(out.str() + "/big")) << "a refused export wrote something";
  // bfloat16 holds it.
  save_hf_gpt2(out.str() + "/bf16", *model, "", hf::parse_export_options("bfloat16", ""));
}

TEST(HfExport, OptionsParseAsTransformersReadsThem) {
  EXPECT_EQ(hf::parse_export_options("", "").dtype, "float32");
  EXPECT_EQ(hf::parse_export_options("", "").max_shard_bytes, 5000000000u);
  EXPECT_EQ(hf::parse_export_options("fp16", "").dtype, "float16");
  EXPECT_EQ(hf::parse_export_options("float32", "").dtype, "float32");
  EXPECT_EQ(hf::parse_export_options("", "2GiB").max_shard_bytes, uint64_t(2) << 30);
  EXPECT_EQ(hf::parse_export_options("", "500mb").max_shard_bytes, 500000000u);
  EXPECT_EQ(hf::parse_export_options("", "10KiB").max_shard_bytes, 10240u);
  EXPECT_EQ(hf::parse_export_options("", "123456").max_shard_bytes, 123456u);
  for (const char* bad : {"int8", "bfloat", "BF16"}) {
    try {
      hf::parse_export_options(bad, "");
      ADD_FAILURE() << "--hf-dtype " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--hf-dtype"), std::string::npos) << e.what();
    }
  }
  for (const char* bad : {"0", "5XB", "GB", "-1", "1.5GB", "99999999999999GB", "999999999999GB"}) {
    try {
      hf::parse_export_options("", bad);
      ADD_FAILURE() << "--max-shard-size " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--max-shard-size"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lattice
