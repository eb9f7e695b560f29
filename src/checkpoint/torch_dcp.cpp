#include "checkpoint/torch_dcp.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "checkpoint/tensor_parts.h"
#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_pickle.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice {

namespace {

std::vector<uint8_t> read_bytes(const fs::path& path, int64_t offset, int64_t length, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LATTICE_FAIL() << path.string() << ": cannot open (" << what << ")";
  if (length < 0) {
    f.seekg(0, std::ios::end);
    length = int64_t(f.tellg()) - offset;
  }
  std::vector<uint8_t> bytes(size_t(std::max<int64_t>(length, 0)));
  f.seekg(offset);
  f.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f || f.gcount() != std::streamsize(bytes.size()))
    LATTICE_FAIL() << path.string() << ": truncated: " << what << " lies at bytes [" << offset << ", "
                   << offset + length << ")";
  return bytes;
}

// A torch.Size (torch.Size((d0, d1, ...)) as pickled) or a tuple / list of integers.
std::vector<int64_t> dims_of(const PyRef& v, const std::string& what) {
  PyRef seq = v;
  if (v && v->is(PyValue::Kind::object) && v->qualified_name() == "torch.Size" && v->args && !v->args->items.empty())
    seq = v->args->items[0];
  if (!seq || (!seq->is(PyValue::Kind::tuple) && !seq->is(PyValue::Kind::list)))
    LATTICE_FAIL() << what << ": a size that is " << (v ? v->describe() : "missing");
  std::vector<int64_t> out;
  for (const PyRef& x : seq->items) {
    if (!x->is(PyValue::Kind::integer) || x->integer < 0) LATTICE_FAIL() << what << ": a size of " << x->describe();
    out.push_back(x->integer);
  }
  return out;
}

// A dataclass's field (its BUILD state's entry), or an error naming `what`.
PyRef field(const PyRef& obj, const char* name, const std::string& what) {
  PyRef v = obj && obj->is(PyValue::Kind::object) ? obj->get(name) : nullptr;
  if (!v) LATTICE_FAIL() << what << ": " << (obj ? obj->describe() : "None") << " without " << name;
  return v;
}

std::string shape_of(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t d = 0; d < dims.size(); ++d) out += (d ? ", " : "") + std::to_string(dims[d]);
  return out + "]";
}

int64_t numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace

DcpCheckpoint::DcpCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path path = fs::path(dir) / ".metadata";
  const std::string what = path.string();
  const std::vector<uint8_t> bytes = read_bytes(path, 0, -1, "the metadata");
  const PyRef meta = unpickle(bytes.data(), bytes.size(), what);
  const PyRef sdm = field(meta, "state_dict_metadata", what), storage = field(meta, "storage_data", what);
  if (!sdm->is(PyValue::Kind::dict) || !storage->is(PyValue::Kind::dict))
    LATTICE_FAIL() << what << ": state_dict_metadata or storage_data is not a dict";
  for (const auto& [key, value] : sdm->entries) {
    if (!key->is(PyValue::Kind::string)) LATTICE_FAIL() << what << ": a key that is " << key->describe();
    const std::string name = value->qualified_name();
    const std::string bytes_item = "BytesStorageMetadata";
    if (name.size() >= bytes_item.size() &&
        name.compare(name.size() - bytes_item.size(), bytes_item.size(), bytes_item) == 0) {
      bytes_items_.insert(key->text);
      continue;
    }
    const std::string of = what + ": " + key->text;
    Tensor t;
    t.size = dims_of(field(value, "size", of), of);
    const PyRef chunks = field(value, "chunks", of);
    if (!chunks->is(PyValue::Kind::list)) LATTICE_FAIL() << of << ": chunks that are " << chunks->describe();
    for (const PyRef& c : chunks->items) {
      Chunk chunk;
      chunk.offsets = dims_of(field(c, "offsets", of), of);
      chunk.sizes = dims_of(field(c, "sizes", of), of);
      if (chunk.offsets.size() != t.size.size() || chunk.sizes.size() != t.size.size())
        LATTICE_FAIL() << of << ": a chunk of " << chunk.sizes.size() << " dims in a tensor of " << t.size.size();
      for (size_t d = 0; d < t.size.size(); ++d)
        if (chunk.offsets[d] + chunk.sizes[d] > t.size[d])
          LATTICE_FAIL() << of << ": a chunk reaches past the tensor's size along dim " << d;
      t.chunks.push_back(std::move(chunk));
    }
    tensors_[key->text] = std::move(t);
  }
  // Each chunk's bytes: storage_data's entry for (fqn, offsets).
  for (const auto& [index, info] : storage->entries) {
    const PyRef fqn = field(index, "fqn", what);
    const PyRef offset = index->get("offset");
    if (!fqn->is(PyValue::Kind::string)) continue;
    // Where the entry's bytes are: a file of the directory, an offset and a length.
    auto locate = [&](Chunk& c) {
      const PyRef rel = field(info, "relative_path", what), off = field(info, "offset", what),
                  len = field(info, "length", what);
      if (!rel->is(PyValue::Kind::string) || !off->is(PyValue::Kind::integer) || !len->is(PyValue::Kind::integer) ||
          rel->text.find("..") != std::string::npos || rel->text.find('/') != std::string::npos)
        LATTICE_FAIL() << what << ": " << fqn->text << "'s storage entry is not a file, offset and length";
      c.file = rel->text;
      c.offset = off->integer;
      c.length = len->integer;
    };
    if (!offset || offset->is(PyValue::Kind::none)) {  // a bytes item
      if (bytes_items_.count(fqn->text)) locate(bytes_item_storage_[fqn->text]);
      continue;
    }
    auto t = tensors_.find(fqn->text);
    if (t == tensors_.end()) continue;
    const std::vector<int64_t> at = dims_of(offset, what + ": " + fqn->text);
    for (Chunk& c : t->second.chunks)
      if (c.offsets == at) locate(c);
  }
  // Megatron-Core's reformulated flattened tensors (Tensor::stored): mcore_data {fqn: {'nd_reformulated_orig_global_shape':
  // G}}, set on the Metadata by its save planner.
  if (const PyRef mcore = meta->is(PyValue::Kind::object) ? meta->get("mcore_data") : nullptr;
      mcore && mcore->is(PyValue::Kind::dict)) {
    for (const auto& [key, value] : mcore->entries) {
      const PyRef orig = key->is(PyValue::Kind::string) && value->is(PyValue::Kind::dict)
                             ? value->get("nd_reformulated_orig_global_shape")
                             : nullptr;
      const auto t = key->is(PyValue::Kind::string) ? tensors_.find(key->text) : tensors_.end();
      if (!orig || orig->is(PyValue::Kind::none) || t == tensors_.end()) continue;
      const std::string of = what + ": " + key->text;
      const std::vector<int64_t> g = dims_of(orig, of + " (mcore_data)");
      const std::vector<int64_t>& saved = t->second.size;
      bool fits = saved.size() == g.size() + 1;
      int64_t fragment = 1;
      for (size_t d = 0; fits && d < g.size(); ++d) {
        fits = saved[d] > 0 && g[d] % saved[d] == 0;
        if (fits) fragment *= g[d] / saved[d];
      }
      if (!fits || fragment != saved.back())
        LATTICE_FAIL() << of << ": saved as " << shape_of(saved) << ", which is not the reformulated flattened form of "
                       << shape_of(g) << " (mcore_data's nd_reformulated_orig_global_shape)";
      for (const Chunk& c : t->second.chunks)
        for (size_t d = 0; d < g.size(); ++d)
          if (c.sizes[d] != 1)
            LATTICE_FAIL() << of << ": a chunk spans " << c.sizes[d] << " fragments along dim " << d
                           << " (a reformulated flattened tensor's chunks hold one each)";
      t->second.stored = saved;
      t->second.size = g;
    }
  }
  // Every chunk's bytes within its file.
  std::map<std::string, int64_t> file_sizes;
  for (const auto& [fqn, t] : tensors_)
    for (const Chunk& c : t.chunks) {
      if (c.file.empty()) LATTICE_FAIL() << what << ": a chunk of " << fqn << " has no storage entry";
      if (!file_sizes.count(c.file)) {
        std::error_code ec;
        const auto size = fs::file_size(fs::path(dir) / c.file, ec);
        if (ec) LATTICE_FAIL() << (fs::path(dir) / c.file).string() << ": missing (it holds chunks of " << fqn << ")";
        file_sizes[c.file] = int64_t(size);
      }
      if (c.offset < 0 || c.length < 0 || c.offset + c.length > file_sizes[c.file])
        LATTICE_FAIL() << (fs::path(dir) / c.file).string() << ": truncated: " << fqn << "'s chunk lies at bytes ["
                       << c.offset << ", " << c.offset + c.length << ") of its " << file_sizes[c.file];
    }
}

namespace {
// Whether chunk c holds the slice at `lead` (the first lead.size() dims fixed).
bool holds(const DcpCheckpoint::Chunk& c, const std::vector<int64_t>& lead) {
  for (size_t d = 0; d < lead.size(); ++d)
    if (lead[d] < c.offsets[d] || lead[d] >= c.offsets[d] + c.sizes[d]) return false;
  return true;
}
int64_t numel_from(const std::vector<int64_t>& dims, size_t first) {
  int64_t n = 1;
  for (size_t d = first; d < dims.size(); ++d) n *= dims[d];
  return n;
}
// Whether chunk c of a reformulated tensor holds values of the slice at `lead`: the slice's leading dims must be
// whole fragments (l_d = 1, the stacked axes), c's fragment index theirs.
bool holds_reformulated(const std::string& fqn, const DcpCheckpoint::Tensor& t, const DcpCheckpoint::Chunk& c,
                        const std::vector<int64_t>& lead) {
  for (size_t d = 0; d < lead.size(); ++d) {
    if (t.stored[d] != t.size[d])
      LATTICE_FAIL() << fqn << ": a slice along dim " << d << " of a reformulated flattened tensor, which that dim "
                     << "splits in " << t.stored[d] << " fragments of " << t.size[d] / t.stored[d];
    if (c.offsets[d] != lead[d]) return false;
  }
  return true;
}
std::string slice_name(const std::string& fqn, const std::vector<int64_t>& lead) {
  std::string name = fqn;
  for (int64_t i : lead) name += '[' + std::to_string(i) + ']';
  return name;
}
}  // namespace

int64_t DcpCheckpoint::covered(const std::string& fqn, const std::vector<int64_t>& lead) const {
  const Tensor& t = tensors_.at(fqn);
  int64_t n = 0;
  for (const Chunk& c : t.chunks)
    if (t.stored.empty() ? holds(c, lead) : holds_reformulated(fqn, t, c, lead))
      n += t.stored.empty() ? numel_from(c.sizes, lead.size()) : c.sizes.back();
  return n;
}

std::vector<uint8_t> DcpCheckpoint::read_bytes_item(const std::string& name) const {
  const auto it = bytes_item_storage_.find(name);
  if (it == bytes_item_storage_.end() || it->second.file.empty())
    LATTICE_FAIL() << dir_ << ": no bytes item " << name << " in .metadata's storage";
  const Chunk& c = it->second;
  if (c.offset < 0 || c.length < 0)
    LATTICE_FAIL() << dir_ << ": " << name << "'s storage entry has a negative offset or length";
  return read_bytes(fs::path(dir_) / c.file, c.offset, c.length, name);
}

void DcpCheckpoint::read_chunk(const std::string& fqn, const Chunk& c, float* out) const {
  // The chunk's torch.save read where it lies in its file (whose size the constructor checked it against).
  const std::string file = (fs::path(dir_) / c.file).string();
  const TorchArchive chunk(file + ": " + fqn, file, uint64_t(c.offset), uint64_t(c.length));
  const TorchTensor* tensor = TorchArchive::tensor(chunk.root());
  if (!tensor) LATTICE_FAIL() << dir_ << "/" << c.file << ": " << fqn << "'s chunk is not a tensor";
  if (tensor->numel() != numel(c.sizes))
    LATTICE_FAIL() << dir_ << "/" << c.file << ": " << fqn << "'s chunk holds " << tensor->numel()
                   << " values, its metadata says " << numel(c.sizes);
  chunk.read_float(*tensor, fqn, out);
}

void DcpCheckpoint::read_float_range(const std::string& fqn, int64_t begin, int64_t count, float* out) const {
  const auto it = tensors_.find(fqn);
  if (it == tensors_.end()) LATTICE_FAIL() << dir_ << ": no tensor " << fqn;
  const Tensor& t = it->second;
  if (t.size.size() != 1 || !t.stored.empty()) LATTICE_FAIL() << dir_ << ": " << fqn << " is not saved 1-D";
  if (begin < 0 || count < 0 || begin + count > t.size[0])
    LATTICE_FAIL() << dir_ << ": " << fqn << " has no elements [" << begin << ", " << begin + count << ") (its size is "
                   << t.size[0] << ")";
  int64_t covered = 0;
  for (const Chunk& c : t.chunks) {
    const int64_t lo = std::max(begin, c.offsets[0]), hi = std::min(begin + count, c.offsets[0] + c.sizes[0]);
    if (lo >= hi) continue;
    covered += hi - lo;
    if (lo == c.offsets[0] && hi == c.offsets[0] + c.sizes[0]) {  // the whole chunk: straight into place
      read_chunk(fqn, c, out + (lo - begin));
      continue;
    }
    std::vector<float> values(size_t(c.sizes[0]));
    read_chunk(fqn, c, values.data());
    std::copy(values.begin() + (lo - c.offsets[0]), values.begin() + (hi - c.offsets[0]), out + (lo - begin));
  }
  if (covered != count)
    LATTICE_FAIL() << dir_ << ": " << fqn << "[" << begin << ":" << begin + count << "]: its chunks hold " << covered
                   << " of its " << count << " values";
}

void DcpCheckpoint::read_float(const std::string& fqn, const std::vector<int64_t>& lead, float* out) const {
  const auto it = tensors_.find(fqn);
  if (it == tensors_.end()) LATTICE_FAIL() << dir_ << ": no tensor " << fqn;
  const Tensor& t = it->second;
  const size_t k = lead.size();
  if (k > t.size.size()) LATTICE_FAIL() << dir_ << ": " << fqn << " has fewer than " << k << " dims";
  for (size_t d = 0; d < k; ++d)
    if (lead[d] < 0 || lead[d] >= t.size[d])
      LATTICE_FAIL() << dir_ << ": " << fqn << " has no index " << lead[d] << " along dim " << d;
  const std::vector<int64_t> target(t.size.begin() + long(k), t.size.end());
  int64_t covered = 0;
  if (!t.stored.empty()) {  // reformulated: each value from its fragment's flattened range to its place
    const size_t n = t.size.size();
    std::vector<int64_t> l(n);  // a fragment's extent along each dim
    for (size_t d = 0; d < n; ++d) l[d] = t.size[d] / t.stored[d];
    std::vector<int64_t> g(n);  // an element's index in the whole tensor
    for (const Chunk& c : t.chunks) {
      if (!holds_reformulated(fqn, t, c, lead)) continue;
      std::vector<float> values(size_t(c.sizes.back()));
      read_chunk(fqn, c, values.data());
      for (int64_t e = 0; e < c.sizes.back(); ++e) {
        // Element e of the chunk: r, its index in the fragment (row-major over l), from the fragment's start.
        int64_t r = c.offsets.back() + e, at = 0;
        for (size_t d = n; d-- > 0;) {
          g[d] = c.offsets[d] * l[d] + r % l[d];
          r /= l[d];
        }
        for (size_t d = k; d < n; ++d) at = at * t.size[d] + g[d];
        out[at] = values[size_t(e)];
      }
      covered += c.sizes.back();
    }
    if (covered != numel(target))
      LATTICE_FAIL() << dir_ << ": " << slice_name(fqn, lead) << ": its chunks hold " << covered << " of its "
                     << numel(target) << " values";
    return;
  }
  for (const Chunk& c : t.chunks) {
    if (!holds(c, lead)) continue;
    std::vector<float> values(size_t(numel(c.sizes)));
    read_chunk(fqn, c, values.data());
    // The slice's box in the chunk: the leading dims fixed, the rest contiguous after them.
    int64_t at = 0;
    for (size_t d = 0; d < k; ++d) at += (lead[d] - c.offsets[d]) * numel_from(c.sizes, d + 1);
    TensorPart part;
    part.global_shape = target;
    part.offsets.assign(c.offsets.begin() + long(k), c.offsets.end());
    part.lengths.assign(c.sizes.begin() + long(k), c.sizes.end());
    part.data = values.data() + at;
    place_part(part, out);
    covered += numel(part.lengths);
  }
  if (covered != numel(target))
    LATTICE_FAIL() << dir_ << ": " << slice_name(fqn, lead) << ": its chunks hold " << covered << " of its "
                   << numel(target) << " values";
}

}  // namespace lattice
