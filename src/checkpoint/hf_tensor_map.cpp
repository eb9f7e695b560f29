#include "checkpoint/hf_tensor_map.h"

#include <algorithm>
#include <cstring>

#include "checkpoint/hf_common.h"
#include "checkpoint/host_staging.h"
#include "checkpoint/tensor_parts.h"
#include "core/error.h"

namespace lattice::hf {

TensorMap grouped_qkv(const TransformerConfig& c, const std::string& lattice, const std::string& hf, const char* kind) {
  const int64_t D = c.kv_channels, G = c.num_query_groups, R = c.num_attention_heads / G;
  const std::string tail = std::string("_proj.") + kind;
  TensorMap qkv{lattice, {}};
  for (int64_t g = 0; g < G; ++g) {  // the group's heads' queries, then its key and value
    qkv.blocks.push_back({hf + "q" + tail, g * R * D, R * D});
    qkv.blocks.push_back({hf + "k" + tail, g * D, D});
    qkv.blocks.push_back({hf + "v" + tail, g * D, D});
  }
  return qkv;
}

void check_tensor_shapes(const SafetensorsFile& f, const std::map<std::string, Shape>& shapes) {
  for (const auto& [name, shape] : shapes) {
    if (!f.has(name)) LATTICE_FAIL() << f.path() << ": missing tensor " << name;
    if (f.get(name).shape != shape)
      LATTICE_FAIL() << f.path() << ": tensor " << name << " has shape " << shape_str(f.get(name).shape)
                     << ", config.json implies " << shape_str(shape);
  }
}

void check_no_other_tensors(const SafetensorsFile& f, const std::map<std::string, Shape>& shapes,
                            const TransformerConfig& c, const std::function<bool(const std::string&)>& skip) {
  for (const std::string& name : f.names()) {
    if (shapes.count(name) || (skip && skip(name))) continue;
    if (name == "lm_head.weight" && !c.untie_embeddings_and_output_weights) {
      // Tied: a stored lm_head must be embed_tokens itself, or the model is not the one config.json describes.
      if (f.get(name).shape != f.get("model.embed_tokens.weight").shape ||
          read_float_tensor(f, name) != read_float_tensor(f, "model.embed_tokens.weight"))
        LATTICE_FAIL() << f.path() << ": lm_head.weight differs from model.embed_tokens.weight but config.json ties "
                       << "them (tie_word_embeddings true)";
      continue;
    }
    LATTICE_FAIL() << f.path() << ": unexpected tensor " << name << " (config.json has num_hidden_layers "
                   << c.num_layers << ")";
  }
}

void fill_parameter(const SafetensorsFile& f, const TensorMap& m, const std::map<std::string, Shape>& shapes,
                    const ParamInfo& p, float* dst) {
  const int64_t row = p.shape.size() >= 2 ? p.numel / p.shape[0] : 1;  // elements per row
  int64_t at = 0;                                                      // rows filled
  for (const RowBlock& b : m.blocks) {
    const int64_t rows = b.rows < 0 ? shapes.at(b.hf)[0] : b.rows;
    LATTICE_CHECK((at + rows) * row <= p.numel) << m.lattice << ": the HF rows overrun it";
    read_float_elements(f, b.hf, b.row0 * row, rows * row, dst + at * row);
    at += rows;
  }
  LATTICE_CHECK(m.vocab ? at <= p.shape[0] : at * row == p.numel) << m.lattice << ": the HF rows do not fill it";
  if (m.offset != 0.0f)
    for (int64_t i = 0; i < at * row; ++i) dst[i] += m.offset;
  std::fill(dst + at * row, dst + p.numel, 0.0f);  // padded vocabulary rows
}

SafetensorsWriter export_tensors(const ParamBuffer& layout, const ParamRows& rows, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes) {
  // Per HF tensor, the parameters' rows that make it: rows [at, at + n) of p to its rows [row0, row0 + n), in rows
  // of the parameter's (a fused 3-D expert tensor [E, F, C] is E F rows of C).
  struct Piece {
    ParamInfo p;
    int64_t at, row0, n;
    float offset;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (const TensorMap& m : map) {
    const ParamInfo& p = layout.info(m.lattice);
    int64_t at = 0;
    for (const RowBlock& b : m.blocks) {
      const int64_t n = b.rows < 0 ? shapes.at(b.hf)[0] : b.rows;
      pieces[b.hf].push_back({p, at, b.row0, n, m.offset});
      at += n;
    }
  }
  SafetensorsWriter w;
  for (const auto& [name, shape] : shapes) {
    const int64_t numel = shape_numel(shape);
    w.add_produced(name, "F32", shape, size_t(numel) * sizeof(float),
                   [mine = pieces[name], numel, rows](uint8_t* out) {
                     float* to = reinterpret_cast<float*>(out);  // (zeroed: rows no parameter gives stay 0)
                     for (const Piece& k : mine) {
                       const int64_t row = k.p.shape.size() >= 2 ? k.p.numel / k.p.shape[0] : 1;
                       LATTICE_CHECK((k.row0 + k.n) * row <= numel) << k.p.name << ": rows past the HF tensor";
                       float* dst = to + k.row0 * row;
                       rows(k.p, k.at, k.n, dst);
                       if (k.offset != 0.0f)
                         for (int64_t i = 0; i < k.n * row; ++i) dst[i] -= k.offset;
                     }
                   });
  }
  w.set_metadata("format", "pt");
  return w;
}

ParamRows model_rows(const GPTModel& model) {
  auto params = std::make_shared<const HostStaging>(model.params().params(), model.params().numel(), true);
  return [params](const ParamInfo& p, int64_t row0, int64_t rows, float* out) {
    const int64_t row = p.shape.size() >= 2 ? p.numel / p.shape[0] : 1;
    std::memcpy(out, params->data() + p.offset + row0 * row, size_t(rows * row) * sizeof(float));
  };
}

std::vector<float> read_param(const ExportSource& src, const std::string& name) {
  std::vector<float> v(size_t(src.layout->info(name).numel), 0.0f);
  read_param_rows(src, name, v.data());
  return v;
}

void read_param_rows(const ExportSource& src, const std::string& name, float* dst) {
  const ParamInfo& p = src.layout->info(name);
  src.rows(p, 0, p.shape.size() < 2 ? p.numel : is_vocab_padded(name) ? src.config.vocab_size : p.shape[0], dst);
}

ExportSource model_source(const GPTModel& model) {
  return {model.config(), std::shared_ptr<const ParamBuffer>(&model.params(), [](const ParamBuffer*) {}),
          model_rows(model)};
}

ExportSource checkpoint_source(const LoadedModel& lm) {
  auto layout = std::make_shared<const ParamBuffer>(
      GPTModel::parameter_registry(lm.config, TensorParallel{}, ModelPlacement{}, 0, 1));
  return {lm.config, layout, checkpoint_param_rows(lm.reader)};
}

SafetensorsWriter export_tensors(const GPTModel& model, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes) {
  return export_tensors(model.params(), model_rows(model), map, shapes);
}

}  // namespace lattice::hf
