#include "checkpoint/hf_tensor_map.h"

#include <algorithm>
#include <cstring>

#include "checkpoint/hf_common.h"
#include "checkpoint/host_staging.h"
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

void import_tensors(GPTModel& model, const SafetensorsFile& f, const std::vector<TensorMap>& map,
                    const std::map<std::string, Shape>& shapes) {
  // Each HF tensor read once, when first needed, and dropped after the last parameter that reads it: a
  // model's worth of fp32 copies is never held at once.
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < map.size(); ++i)
    for (const RowBlock& b : map[i].blocks) last_use[b.hf] = i;
  std::map<std::string, std::vector<float>> data;
  HostStaging params(model.params().params(), model.params().numel(), true);
  for (size_t i = 0; i < map.size(); ++i) {
    const TensorMap& m = map[i];
    const ParamInfo& p = model.params().info(m.lattice);
    float* dst = params.data() + p.offset;
    const int64_t row = p.shape.size() >= 2 ? p.numel / p.shape[0] : 1;  // elements per row
    int64_t at = 0;                                              // rows filled
    for (const RowBlock& b : m.blocks) {
      auto it = data.find(b.hf);
      if (it == data.end()) it = data.emplace(b.hf, read_float_tensor(f, b.hf)).first;
      const int64_t rows = b.rows < 0 ? shapes.at(b.hf)[0] : b.rows;
      std::memcpy(dst + at * row, it->second.data() + b.row0 * row, size_t(rows * row) * sizeof(float));
      at += rows;
    }
    LATTICE_CHECK(m.vocab ? at <= p.shape[0] : at * row == p.numel) << m.lattice << ": the HF rows do not fill it";
    if (m.offset != 0.0f)
      for (int64_t i = 0; i < at * row; ++i) dst[i] += m.offset;
    std::fill(dst + at * row, dst + p.numel, 0.0f);  // padded vocabulary rows
    for (const RowBlock& b : m.blocks)
      if (last_use.at(b.hf) == i) data.erase(b.hf);
  }
  params.upload(model.params().params());
}

SafetensorsWriter export_tensors(const GPTModel& model, const std::vector<TensorMap>& map,
                                 const std::map<std::string, Shape>& shapes) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : shapes) out[name].resize(size_t(shape_numel(shape)));
  const HostStaging params(model.params().params(), model.params().numel(), true);
  for (const TensorMap& m : map) {
    const ParamInfo& p = model.params().info(m.lattice);
    const float* src = params.data() + p.offset;
    const int64_t row = p.shape.size() >= 2 ? p.numel / p.shape[0] : 1;
    int64_t at = 0;
    for (const RowBlock& b : m.blocks) {
      const int64_t rows = b.rows < 0 ? shapes.at(b.hf)[0] : b.rows;
      float* to = out.at(b.hf).data() + b.row0 * row;
      std::memcpy(to, src + at * row, size_t(rows * row) * sizeof(float));
      if (m.offset != 0.0f)
        for (int64_t i = 0; i < rows * row; ++i) to[i] -= m.offset;
      at += rows;
    }
  }
  return f32_model_tensors(shapes, std::move(out));
}

}  // namespace lattice::hf
