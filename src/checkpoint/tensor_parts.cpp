#include "checkpoint/tensor_parts.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace lattice {
namespace {

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::vector<TensorPart> param_parts(const std::vector<ParamInfo>& infos, const float* flat, int tp_rank,
                                    const std::string& prefix) {
  std::vector<TensorPart> parts;
  parts.reserve(infos.size());
  for (const ParamInfo& p : infos) {
    if ((p.tp_duplicated && tp_rank != 0) || p.shared_embedding_copy) continue;  // saved once
    for (const ParamBox& box : param_boxes(p, tp_rank)) {
      TensorPart t;
      t.name = prefix + p.name;
      t.global_shape = p.global_shape;
      t.offsets = box.offsets;
      t.lengths = box.lengths;
      t.data = flat ? flat + p.offset + box.local_offset : nullptr;
      parts.push_back(std::move(t));
    }
  }
  return parts;
}

void add_parts(CheckpointWriter& w, const std::string& file, const std::vector<TensorPart>& parts, bool borrow) {
  for (const TensorPart& t : parts)
    w.add_piece(file, t.name, "F32", t.global_shape, t.offsets, t.lengths, t.data, borrow);
}

bool is_vocab_padded(const std::string& param_name) {
  return param_name == "embedding.word_embeddings.weight" || param_name == "output_layer.weight";
}

void read_param_part(const CheckpointReader& r, const std::string& name, const ParamInfo& info, float* dst) {
  const TensorEntry& e = r.tensor(name);
  const bool vocab = is_vocab_padded(info.name) && !info.global_shape.empty();
  bool same = e.shape.size() == info.global_shape.size();
  for (size_t d = 0; same && d < e.shape.size(); ++d) same = e.shape[d] == info.global_shape[d] || (vocab && d == 0);
  if (!same)
    LATTICE_FAIL() << "checkpoint " << r.iter_dir() << ": tensor '" << name << "' has shape " << dims_str(e.shape)
                   << ", the model expects " << dims_str(info.global_shape);
  if (info.tp_blocks > 1) {  // every box whole (only the vocabulary tensors' dim 0 may differ)
    for (const ParamBox& box : param_boxes(info, param_tp_rank(info)))
      r.read_slice(name, "F32", box.offsets, box.lengths, dst + box.local_offset);
    return;
  }
  std::vector<int64_t> offsets = info.global_offsets, lengths = info.shape;
  if (lengths.empty()) {  // a scalar
    r.read_slice(name, "F32", offsets, lengths, dst);
    return;
  }
  // Rows of the box that the checkpoint has (all of them but for a vocabulary tensor saved
  // with less padding); dim 0 is outermost, so they are a prefix of dst.
  const int64_t rows = std::clamp<int64_t>(e.shape[0] - offsets[0], 0, lengths[0]);
  const int64_t row_elems = lengths[0] > 0 ? info.numel / lengths[0] : 0;
  if (rows > 0) {
    lengths[0] = rows;
    r.read_slice(name, "F32", offsets, lengths, dst);
  }
  std::fill(dst + rows * row_elems, dst + info.numel, 0.0f);
}

void place_part(const TensorPart& part, float* whole) {
  const size_t nd = part.global_shape.size();
  if (nd == 0) {
    whole[0] = part.data[0];
    return;
  }
  const int64_t run = part.lengths[nd - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < nd; ++d) outer *= part.lengths[d];
  std::vector<int64_t> idx(nd - 1, 0);  // the row's index in the box, last dim fastest
  for (int64_t k = 0; k < outer; ++k) {
    int64_t g = 0;
    for (size_t d = 0; d + 1 < nd; ++d) g = g * part.global_shape[d] + part.offsets[d] + idx[d];
    g = g * part.global_shape[nd - 1] + part.offsets[nd - 1];
    std::copy(part.data + k * run, part.data + (k + 1) * run, whole + g);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < part.lengths[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace lattice
