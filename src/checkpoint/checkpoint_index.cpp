#include "checkpoint/checkpoint_index.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace lattice {
namespace {

using json = nlohmann::json;

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::vector<int64_t> int_array(const json& j, const std::string& what, const std::string& where) {
  if (!j.is_array()) LATTICE_FAIL() << where << ": " << what << " is not an array of integers";
  std::vector<int64_t> out;
  for (const json& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      LATTICE_FAIL() << where << ": " << what << " is not an array of non-negative integers";
    out.push_back(v.get<int64_t>());
  }
  return out;
}

bool boxes_overlap(const TensorPiece& a, const TensorPiece& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (lo >= hi) return false;
  }
  return true;
}

void validate_entry(const std::string& name, const TensorEntry& t, const CheckpointIndex& idx,
                    const std::string& where) {
  const std::string what = where + ": tensor '" + name + "'";
  size_t esize = 0;
  try {
    esize = safetensors_dtype_size(t.dtype);
  } catch (const Error&) {
    LATTICE_FAIL() << what << ": unknown dtype '" << t.dtype << "'";
  }
  (void)esize;
  if (t.pieces.empty()) LATTICE_FAIL() << what << ": has no pieces";
  int64_t covered = 0;
  for (size_t k = 0; k < t.pieces.size(); ++k) {
    const TensorPiece& p = t.pieces[k];
    if (p.key.empty()) LATTICE_FAIL() << what << ": piece " << k << " has an empty key";
    if (!idx.files.count(p.file))
      LATTICE_FAIL() << what << ": piece " << k << " is in file '" << p.file << "', which the index does not list";
    if (p.offsets.size() != t.shape.size() || p.lengths.size() != t.shape.size())
      LATTICE_FAIL() << what << ": piece " << k << " has offsets " << dims_str(p.offsets) << " lengths "
                     << dims_str(p.lengths) << ", which do not match the rank of shape " << dims_str(t.shape);
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (p.offsets[d] + p.lengths[d] > t.shape[d])
        LATTICE_FAIL() << what << ": piece " << k << " (offsets " << dims_str(p.offsets) << ", lengths "
                       << dims_str(p.lengths) << ") lies outside the global shape " << dims_str(t.shape);
    for (size_t j = 0; j < k; ++j)
      if (box_numel(p.lengths) > 0 && box_numel(t.pieces[j].lengths) > 0 && boxes_overlap(p, t.pieces[j]))
        LATTICE_FAIL() << what << ": pieces " << j << " and " << k << " overlap";
    covered += box_numel(p.lengths);
  }
  // Disjoint boxes inside the shape whose sizes add up to the whole cover it exactly.
  if (covered != box_numel(t.shape))
    LATTICE_FAIL() << what << ": pieces cover " << covered << " of its " << box_numel(t.shape) << " elements";
}

}  // namespace

int64_t box_numel(const std::vector<int64_t>& lengths) {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

json CheckpointIndex::tensors_json() const {
  json out = json::object();
  for (const auto& [name, t] : tensors) {
    json pieces = json::array();
    for (const TensorPiece& p : t.pieces)
      pieces.push_back({{"file", p.file}, {"key", p.key}, {"offsets", p.offsets}, {"lengths", p.lengths}});
    out[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"pieces", pieces}};
  }
  return out;
}

json CheckpointIndex::files_json() const {
  json out = json::object();
  for (const auto& [name, f] : files) out[name] = {{"bytes", f.bytes}, {"crc32", crc32_hex(f.crc32)}};
  return out;
}

CheckpointIndex CheckpointIndex::from_json(const json& tensors, const json& files,
                                           const std::string& where) {
  CheckpointIndex idx;
  if (!files.is_object()) LATTICE_FAIL() << where << ": 'files' is not a JSON object";
  for (auto it = files.begin(); it != files.end(); ++it) {
    const json& f = it.value();
    const std::string& name = it.key();
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
      LATTICE_FAIL() << where << ": file name '" << name << "' is not a plain file name";
    FileEntry e;
    if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_integer() || f["bytes"].get<int64_t>() < 0 ||
        !f.contains("crc32") || !f["crc32"].is_string() ||
        !parse_crc32_hex(f["crc32"].get<std::string>(), &e.crc32))
      LATTICE_FAIL() << where << ": file '" << name << "' needs {\"bytes\": N, \"crc32\": \"8 hex digits\"}";
    e.bytes = f["bytes"].get<uint64_t>();
    idx.files[name] = e;
  }
  if (!tensors.is_object()) LATTICE_FAIL() << where << ": 'tensors' is not a JSON object";
  std::set<std::pair<std::string, std::string>> keys;  // (file, key): each names one stored tensor
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const std::string& name = it.key();
    const json& t = it.value();
    const std::string what = "tensor '" + name + "'";
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t.contains("pieces") || !t["pieces"].is_array())
      LATTICE_FAIL() << where << ": " << what << " needs dtype, shape and pieces";
    TensorEntry e;
    e.dtype = t["dtype"].get<std::string>();
    e.shape = int_array(t["shape"], what + " shape", where);
    for (const json& p : t["pieces"]) {
      if (!p.is_object() || !p.contains("file") || !p["file"].is_string() || !p.contains("key") ||
          !p["key"].is_string() || !p.contains("offsets") || !p.contains("lengths"))
        LATTICE_FAIL() << where << ": " << what << ": a piece needs file, key, offsets and lengths";
      e.pieces.push_back({p["file"].get<std::string>(), p["key"].get<std::string>(),
                          int_array(p["offsets"], what + " offsets", where),
                          int_array(p["lengths"], what + " lengths", where)});
      if (!keys.insert({e.pieces.back().file, e.pieces.back().key}).second)
        LATTICE_FAIL() << where << ": " << what << ": key '" << e.pieces.back().key << "' is used twice in file '"
                       << e.pieces.back().file << "'";
    }
    validate_entry(name, e, idx, where);
    idx.tensors.emplace(name, std::move(e));
  }
  return idx;
}

namespace {

// Appends the boxes of the range [begin, end) of the sub-tensor at `prefix` (fixed
// indices of dims < d, each with length 1) to out.
void append_range_boxes(const std::vector<int64_t>& shape, size_t d, std::vector<int64_t>& prefix, int64_t begin,
                        int64_t end, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t R = shape.size();
  int64_t inner = 1;  // elements of one index step along dim d
  for (size_t k = d + 1; k < R; ++k) inner *= shape[k];
  auto emit = [&](int64_t first, int64_t count) {  // rows [first, first + count) of dim d, whole below
    Box b;
    b.offsets = prefix;
    b.lengths.assign(prefix.size(), 1);
    b.offsets.push_back(first);
    b.lengths.push_back(count);
    for (size_t k = d + 1; k < R; ++k) {
      b.offsets.push_back(0);
      b.lengths.push_back(shape[k]);
    }
    out.push_back(std::move(b));
  };
  auto recurse = [&](int64_t row, int64_t b, int64_t e) {  // part of one row
    prefix.push_back(row);
    append_range_boxes(shape, d + 1, prefix, b, e, out);
    prefix.pop_back();
  };
  int64_t first = begin / inner;
  const int64_t last = end / inner;  // rows before `last` end inside the range
  if (first == last) return recurse(first, begin % inner, end % inner);
  if (begin % inner != 0) recurse(first++, begin % inner, inner);
  if (last > first) emit(first, last - first);
  if (end % inner != 0) recurse(last, 0, end % inner);
}

}  // namespace

std::vector<Box> flat_range_to_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  LATTICE_CHECK(0 <= begin && begin <= end && end <= box_numel(shape)) << "range [" << begin << ", " << end << ")";
  std::vector<Box> out;
  if (shape.empty()) {
    if (begin < end) out.push_back({{}, {}});
    return out;
  }
  std::vector<int64_t> prefix;
  append_range_boxes(shape, 0, prefix, begin, end, out);
  return out;
}

int64_t copy_box_intersection(const std::vector<int64_t>& piece_off,
                              const std::vector<int64_t>& piece_len, const void* piece,
                              const std::vector<int64_t>& want_off,
                              const std::vector<int64_t>& want_len, void* out, size_t esize) {
  const size_t R = piece_off.size();
  LATTICE_CHECK(piece_len.size() == R && want_off.size() == R && want_len.size() == R);
  // The intersection box, in global coordinates: [lo, hi) per dim.
  std::vector<int64_t> lo(R), hi(R);
  for (size_t d = 0; d < R; ++d) {
    lo[d] = std::max(piece_off[d], want_off[d]);
    hi[d] = std::min(piece_off[d] + piece_len[d], want_off[d] + want_len[d]);
    if (lo[d] >= hi[d]) return 0;
  }
  const auto* src = static_cast<const uint8_t*>(piece);
  auto* dst = static_cast<uint8_t*>(out);
  if (R == 0) {  // scalar
    std::memcpy(dst, src, esize);
    return 1;
  }
  // Contiguous runs along the last dim; walk the other dims with an odometer.
  const int64_t run = hi[R - 1] - lo[R - 1];
  std::vector<int64_t> idx(lo);  // current global index (last dim fixed at lo)
  int64_t copied = 0;
  for (;;) {
    int64_t s = 0, t = 0;  // row-major element offsets in the piece and in out
    for (size_t d = 0; d < R; ++d) {
      s = s * piece_len[d] + (idx[d] - piece_off[d]);
      t = t * want_len[d] + (idx[d] - want_off[d]);
    }
    std::memcpy(dst + size_t(t) * esize, src + size_t(s) * esize, size_t(run) * esize);
    copied += run;
    size_t d = R - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return copied;
    }
    if (R == 1) return copied;
  }
}

}  // namespace lattice
