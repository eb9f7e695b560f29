#include "checkpoint/hf_common.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "checkpoint/host_staging.h"
#include "kernels/cast_math.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice::hf {

namespace {

using json = nlohmann::json;

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
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) LATTICE_FAIL() << path.string() << ": cannot rename " << tmp.string() << ": " << ec.message();
}

}  // namespace

std::vector<float> read_float_tensor(const SafetensorsFile& f, const std::string& name) {
  std::vector<float> out(size_t(f.get(name).numel()));
  read_float_elements(f, name, 0, int64_t(out.size()), out.data());
  return out;
}

void read_float_elements(const SafetensorsFile& f, const std::string& name, int64_t first, int64_t count, float* out) {
  const SafeTensor& t = f.get(name);
  LATTICE_CHECK(first >= 0 && count >= 0 && first + count <= t.numel())
      << f.path() << ": elements [" << first << ", " << first + count << ") of tensor " << name << " of "
      << t.numel();
  if (t.dtype == "F32") {
    std::memcpy(out, t.bytes.data() + 4 * first, size_t(count) * sizeof(float));
    return;
  }
  if (t.dtype != "BF16" && t.dtype != "F16")
    LATTICE_FAIL() << f.path() << ": tensor " << name << " has dtype " << t.dtype << ", expected F32, F16 or BF16";
  const bool bf16 = t.dtype == "BF16";
  const uint8_t* p = t.bytes.data() + 2 * first;
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t u = uint16_t(p[2 * i] | (p[2 * i + 1] << 8));
    if (bf16) {
      const uint32_t bits = uint32_t(u) << 16;
      std::memcpy(&out[i], &bits, 4);
    } else {
      out[i] = math::fp16_to_fp32(u);
    }
  }
}

int64_t config_int(const json& j, const std::string& what, const char* key) {
  if (!j.contains(key)) LATTICE_FAIL() << what << ": missing " << key;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
    LATTICE_FAIL() << what << ": " << key << " must be a positive integer, got " << j[key].dump();
  return j[key].get<int64_t>();
}

bool config_bool(const json& j, const std::string& what, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) LATTICE_FAIL() << what << ": " << key << " must be true or false, got " << j[key].dump();
  return j[key].get<bool>();
}

double config_positive(const json& j, const std::string& what, const char* key, double fallback) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_number() || !(j[key].get<double>() > 0) || !std::isfinite(j[key].get<double>()))
    LATTICE_FAIL() << what << ": " << key << " must be a positive number, got " << j[key].dump();
  return j[key].get<double>();
}

double shortest_float(float v) {
  char s[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(s, sizeof s, "%.*g", digits, double(v));
    if (std::strtof(s, nullptr) == v) break;
  }
  return std::stod(s);
}

SafetensorsWriter f32_model_tensors(const std::map<std::string, Shape>& shapes,
                                    std::map<std::string, std::vector<float>>&& data) {
  SafetensorsWriter w;  // the values moved in, not copied: a model's export holds them once
  for (const auto& [name, shape] : shapes) w.add_f32(name, shape, std::move(data.at(name)));
  w.set_metadata("format", "pt");
  return w;
}

std::string python_json_numbers(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      out += ch;
      if (ch == '\\' && i + 1 < text.size()) out += text[++i];
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    auto token = [&](const char* t) { return text.compare(i, std::strlen(t), t) == 0; };
    if (token("-Infinity")) {
      out += "-1e308";
      i += 8;
    } else if (token("Infinity")) {
      out += "1e308";
      i += 7;
    } else if (token("NaN")) {
      out += "null";
      i += 2;
    } else {
      out += ch;
    }
  }
  return out;
}

json read_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) LATTICE_FAIL() << "--from-hf " << dir << ": cannot open " << path.string();
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(python_json_numbers(text.str()));
  } catch (const json::exception& e) {
    LATTICE_FAIL() << path.string() << ": invalid JSON: " << e.what();
  }
  if (!j.is_object()) LATTICE_FAIL() << path.string() << ": not a JSON object";
  return j;
}

std::string recorded_tokenizer(const json& j, const std::string& what) {
  if (!j.contains(kHfTokenizerKey)) return "";
  if (!j[kHfTokenizerKey].is_string()) LATTICE_FAIL() << what << ": " << kHfTokenizerKey << " must be a string";
  return j[kHfTokenizerKey].get<std::string>();
}

HfModel load_source(const HfSource& src, int64_t seq_length, bool gradients) {
  const TransformerConfig& c = src.config;
  HfModel out;
  out.tokenizer_type = src.tokenizer_type;
  out.model = std::make_unique<GPTModel>(c, 1, seq_length > 0 ? seq_length : c.max_position_embeddings,
                                         TensorParallel{}, ModelPlacement{}, nullptr, ContextParallel{}, gradients);
  ParamBuffer& params = out.model->params();
  HostStaging staged(params.params(), params.numel(), true);
  for (const ParamInfo& p : params.infos()) src.fill(p, staged.data() + p.offset);
  staged.upload(params.params());
  return out;
}

OpenedFolder open_folder(const std::string& dir, const ConfigFn& config) {
  OpenedFolder o;
  o.config_json = read_config(dir);
  const std::string config_path = dir + "/config.json";
  o.file = std::make_shared<const SafetensorsFile>(read_model_file(dir));
  o.source.config = config(o.config_json, config_path, *o.file);
  o.source.tokenizer_type = recorded_tokenizer(o.config_json, config_path);
  return o;
}

HfSource open_planned_folder(const std::string& dir, const ConfigFn& config, const PlanFn& plan) {
  OpenedFolder o = open_folder(dir, config);
  HfSource& out = o.source;
  const auto& f = o.file;
  auto p = std::make_shared<const ImportPlan>(plan(out.config, *f, o.config_json));
  auto by_name = std::make_shared<std::map<std::string, const TensorMap*>>();
  for (const TensorMap& m : p->map) (*by_name)[m.lattice] = &m;
  // Every parameter the plan fills must be the model's.
  const ParamBuffer registry = GPTModel::parameter_registry(out.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const TensorMap& m : p->map) LATTICE_CHECK(registry.has(m.lattice)) << m.lattice << ": not a parameter";
  out.fill = [f, p, by_name](const ParamInfo& info, float* dst) {
    const auto it = by_name->find(info.name);
    if (it == by_name->end()) {
      std::fill(dst, dst + info.numel, 0.0f);  // (a router's expert bias the file lacks)
      return;
    }
    fill_parameter(*f, *it->second, p->shapes, info, dst);
    for (const RowBlock& b : it->second->blocks) f->release(b.hf);  // (the input's pages: no model's worth held)
  };
  return out;
}

SafetensorsFile read_model_file(const std::string& dir) {
  const fs::path path = fs::path(dir) / "model.safetensors";
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(path) || !fs::exists(index_path)) {
    if (!fs::exists(path))
      LATTICE_FAIL() << "--from-hf " << dir << ": " << path.string() << " does not exist (nor " << index_path.filename().string()
                     << ")";
    return SafetensorsFile::read(path.string());
  }
  // A sharded model: the index's weight_map names each tensor's file.
  const std::string what = index_path.string();
  std::ifstream in(index_path);
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    LATTICE_FAIL() << what << ": invalid JSON: " << e.what();
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
      index["weight_map"].empty())
    LATTICE_FAIL() << what << ": no weight_map (tensor name -> shard file)";
  std::map<std::string, std::vector<std::string>> by_file;  // shard -> its tensors
  for (const auto& [name, file] : index["weight_map"].items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : "";
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
      LATTICE_FAIL() << what << ": tensor " << name << " maps to " << file.dump() << ", not a file in " << dir;
    by_file[f].push_back(name);
  }
  for (const auto& [file, names] : by_file)
    if (!fs::exists(fs::path(dir) / file))
      LATTICE_FAIL() << what << ": shard " << (fs::path(dir) / file).string() << " does not exist";
  std::vector<SafetensorsFile> shards;
  for (const auto& [file, names] : by_file) {
    const fs::path shard = fs::path(dir) / file;
    shards.push_back(SafetensorsFile::read(shard.string()));
    const SafetensorsFile& s = shards.back();
    for (const std::string& name : names)
      if (!s.has(name)) LATTICE_FAIL() << shard.string() << ": no tensor " << name << " (" << what << " puts it there)";
    if (s.names().size() != names.size())
      for (const std::string& name : s.names())
        if (index["weight_map"].value(name, std::string()) != file)
          LATTICE_FAIL() << shard.string() << ": tensor " << name << " is not in " << what << "'s weight_map for it";
  }
  return SafetensorsFile::combine(what, std::move(shards));
}

ExportOptions parse_export_options(const std::string& dtype, const std::string& max_shard_size) {
  ExportOptions o;
  if (!dtype.empty()) {
    static const std::map<std::string, std::string> names = {
        {"float32", "float32"}, {"fp32", "float32"}, {"bfloat16", "bfloat16"},
        {"bf16", "bfloat16"},   {"float16", "float16"}, {"fp16", "float16"}};
    const auto it = names.find(dtype);
    if (it == names.end())
      LATTICE_FAIL() << "--hf-dtype must be float32, bfloat16 or float16 (or fp32, bf16, fp16), got '" << dtype << "'";
    o.dtype = it->second;
  }
  if (!max_shard_size.empty()) {
    size_t digits = 0;
    while (digits < max_shard_size.size() && std::isdigit(static_cast<unsigned char>(max_shard_size[digits]))) ++digits;
    std::string unit = max_shard_size.substr(digits);
    for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    static const std::map<std::string, uint64_t> units = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1000ull},
                                                          {"MB", 1000ull * 1000},
                                                          {"GB", 1000ull * 1000 * 1000},
                                                          {"KIB", 1ull << 10},
                                                          {"MIB", 1ull << 20},
                                                          {"GIB", 1ull << 30}};
    const auto it = units.find(unit);
    uint64_t n = 0;
    const bool fits = digits > 0 && digits <= 12;
    if (fits) n = std::stoull(max_shard_size.substr(0, digits));
    if (it == units.end() || !fits || n == 0 || n > UINT64_MAX / it->second)
      LATTICE_FAIL() << "--max-shard-size must be a positive size such as 5GB, 500MB, 2GiB or a byte count, got '"
                     << max_shard_size << "'";
    o.max_shard_bytes = n * it->second;
  }
  return o;
}

void write_model_folder(const std::string& dir, SafetensorsWriter tensors, json config, const ExportOptions& options) {
  tensors.cast_f32(options.dtype == "bfloat16" ? "BF16" : options.dtype == "float16" ? "F16" : "F32");
  config["torch_dtype"] = options.dtype;
  const uint64_t total = tensors.data_bytes();
  std::vector<SafetensorsWriter> shards = tensors.split(options.max_shard_bytes);
  std::error_code ec;
  const bool existed = fs::exists(dir);
  fs::create_directories(dir, ec);
  if (ec) LATTICE_FAIL() << "--to-hf " << dir << ": cannot create directory: " << ec.message();
  // The tensors are made as they are written (a value float16 cannot hold, an unreadable checkpoint tensor may
  // stop it midway): a failed export removes what it wrote, and the folder if it made it.
  std::vector<fs::path> written;
  try {
    if (shards.size() <= 1) {
      written.push_back(fs::path(dir) / "model.safetensors");
      (shards.empty() ? tensors : shards[0]).write(written.back().string());
    } else {
      // transformers' names and index: {"metadata": {"total_size"}, "weight_map": {tensor: file}}.
      json weight_map = json::object();
      for (size_t i = 0; i < shards.size(); ++i) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
        written.push_back(fs::path(dir) / name);
        shards[i].write(written.back().string());
        for (const std::string& t : shards[i].names()) weight_map[t] = name;
      }
      const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      written.push_back(fs::path(dir) / "model.safetensors.index.json");
      write_text_atomic(written.back(), index.dump(2) + "\n");
    }
    written.push_back(fs::path(dir) / "config.json");
    write_text_atomic(written.back(), config.dump(2) + "\n");
  } catch (...) {
    std::error_code ignored;
    for (const fs::path& p : written) fs::remove(p, ignored);
    if (!existed) fs::remove_all(dir, ignored);
    throw;
  }
}

std::vector<int> qwen_moe_layers(const nlohmann::json& j, const std::string& what, int64_t layers) {
  const int64_t step = j.contains("decoder_sparse_step") ? config_int(j, what, "decoder_sparse_step") : 1;
  std::vector<int> pattern(static_cast<size_t>(layers), 0);
  for (int64_t l = 0; l < layers; ++l) pattern[size_t(l)] = (l + 1) % step == 0 ? 1 : 0;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const nlohmann::json& dense = j["mlp_only_layers"];
    if (!dense.is_array()) LATTICE_FAIL() << what << ": mlp_only_layers " << dense.dump() << " is not a list";
    for (const nlohmann::json& l : dense) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers)
        LATTICE_FAIL() << what << ": mlp_only_layers entry " << l.dump() << " is not a layer in [0, " << layers << ")";
      pattern[size_t(l.get<int64_t>())] = 0;
    }
  }
  return pattern;  // all ones: finalize() makes it the empty pattern
}

double rope_value(const nlohmann::json& j, const std::string& what, const char* key, double fallback) {
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains(key))
    return config_positive(j["rope_parameters"], what + " rope_parameters", key, fallback);
  if (j.contains(key) && !j[key].is_null()) return config_positive(j, what, key, fallback);
  return fallback;
}

void read_decoder_sizes(const nlohmann::json& j, const std::string& what, TransformerConfig& c) {
  c.num_layers = config_int(j, what, "num_hidden_layers");
  c.hidden_size = config_int(j, what, "hidden_size");
  c.num_attention_heads = config_int(j, what, "num_attention_heads");
  c.vocab_size = config_int(j, what, "vocab_size");
  c.max_position_embeddings = config_int(j, what, "max_position_embeddings");
}

void read_grouped_heads(const nlohmann::json& j, const std::string& what, TransformerConfig& c, bool head_dim) {
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  c.num_query_groups = has("num_key_value_heads") ? config_int(j, what, "num_key_value_heads") : c.num_attention_heads;
  if (c.num_attention_heads % c.num_query_groups != 0)
    LATTICE_FAIL() << what << ": num_key_value_heads " << c.num_query_groups << " does not divide num_attention_heads "
                   << c.num_attention_heads;
  if (head_dim && has("head_dim")) {
    c.kv_channels = config_int(j, what, "head_dim");
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    LATTICE_FAIL() << what << ": num_attention_heads " << c.num_attention_heads << " does not divide hidden_size "
                   << c.hidden_size << " (and no head_dim)";
  }
}

void read_partial_rope(const nlohmann::json& j, const std::string& what, double partial, TransformerConfig& c) {
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    LATTICE_FAIL() << what << ": rope_scaling " << j["rope_scaling"].dump() << " is not supported (none)";
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].value("rope_type", std::string("default")) != "default")
    LATTICE_FAIL() << what << ": rope_parameters rope_type " << j["rope_parameters"]["rope_type"].dump()
                   << " is not supported (default)";
  c.position_embedding_type = "rope";
  c.rotary_base = float(rope_value(j, what, "rope_theta", 10000.0));
  c.rotary_percent = rope_value(j, what, "partial_rotary_factor", partial);
  if (c.rotary_percent > 1.0) LATTICE_FAIL() << what << ": partial_rotary_factor " << c.rotary_percent << " exceeds 1";
  c.rotary_interleaved = false;
}

std::vector<int> deepseek_moe_layers(int64_t layers, int64_t first_k_dense_replace, int64_t moe_layer_freq) {
  std::vector<int> pattern(size_t(layers), 0);
  for (int64_t l = first_k_dense_replace; l < layers; ++l) pattern[size_t(l)] = l % moe_layer_freq == 0 ? 1 : 0;
  return pattern;
}

int64_t nextn_predict_layers(const nlohmann::json& j, const std::string& what, const SafetensorsFile& f) {
  if (!j.contains("num_nextn_predict_layers") || j["num_nextn_predict_layers"].is_null()) return 0;
  const nlohmann::json& v = j["num_nextn_predict_layers"];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    LATTICE_FAIL() << what << ": num_nextn_predict_layers " << v.dump() << " is not a count of layers";
  const std::string first = "model.layers." + std::to_string(config_int(j, what, "num_hidden_layers")) + ".eh_proj.weight";
  return f.has(first) ? v.get<int64_t>() : 0;
}

int64_t deepseek_first_k_dense(const TransformerConfig& c) {
  int64_t first = 0;
  while (first < c.num_layers && !c.moe_layer(first)) ++first;
  for (int64_t l = first; l < c.num_layers; ++l)
    if (!c.moe_layer(l)) return -1;
  return first;
}

}  // namespace lattice::hf
