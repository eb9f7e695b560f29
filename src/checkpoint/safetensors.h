// HuggingFace safetensors files: read (validated) and write (atomic).
//
// Format: u64 little-endian header length N, then N bytes of UTF-8 JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// (padded with spaces to 8-byte alignment), then the byte buffer. Offsets are relative to the
// start of the buffer; tensors cover the buffer exactly (no overlaps, no holes), as the reference
// implementation requires. Data is little-endian, row-major.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

// A tensor's bytes: a read-only view into its file's memory mapping (SafetensorsFile::read; the
// mapping lives while any view of it does, and its pages are the page cache's, not the process's
// heap), or bytes of its own (made in memory, or copied from the view by the first write through
// the mutable accessors).
class TensorBytes {
 public:
  TensorBytes() = default;
  TensorBytes(std::vector<uint8_t> owned) : own_(std::move(owned)) {}  // NOLINT: a vector converts
  TensorBytes(std::shared_ptr<const void> mapping, const uint8_t* data, size_t size)
      : mapping_(std::move(mapping)), view_(data), view_size_(size) {}
  const uint8_t* data() const { return mapping_ ? view_ : own_.data(); }
  size_t size() const { return mapping_ ? view_size_ : own_.size(); }
  bool empty() const { return size() == 0; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  uint8_t operator[](size_t i) const { return data()[i]; }
  uint8_t& operator[](size_t i) { return mutable_data()[i]; }
  // The bytes to write to: a view is copied into bytes of its own first.
  uint8_t* mutable_data() {
    if (mapping_) {
      own_.assign(view_, view_ + view_size_);
      mapping_.reset();
    }
    return own_.data();
  }
  void resize(size_t n) {  // bytes of its own, n of them (new ones zero)
    mutable_data();
    own_.resize(n);
  }
  bool mapped() const { return mapping_ != nullptr; }
  friend bool operator==(const TensorBytes& a, const TensorBytes& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
  friend bool operator==(const TensorBytes& a, const std::vector<uint8_t>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
  }

 private:
  std::vector<uint8_t> own_;
  std::shared_ptr<const void> mapping_;  // null: own_ holds the bytes
  const uint8_t* view_ = nullptr;
  size_t view_size_ = 0;
};

// One tensor of a file (or made in memory).
struct SafeTensor {
  std::string dtype;           // safetensors dtype string: "F32", "BF16", "I32", ...
  std::vector<int64_t> shape;  // row-major; empty = scalar
  TensorBytes bytes;           // numel * dtype size bytes

  int64_t numel() const;
};

// Bytes per element of a safetensors dtype string ("F32" -> 4); throws lattice::Error for an
// unknown dtype.
size_t safetensors_dtype_size(const std::string& dtype);

class SafetensorsFile {
 public:
  // Reads and validates the file's header and maps its data read-only (each tensor's bytes a view of
  // the mapping, read from the file as they are used); any problem is a one-line lattice::Error naming
  // the file (and the tensor, where one is involved).
  static SafetensorsFile read(const std::string& path);
  // One view of several files (a model sharded over them): every tensor of `parts`, whose names
  // must not repeat (an error naming both files), and the first part's metadata; path() is `path`.
  static SafetensorsFile combine(const std::string& path, std::vector<SafetensorsFile> parts);

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const SafeTensor& get(const std::string& name) const;
  // Copies of the data of an F32 / I32 tensor (error if the dtype differs).
  std::vector<float> get_f32(const std::string& name) const;
  std::vector<int32_t> get_i32(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> names() const;  // sorted
  // Gives back the memory of a mapped tensor's pages (and of the neighbors' that share its first and last page):
  // its bytes stay readable, read from the file again when next used. A streamed conversion reads a model larger
  // than memory so. Nothing happens for a tensor with bytes of its own.
  void release(const std::string& name) const;

 private:
  std::string path_;
  std::map<std::string, SafeTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Copies `bytes` bytes from `data`; bytes must equal numel(shape) * dtype size.
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
           const void* data, size_t bytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  // The same without a copy: `data` is written from where it is, so it must stay valid and unchanged
  // until write() returns (a model's parameters saved while the model lives).
  void add_view(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                const void* data, size_t bytes);
  // An F32 tensor whose values the writer takes over (moved, not copied).
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>&& data);
  // A tensor whose `bytes` bytes `produce` writes into the buffer it is given, called by write() just before the
  // tensor goes to the file (the buffer is freed right after): a file of any size is written holding one
  // tensor's data at a time. produce may be called again by another write().
  void add_produced(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                    size_t bytes, std::function<void(uint8_t* out)> produce);
  // The same made in `pieces` equal consecutive parts (bytes / pieces each, a whole number of elements):
  // produce(i, out) writes part i, so one part's data is held at a time (an experts' tensor an expert at a time).
  void add_produced(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                    size_t bytes, int64_t pieces, std::function<void(int64_t piece, uint8_t* out)> produce);
  void set_metadata(const std::string& key, const std::string& value);
  // Every F32 tensor converted to `dtype`: BF16 or F16, rounded to nearest even (F32: nothing
  // changes). A finite value beyond F16's range is an error naming the tensor.
  void cast_f32(const std::string& dtype);
  // The tensors' names in file order, and the bytes of their data.
  std::vector<std::string> names() const;
  uint64_t data_bytes() const;
  // The tensors in file order split into writers of at most max_bytes of data each (a tensor
  // larger than that alone in one), each with this writer's metadata; this one is left empty.
  std::vector<SafetensorsWriter> split(uint64_t max_bytes);
  // Writes path + ".tmp", fsyncs it, renames it over path and fsyncs the directory, so `path` is
  // either the old file or the complete new one.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::shared_ptr<const void> owner;  // what holds the bytes (null: borrowed, add_view's)
    const uint8_t* data = nullptr;
    size_t bytes = 0;
    std::function<void(int64_t, uint8_t*)> produce = nullptr;  // add_produced's (data null): piece i of `pieces`
    int64_t pieces = 1;
  };
  // The checks of every add: a new valid name, `bytes` matching dtype and shape.
  void check_entry(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                   size_t bytes) const;
  std::vector<Entry> entries_;  // data laid out in insertion order
  std::map<std::string, std::string> metadata_;
};

}  // namespace lattice
