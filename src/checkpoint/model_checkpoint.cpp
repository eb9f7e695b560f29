#include "checkpoint/model_checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

constexpr const char* kFormatVersion = "1";

std::string iter_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", (long long)iteration);
  return buf;
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) LATTICE_FAIL() << tmp.string() << ": cannot open for writing";
    f << text;
    f.flush();
    if (!f) LATTICE_FAIL() << tmp.string() << ": write failed";
  }
  fs::rename(tmp, path);
}

}  // namespace

std::string save_model_checkpoint(const std::string& dir, int64_t iteration, const GPTModel& model,
                                  const std::string& args_json) {
  const TransformerConfig& c = model.config();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) LATTICE_FAIL() << "--save " << dir << ": cannot create directory: " << ec.message();
  fs::path iter_dir = fs::path(dir) / iter_dir_name(iteration);
  fs::create_directories(iter_dir, ec);
  if (ec) LATTICE_FAIL() << iter_dir.string() << ": cannot create directory: " << ec.message();

  SafetensorsWriter w;
  for (const ParamInfo& p : model.params().infos())
    w.add_f32(p.name, p.shape, model.params().params() + p.offset);
  auto args = nlohmann::json::parse(args_json);
  nlohmann::json config = {{"num_layers", c.num_layers},
                           {"hidden_size", c.hidden_size},
                           {"num_attention_heads", c.num_attention_heads},
                           {"ffn_hidden_size", c.ffn_hidden_size},
                           {"kv_channels", c.kv_channels},
                           {"vocab_size", c.vocab_size},
                           {"padded_vocab_size", c.padded_vocab_size},
                           {"max_position_embeddings", c.max_position_embeddings},
                           {"layernorm_epsilon", c.layernorm_epsilon},
                           {"openai_gelu", c.gelu == GeluKind::tanh},
                           {"untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights}};
  w.set_metadata("format_version", kFormatVersion);
  w.set_metadata("iteration", std::to_string(iteration));
  w.set_metadata("config", config.dump());
  w.set_metadata("args", args.dump());
  w.write((iter_dir / "model.safetensors").string());
  write_text_atomic(fs::path(dir) / "latest_checkpointed_iteration.txt", std::to_string(iteration) + "\n");
  return iter_dir.string();
}

void load_parameters(GPTModel& model, const std::string& path) {
  load_parameters(model, SafetensorsFile::read(path));
}

void load_parameters(GPTModel& model, const SafetensorsFile& f) {
  const std::string& path = f.path();
  for (const ParamInfo& p : model.params().infos()) {
    if (!f.has(p.name)) LATTICE_FAIL() << path << ": missing tensor " << p.name;
    const SafeTensor& t = f.get(p.name);
    if (t.shape != p.shape)
      LATTICE_FAIL() << path << ": tensor " << p.name << " has shape " << shape_str(t.shape)
                     << ", the model expects " << shape_str(p.shape);
    std::vector<float> v = f.get_f32(p.name);
    std::memcpy(model.params().params() + p.offset, v.data(), v.size() * sizeof(float));
  }
}

LoadedModel load_model_checkpoint(const std::string& dir, int64_t B) {
  fs::path iter_dir = dir;
  fs::path latest = fs::path(dir) / "latest_checkpointed_iteration.txt";
  if (fs::exists(latest)) {
    std::ifstream f(latest);
    long long it = -1;
    if (!(f >> it) || it < 0) LATTICE_FAIL() << latest.string() << ": not an iteration number";
    iter_dir = fs::path(dir) / iter_dir_name(it);
  }
  fs::path file = iter_dir / "model.safetensors";
  if (!fs::exists(file))
    LATTICE_FAIL() << "--load " << dir << ": no checkpoint (" << file.string() << " does not exist)";
  SafetensorsFile f = SafetensorsFile::read(file.string());
  const auto& meta = f.metadata();
  auto get = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) LATTICE_FAIL() << file.string() << ": metadata has no " << key;
    return it->second;
  };
  if (get("format_version") != kFormatVersion)
    LATTICE_FAIL() << file.string() << ": checkpoint format version " << get("format_version")
                   << ", this lattice reads " << kFormatVersion;
  nlohmann::json cj, aj;
  try {
    cj = nlohmann::json::parse(get("config"));
    aj = nlohmann::json::parse(get("args"));
  } catch (const nlohmann::json::exception& e) {
    LATTICE_FAIL() << file.string() << ": invalid config metadata: " << e.what();
  }
  TransformerConfig c;
  c.num_layers = cj.at("num_layers");
  c.hidden_size = cj.at("hidden_size");
  c.num_attention_heads = cj.at("num_attention_heads");
  c.ffn_hidden_size = cj.at("ffn_hidden_size");
  c.kv_channels = cj.at("kv_channels");
  c.vocab_size = cj.at("vocab_size");
  c.padded_vocab_size = cj.at("padded_vocab_size");
  c.max_position_embeddings = cj.at("max_position_embeddings");
  c.layernorm_epsilon = cj.at("layernorm_epsilon");
  c.gelu = cj.at("openai_gelu").get<bool>() ? GeluKind::tanh : GeluKind::erf;
  c.untie_embeddings_and_output_weights = cj.at("untie_embeddings_and_output_weights");
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  LoadedModel out;
  out.seq_length = aj.value("seq-length", int64_t(0));
  out.tokenizer_type = aj.value("tokenizer-type", std::string());
  out.iteration = std::stoll(get("iteration"));
  out.model = std::make_unique<GPTModel>(c, B, c.max_position_embeddings);
  load_parameters(*out.model, f);
  return out;
}

}  // namespace lattice
