#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cast_math.h"

namespace lattice {

namespace {

using json = nlohmann::json;

// Largest header we accept (the reference implementation's limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool dtype_size_or_zero(const std::string& dtype, size_t* size) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) return false;
  *size = it->second;
  return true;
}

// numel of `shape`, or false on overflow / negative dims.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud) return false;
    n *= ud;
  }
  *out = n;
  return true;
}

bool read_u64_array(const json& j, size_t want, std::vector<uint64_t>* out) {
  if (!j.is_array() || (want && j.size() != want)) return false;
  out->clear();
  for (const auto& v : j) {
    if (!v.is_number_unsigned()) {
      // Non-negative integers parse as unsigned; a negative or fractional value is malformed.
      return false;
    }
    out->push_back(v.get<uint64_t>());
  }
  return true;
}

void write_all(int fd, const void* data, size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      LATTICE_FAIL() << tmp << ": write failed: " << std::strerror(e);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  size_t s = 0;
  if (!dtype_size_or_zero(dtype, &s)) LATTICE_FAIL() << "unknown safetensors dtype '" << dtype << "'";
  return s;
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    LATTICE_FAIL() << path << ": cannot open safetensors file: " << std::strerror(errno);
  if (!S_ISREG(st.st_mode)) LATTICE_FAIL() << path << ": not a regular file";
  std::ifstream in(path, std::ios::binary);
  if (!in) LATTICE_FAIL() << path << ": cannot open safetensors file: " << std::strerror(errno);
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  if (file_size < 8)
    LATTICE_FAIL() << path << ": not a safetensors file: " << file_size
                   << " bytes, too small for the 8-byte header length";

  uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len == 0) LATTICE_FAIL() << path << ": safetensors header length is 0";
  if (header_len > file_size - 8)
    LATTICE_FAIL() << path << ": safetensors header length " << header_len
                   << " runs past the end of the file (" << file_size << " bytes)";
  if (header_len > kMaxHeaderBytes)
    LATTICE_FAIL() << path << ": safetensors header length " << header_len << " exceeds the "
                   << kMaxHeaderBytes << "-byte limit";

  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in) LATTICE_FAIL() << path << ": read of the safetensors header failed";

  json root;
  try {
    root = json::parse(header);
  } catch (const json::parse_error& e) {
    // e.what() is one line: "[json.exception.parse_error.101] parse error at line 1, column ..."
    LATTICE_FAIL() << path << ": safetensors header is not valid JSON: " << e.what();
  }
  if (!root.is_object()) LATTICE_FAIL() << path << ": safetensors header is not a JSON object";

  SafetensorsFile f;
  f.path_ = path;
  const uint64_t buffer_size = file_size - 8 - header_len;

  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        LATTICE_FAIL() << path << ": safetensors __metadata__ is not a JSON object";
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          LATTICE_FAIL() << path << ": safetensors __metadata__ value for key '" << m.key()
                         << "' is not a string";
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) LATTICE_FAIL() << path << ": tensor '" << name << "': entry is not a JSON object";
    if (!v.contains("dtype") || !v["dtype"].is_string())
      LATTICE_FAIL() << path << ": tensor '" << name << "': missing or non-string 'dtype'";
    SafeTensor t;
    t.dtype = v["dtype"].get<std::string>();
    size_t esize = 0;
    if (!dtype_size_or_zero(t.dtype, &esize))
      LATTICE_FAIL() << path << ": tensor '" << name << "': unknown dtype '" << t.dtype << "'";
    std::vector<uint64_t> dims, offs;
    if (!v.contains("shape") || !read_u64_array(v["shape"], 0, &dims))
      LATTICE_FAIL() << path << ": tensor '" << name
                     << "': 'shape' must be an array of non-negative integers";
    for (uint64_t d : dims) {
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        LATTICE_FAIL() << path << ": tensor '" << name << "': dimension " << d << " is too large";
      t.shape.push_back(static_cast<int64_t>(d));
    }
    if (!v.contains("data_offsets") || !read_u64_array(v["data_offsets"], 2, &offs))
      LATTICE_FAIL() << path << ": tensor '" << name
                     << "': 'data_offsets' must be [begin, end] with non-negative integers";
    const uint64_t begin = offs[0], end = offs[1];
    if (begin > end)
      LATTICE_FAIL() << path << ": tensor '" << name << "': data_offsets [" << begin << ", " << end
                     << "] has begin > end";
    if (end > buffer_size)
      LATTICE_FAIL() << path << ": tensor '" << name << "': data_offsets [" << begin << ", " << end
                     << "] out of range: the data buffer has " << buffer_size << " bytes";
    uint64_t numel = 0;
    if (!checked_numel(t.shape, &numel) || numel > std::numeric_limits<uint64_t>::max() / esize)
      LATTICE_FAIL() << path << ": tensor '" << name << "': shape " << shape_str(t.shape)
                     << " is too large";
    if (end - begin != numel * esize)
      LATTICE_FAIL() << path << ": tensor '" << name << "': data_offsets [" << begin << ", " << end
                     << "] hold " << (end - begin) << " bytes but dtype " << t.dtype << " shape "
                     << shape_str(t.shape) << " needs " << numel * esize;
    spans.push_back({begin, end, name});
    f.tensors_.emplace(name, std::move(t));
  }

  // The tensors must tile the buffer: no overlaps, no holes, nothing left over.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin < pos)
      LATTICE_FAIL() << path << ": tensor '" << s.name << "': data_offsets [" << s.begin << ", "
                     << s.end << "] overlap tensor '" << prev->name << "' [" << prev->begin << ", "
                     << prev->end << "]";
    if (s.begin > pos)
      LATTICE_FAIL() << path << ": tensor '" << s.name << "': data_offsets [" << s.begin << ", "
                     << s.end << "] leave a hole of " << (s.begin - pos) << " bytes at offset " << pos
                     << " of the data buffer";
    pos = s.end;
    prev = &s;
  }
  if (pos != buffer_size)
    LATTICE_FAIL() << path << ": the data buffer has " << buffer_size << " bytes but the tensors cover "
                   << pos << " (trailing bytes or a truncated header)";

  // The data: one read-only mapping of the file, each tensor a view of its bytes (the mapping is
  // unmapped when the last view goes). A file rewritten later is a new file (writes rename over it),
  // so the mapped one stays whole.
  const uint64_t data_start = 8 + header_len;
  if (buffer_size == 0) return f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) LATTICE_FAIL() << path << ": cannot open safetensors file: " << std::strerror(errno);
  void* map = ::mmap(nullptr, size_t(file_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) LATTICE_FAIL() << path << ": cannot map the safetensors data: " << std::strerror(map_errno);
  const size_t mapped = size_t(file_size);
  std::shared_ptr<const void> mapping(map, [mapped](const void* p) { ::munmap(const_cast<void*>(p), mapped); });
  const uint8_t* data = static_cast<const uint8_t*>(map) + data_start;
  for (const Span& s : spans)
    f.tensors_.at(s.name).bytes = TensorBytes(mapping, data + s.begin, size_t(s.end - s.begin));
  return f;
}

const SafeTensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    LATTICE_FAIL() << path_ << ": no tensor named '" << name << "' (the file has " << tensors_.size()
                   << " tensors)";
  return it->second;
}

std::vector<float> SafetensorsFile::get_f32(const std::string& name) const {
  const SafeTensor& t = get(name);
  if (t.dtype != "F32")
    LATTICE_FAIL() << path_ << ": tensor '" << name << "' has dtype " << t.dtype << ", expected F32";
  std::vector<float> out(t.bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

std::vector<int32_t> SafetensorsFile::get_i32(const std::string& name) const {
  const SafeTensor& t = get(name);
  if (t.dtype != "I32")
    LATTICE_FAIL() << path_ << ": tensor '" << name << "' has dtype " << t.dtype << ", expected I32";
  std::vector<int32_t> out(t.bytes.size() / sizeof(int32_t));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

SafetensorsFile SafetensorsFile::combine(const std::string& path, std::vector<SafetensorsFile> parts) {
  SafetensorsFile out;
  out.path_ = path;
  std::map<std::string, std::string> from;  // tensor -> the part that gave it
  for (SafetensorsFile& part : parts) {
    if (out.metadata_.empty()) out.metadata_ = part.metadata_;
    for (auto& [name, t] : part.tensors_) {
      if (auto it = from.find(name); it != from.end())
        LATTICE_FAIL() << path << ": tensor " << name << " is in both " << it->second << " and " << part.path_;
      from[name] = part.path_;
      out.tensors_[name] = std::move(t);
    }
  }
  return out;
}

void SafetensorsFile::release(const std::string& name) const {
  const TensorBytes& b = get(name).bytes;
  if (!b.mapped() || b.empty()) return;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(b.data()) / page * page;
  const uintptr_t end = (uintptr_t(b.data()) + b.size() + page - 1) / page * page;
  // (a private, read-only file mapping: dropped pages are read from the file again)
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

void SafetensorsWriter::check_entry(const std::string& name, const std::string& dtype,
                                    const std::vector<int64_t>& shape, size_t bytes) const {
  if (name.empty() || name == "__metadata__")
    LATTICE_FAIL() << "safetensors writer: invalid tensor name '" << name << "'";
  for (const Entry& e : entries_)
    if (e.name == name) LATTICE_FAIL() << "safetensors writer: tensor '" << name << "' added twice";
  size_t esize = 0;
  if (!dtype_size_or_zero(dtype, &esize))
    LATTICE_FAIL() << "safetensors writer: tensor '" << name << "': unknown dtype '" << dtype << "'";
  uint64_t numel = 0;
  if (!checked_numel(shape, &numel) || numel * esize != bytes)
    LATTICE_FAIL() << "safetensors writer: tensor '" << name << "': " << bytes
                   << " bytes do not match dtype " << dtype << " shape " << shape_str(shape);
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  check_entry(name, dtype, shape, bytes);
  auto copy = std::make_shared<std::vector<uint8_t>>(bytes);
  if (bytes) std::memcpy(copy->data(), data, bytes);
  entries_.push_back(Entry{name, dtype, shape, copy, copy->data(), bytes});
}

void SafetensorsWriter::add_view(const std::string& name, const std::string& dtype,
                                 const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  check_entry(name, dtype, shape, bytes);
  entries_.push_back(Entry{name, dtype, shape, nullptr, static_cast<const uint8_t*>(data), bytes});
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                std::vector<float>&& data) {
  check_entry(name, "F32", shape, data.size() * sizeof(float));
  auto owned = std::make_shared<std::vector<float>>(std::move(data));
  entries_.push_back(Entry{name, "F32", shape, owned, reinterpret_cast<const uint8_t*>(owned->data()),
                           owned->size() * sizeof(float)});
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const float* data) {
  uint64_t numel = 0;
  if (!checked_numel(shape, &numel))
    LATTICE_FAIL() << "safetensors writer: tensor '" << name << "': bad shape " << shape_str(shape);
  add(name, "F32", shape, data, numel * sizeof(float));
}

void SafetensorsWriter::add_produced(const std::string& name, const std::string& dtype,
                                     const std::vector<int64_t>& shape, size_t bytes,
                                     std::function<void(uint8_t* out)> produce) {
  add_produced(name, dtype, shape, bytes, 1, [produce = std::move(produce)](int64_t, uint8_t* out) { produce(out); });
}

void SafetensorsWriter::add_produced(const std::string& name, const std::string& dtype,
                                     const std::vector<int64_t>& shape, size_t bytes, int64_t pieces,
                                     std::function<void(int64_t piece, uint8_t* out)> produce) {
  check_entry(name, dtype, shape, bytes);
  LATTICE_CHECK(pieces >= 1 && bytes % size_t(pieces) == 0 &&
                (bytes / size_t(pieces)) % safetensors_dtype_size(dtype) == 0)
      << "safetensors writer: tensor '" << name << "': " << bytes << " bytes do not split into " << pieces
      << " pieces of whole elements";
  entries_.push_back(Entry{name, dtype, shape, nullptr, nullptr, bytes, std::move(produce), pieces});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::cast_f32(const std::string& dtype) {
  if (dtype == "F32") return;
  if (dtype != "BF16" && dtype != "F16")
    LATTICE_FAIL() << "safetensors writer: cannot cast F32 tensors to " << dtype << " (BF16 or F16)";
  const bool bf16 = dtype == "BF16";
  // n F32 values at `in` as 2-byte values at `out` (the tensor's elements from `first`).
  auto cast = [bf16](const std::string& name, const uint8_t* in, size_t n, uint8_t* out, size_t first = 0) {
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, in + 4 * i, 4);
      const uint16_t h = bf16 ? math::fp32_to_bf16(v) : math::fp32_to_fp16(v);
      if (!bf16 && std::isfinite(v) && (h & 0x7c00u) == 0x7c00u)
        LATTICE_FAIL() << "tensor " << name << ": value " << v << " at index " << first + i
                       << " is beyond float16's range (65504); export it as bfloat16 or float32";
      out[2 * i] = uint8_t(h & 0xff);
      out[2 * i + 1] = uint8_t(h >> 8);
    }
  };
  for (Entry& e : entries_) {
    if (e.dtype != "F32") continue;
    const size_t n = e.bytes / 4;
    e.dtype = dtype;
    e.bytes = 2 * n;
    if (e.produce) {  // cast when produced: each piece's F32 values in a buffer of their own, then the 2-byte ones
      const size_t per = n / size_t(e.pieces);
      e.produce = [f32 = std::move(e.produce), cast, name = e.name, per](int64_t piece, uint8_t* out) {
        std::vector<uint8_t> values(4 * per);
        f32(piece, values.data());
        cast(name, values.data(), per, out, size_t(piece) * per);
      };
      continue;
    }
    auto out = std::make_shared<std::vector<uint8_t>>(2 * n);
    cast(e.name, e.data, n, out->data());
    e.data = out->data();
    e.owner = std::move(out);
  }
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const Entry& e : entries_) n += e.bytes;
  return n;
}

std::vector<SafetensorsWriter> SafetensorsWriter::split(uint64_t max_bytes) {
  std::vector<SafetensorsWriter> out;
  uint64_t in_last = 0;
  for (Entry& e : entries_) {
    if (out.empty() || (!out.back().entries_.empty() && in_last + e.bytes > max_bytes)) {
      out.emplace_back();
      out.back().metadata_ = metadata_;
      in_last = 0;
    }
    in_last += e.bytes;
    out.back().entries_.push_back(std::move(e));
  }
  entries_.clear();
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  json root = json::object();
  uint64_t off = 0;
  for (const Entry& e : entries_) {
    root[e.name] = {{"dtype", e.dtype},
                    {"shape", e.shape},
                    {"data_offsets", {off, off + e.bytes}}};
    off += e.bytes;
  }
  if (!metadata_.empty()) root["__metadata__"] = metadata_;
  std::string header = root.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t len_bytes[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) LATTICE_FAIL() << tmp << ": cannot create: " << std::strerror(errno);
  write_all(fd, len_bytes, 8, tmp);
  write_all(fd, header.data(), header.size(), tmp);
  for (const Entry& e : entries_) {
    if (!e.produce) {
      write_all(fd, e.data, e.bytes, tmp);
      continue;
    }
    std::vector<uint8_t> produced(e.bytes / size_t(e.pieces));
    for (int64_t piece = 0; piece < e.pieces; ++piece) {
      try {
        e.produce(piece, produced.data());
      } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
      }
      write_all(fd, produced.data(), produced.size(), tmp);
    }
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    LATTICE_FAIL() << tmp << ": fsync failed: " << std::strerror(err);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    LATTICE_FAIL() << tmp << ": close failed: " << std::strerror(err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    LATTICE_FAIL() << path << ": cannot rename " << tmp << " into place: " << std::strerror(err);
  }
  // Make the rename durable.
  std::string dir = ".";
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace lattice
