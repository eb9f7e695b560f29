// The streamed --from-hf conversion (hf_common.h's HfSource, model_checkpoint.h's save_model_checkpoint from a
// fill function): for every HF fixture of every family (GPT-OSS's an expert at a time, MXFP4 experts decoded),
// the checkpoint written parameter by parameter is the one the loaded model writes, byte for byte (model.safetensors and
// checkpoint.json); a fill that fails mid-file leaves no checkpoint behind; produced safetensors entries cast
// and split as stored ones do.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_deepseek_mla.h"
#include "checkpoint/hf_glm4_moe.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_gpt_oss.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_nemotron_h.h"
#include "checkpoint/hf_qwen3_next.h"
#include "checkpoint/model_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "hf_test_util.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Family {
  std::vector<const char*> dirs;
  std::function<HfModel(const std::string&)> load;
  std::function<HfSource(const std::string&)> open;
  // --to-hf of a loaded model and of a checkpoint read as written
  std::function<void(const std::string&, const GPTModel&)> save;
  std::function<void(const std::string&, const hf::ExportSource&)> save_streamed;
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {{"hf_llama_tiny", "hf_llama_tiny_llama3", "hf_llama_tiny_scaled", "hf_llama_tiny_tied", "hf_llama_tiny_yarn",
        "hf_mistral_tiny", "hf_mistral_tiny_swa", "hf_mixtral_tiny", "hf_qwen2_tiny", "hf_qwen2_tiny_swa",
        "hf_qwen2_moe_tiny", "hf_qwen3_tiny", "hf_qwen3_moe_tiny", "hf_smollm3_tiny", "hf_smollm3_tiny_interval",
        "hf_deepseek_moe_tiny"},
       [](const std::string& d) { return load_hf_llama(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_llama(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_llama(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_llama(d, s, ""); }},
      {{"hf_deepseek_v2_lite_tiny", "hf_deepseek_v3_tiny", "hf_deepseek_v3_tiny_mtp", "hf_deepseek_v3_tiny_noq",
        "hf_glm4_moe_lite_tiny"},
       [](const std::string& d) { return load_hf_deepseek_mla(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_deepseek_mla(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_deepseek_mla(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_deepseek_mla(d, s, ""); }},
      {{"hf_glm4_moe_tiny", "hf_glm4_moe_air_tiny"},
       [](const std::string& d) { return load_hf_glm4_moe(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_glm4_moe(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_glm4_moe(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_glm4_moe(d, s, ""); }},
      {{"hf_qwen3_next_tiny", "hf_qwen3_5_text_tiny", "hf_qwen3_5_text_tiny_mtp", "hf_qwen3_5_moe_tiny"},
       [](const std::string& d) { return load_hf_qwen3_next(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_qwen3_next(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_qwen3_next(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_qwen3_next(d, s, ""); }},
      {{"hf_gpt2_tiny", "hf_gpt2_tiny_untied"},  // (a tensor transposed whole)
       [](const std::string& d) { return load_hf_gpt2(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_gpt2(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_gpt2(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_gpt2(d, s, ""); }},
      {{"hf_gpt_oss_tiny", "hf_gpt_oss_tiny_mxfp4"},  // (an expert at a time)
       [](const std::string& d) { return load_hf_gpt_oss(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_gpt_oss(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_gpt_oss(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_gpt_oss(d, s, ""); }},
      {{"hf_nemotron_h_tiny", "hf_nemotron_h_tiny_tied", "hf_nemotron_h_moe_tiny", "hf_nemotron_h_latent_moe_tiny",
        "hf_nemotron_h_mtp_tiny"},
       [](const std::string& d) { return load_hf_nemotron_h(d, 128, 0, false); },
       [](const std::string& d) { return open_hf_nemotron_h(d); },
       [](const std::string& d, const GPTModel& m) { save_hf_nemotron_h(d, m, ""); },
       [](const std::string& d, const hf::ExportSource& s) { save_hf_nemotron_h(d, s, ""); }},
  };
  return f;
}

TEST(HfStreamedConvert, WritesTheLoadedModelsCheckpointByteForByte) {
  const std::string args = R"({"tokenizer-type": "NullTokenizer", "converted-from-hf": "x"})";
  int compared = 0;
  for (const Family& family : families()) {
    for (const char* dir : family.dirs) {
      SCOPED_TRACE(dir);
      TempDir out(std::string("streamed_") + dir);
      const HfModel loaded = family.load(fixture(dir));
      const HfSource source = family.open(fixture(dir));
      EXPECT_EQ(source.tokenizer_type, loaded.tokenizer_type);
      const std::string a = save_model_checkpoint(out.str() + "/loaded", 0, *loaded.model, args);
      const std::string b = save_model_checkpoint(out.str() + "/streamed", 0, source.config, source.fill, args);
      for (const char* file : {"model.safetensors", "checkpoint.json"}) {
        const std::string x = file_bytes(fs::path(a) / file), y = file_bytes(fs::path(b) / file);
        ASSERT_FALSE(x.empty()) << file;
        EXPECT_TRUE(x == y) << file << " differs (" << x.size() << " and " << y.size() << " bytes)";
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 36);
}

// --to-hf read from the checkpoint as each HF tensor is written (hf::checkpoint_source) writes the files the
// loaded model writes, byte for byte; both as bfloat16 shards too (the produced tensors cast and split).
TEST(HfStreamedConvert, ExportFromTheCheckpointWritesTheLoadedModelsFiles) {
  int compared = 0;
  for (const Family& family : families()) {
    if (!family.save) continue;
    for (const char* dir : family.dirs) {
      SCOPED_TRACE(dir);
      TempDir out(std::string("streamed_out_") + dir);
      const HfModel hf = family.load(fixture(dir));
      save_model_checkpoint(out.str() + "/ckpt", 0, *hf.model, "{}");
      const LoadedModel loaded = load_model_checkpoint(out.str() + "/ckpt");
      const LoadedModel opened = open_model_checkpoint(out.str() + "/ckpt");
      EXPECT_EQ(opened.model, nullptr);
      family.save(out.str() + "/a", *loaded.model);
      family.save_streamed(out.str() + "/b", hf::checkpoint_source(opened));
      for (const char* file : {"model.safetensors", "config.json"}) {
        const std::string x = file_bytes(fs::path(out.str()) / "a" / file), y = file_bytes(fs::path(out.str()) / "b" / file);
        ASSERT_FALSE(x.empty()) << file;
        EXPECT_TRUE(x == y) << file << " differs";
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 36);
  // bfloat16, sharded: the same shards and index.
  const HfModel hf = load_hf_nemotron_h(fixture("hf_nemotron_h_mtp_tiny"), 128, 0, false);
  TempDir out("streamed_out_bf16");
  save_model_checkpoint(out.str() + "/ckpt", 0, *hf.model, "{}");
  hf::ExportOptions bf16 = hf::parse_export_options("bfloat16", "200KB");
  save_hf_nemotron_h(out.str() + "/a", *load_model_checkpoint(out.str() + "/ckpt").model, "", bf16);
  save_hf_nemotron_h(out.str() + "/b", hf::checkpoint_source(open_model_checkpoint(out.str() + "/ckpt")), "", bf16);
  int files = 0;
  for (const auto& e : fs::directory_iterator(out.str() + "/a")) {
    EXPECT_TRUE(file_bytes(e.path()) == file_bytes(fs::path(out.str()) / "b" / e.path().filename()))
        << e.path().filename() << " differs";
    ++files;
  }
  EXPECT_GE(files, 4);  // shards, their index, config.json
  // Qwen3.5-MoE's fused experts (3-D gate_up_proj [E, 2 I, C], rows of C from several parameters).
  const HfModel moe = load_hf_qwen3_next(fixture("hf_qwen3_5_moe_tiny"), 128, 0, false);
  TempDir fused("streamed_out_fused");
  save_model_checkpoint(fused.str() + "/ckpt", 0, *moe.model, "{}");
  hf::ExportOptions qwen35_moe;
  qwen35_moe.model_type = "qwen3_5_moe";
  save_hf_qwen3_next(fused.str() + "/a", *load_model_checkpoint(fused.str() + "/ckpt").model, "", qwen35_moe);
  save_hf_qwen3_next(fused.str() + "/b", hf::checkpoint_source(open_model_checkpoint(fused.str() + "/ckpt")), "",
                     qwen35_moe);
  const std::string x = file_bytes(fused.path / "a" / "model.safetensors");
  EXPECT_NE(x.find("experts.gate_up_proj"), std::string::npos);
  EXPECT_TRUE(x == file_bytes(fused.path / "b" / "model.safetensors"));
}

// A parameter that cannot be produced (here: the fill throws at the fifth parameter) fails the save with that
// error, and nothing is published: no iteration directory, no tracker file, no staging left.
TEST(HfStreamedConvert, AFailedFillLeavesNoCheckpoint) {
  const HfSource source = open_hf_llama(fixture("hf_llama_tiny"));
  TempDir out("streamed_failed");
  int filled = 0;
  auto fill = [&](const ParamInfo& p, float* dst) {
    if (++filled == 5) LATTICE_FAIL() << "cannot read " << p.name;
    source.fill(p, dst);
  };
  hf_test::expect_one_line_error(
      [&] { save_model_checkpoint(out.str() + "/ckpt", 0, source.config, fill, "{}"); }, {"cannot read"});
  EXPECT_EQ(filled, 5);
  EXPECT_FALSE(has_checkpoint(out.str() + "/ckpt"));
  if (fs::exists(out.str() + "/ckpt")) EXPECT_TRUE(fs::is_empty(out.str() + "/ckpt")) << "staging left behind";
}

// A produced tensor is made only while the file is written, once per write, and casts and splits as a stored
// one: the same bytes as add_f32 of its values.
TEST(HfStreamedConvert, ProducedTensorsCastAndSplitAsStoredOnes) {
  const std::vector<float> a = {1.0f, -2.5f, 3.25e-3f, 65504.0f}, b = {7.0f, 0.5f};
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    int calls = 0;
    SafetensorsWriter stored, produced;
    stored.add_f32("a", {2, 2}, a.data());
    stored.add_f32("b", {2}, b.data());
    produced.add_produced("a", "F32", {2, 2}, a.size() * 4, [&](uint8_t* out) {
      ++calls;
      std::memcpy(out, a.data(), a.size() * 4);
    });
    produced.add_produced("b", "F32", {2}, b.size() * 4, [&](uint8_t* out) { std::memcpy(out, b.data(), 8); });
    EXPECT_EQ(calls, 0);
    stored.cast_f32(dtype);
    produced.cast_f32(dtype);
    TempDir out(std::string("produced_") + dtype);
    std::vector<SafetensorsWriter> s = stored.split(8), p = produced.split(8);
    ASSERT_EQ(s.size(), 2u);
    ASSERT_EQ(p.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      const std::string x = out.str() + "/s" + std::to_string(k), y = out.str() + "/p" + std::to_string(k);
      s[k].write(x);
      p[k].write(y);
      EXPECT_EQ(file_bytes(x), file_bytes(y)) << "shard " << k;
    }
    EXPECT_EQ(calls, 1);
  }
}

// A tensor produced in pieces (an experts' tensor an expert at a time): each piece asked for once, in order,
// into a buffer of one piece; the same bytes as the whole tensor stored, cast too; a cast piece's float16
// overflow names the tensor's own index; pieces that split an element are refused.
TEST(HfStreamedConvert, ProducedPiecesWriteTheWholeTensor) {
  const std::vector<float> a = {1.0f, -2.5f, 3.25e-3f, 4.0f, 5.5f, -6.0f};
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    std::vector<int64_t> asked;
    SafetensorsWriter stored, produced;
    stored.add_f32("a", {3, 2}, a.data());
    produced.add_produced("a", "F32", {3, 2}, a.size() * 4, 3, [&](int64_t piece, uint8_t* out) {
      asked.push_back(piece);
      std::memcpy(out, a.data() + 2 * piece, 8);
    });
    stored.cast_f32(dtype);
    produced.cast_f32(dtype);
    TempDir out(std::string("pieces_") + dtype);
    stored.write(out.str() + "/s");
    produced.write(out.str() + "/p");
    EXPECT_EQ(file_bytes(out.str() + "/s"), file_bytes(out.str() + "/p"));
    EXPECT_EQ(asked, (std::vector<int64_t>{0, 1, 2}));
  }
  SafetensorsWriter big;
  big.add_produced("w", "F32", {4}, 16, 2, [](int64_t piece, uint8_t* out) {
    const float v[2] = {1.0f, piece == 1 ? 1e6f : 2.0f};
    std::memcpy(out, v, 8);
  });
  big.cast_f32("F16");
  TempDir out("pieces_overflow");
  hf_test::expect_one_line_error([&] { big.write(out.str() + "/w"); }, {"tensor w: value 1e+06 at index 3"});
  SafetensorsWriter odd;
  hf_test::expect_one_line_error(
      [&] { odd.add_produced("x", "F32", {3}, 12, 2, [](int64_t, uint8_t*) {}); },
      {"tensor 'x': 12 bytes do not split into 2 pieces of whole elements"});
}

}  // namespace
}  // namespace lattice
