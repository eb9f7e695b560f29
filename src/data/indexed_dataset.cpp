// Megatron's .bin/.idx pair: reading (mmap of .bin, full validation of .idx) and writing
// (temporary names, renamed into place by finalize()).
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace lattice {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
// magic (9) + version (8) + dtype (1) + sequence_count (8) + document_count (8)
constexpr size_t kHeaderBytes = 34;

const char* code_name(IndexDTypeCode c) {
  switch (c) {
    case IndexDTypeCode::u8: return "uint8";
    case IndexDTypeCode::i8: return "int8";
    case IndexDTypeCode::i16: return "int16";
    case IndexDTypeCode::i32: return "int32";
    case IndexDTypeCode::i64: return "int64";
    case IndexDTypeCode::f64: return "float64";
    case IndexDTypeCode::f32: return "float32";
    case IndexDTypeCode::u16: return "uint16";
  }
  return "?";
}

size_t code_bytes(IndexDTypeCode c) {
  switch (c) {
    case IndexDTypeCode::u8: case IndexDTypeCode::i8: return 1;
    case IndexDTypeCode::i16: case IndexDTypeCode::u16: return 2;
    case IndexDTypeCode::i32: case IndexDTypeCode::f32: return 4;
    case IndexDTypeCode::i64: case IndexDTypeCode::f64: return 8;
  }
  return 0;
}

bool is_integer_code(IndexDTypeCode c) {
  return c != IndexDTypeCode::f32 && c != IndexDTypeCode::f64;
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian, as the format is
  return v;
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) LATTICE_FAIL() << path << ": cannot open: " << std::strerror(errno);
  std::streamsize n = f.tellg();
  std::vector<uint8_t> buf(size_t(n > 0 ? n : 0));
  f.seekg(0);
  if (n > 0 && !f.read(reinterpret_cast<char*>(buf.data()), n))
    LATTICE_FAIL() << path << ": read failed";
  return buf;
}

// Token `i` of a sequence stored as `code`, widened to int64.
inline int64_t load_token(const uint8_t* p, IndexDTypeCode code, int64_t i) {
  switch (code) {
    case IndexDTypeCode::u8: return p[i];
    case IndexDTypeCode::i8: return read_le<int8_t>(p + i);
    case IndexDTypeCode::i16: return read_le<int16_t>(p + 2 * i);
    case IndexDTypeCode::u16: return read_le<uint16_t>(p + 2 * i);
    case IndexDTypeCode::i32: return read_le<int32_t>(p + 4 * i);
    case IndexDTypeCode::i64: return read_le<int64_t>(p + 8 * i);
    case IndexDTypeCode::f32: case IndexDTypeCode::f64: break;
  }
  return 0;
}

}  // namespace

IndexDTypeCode index_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDTypeCode::u16 : IndexDTypeCode::i32;
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const std::vector<uint8_t> idx = read_whole_file(idx_path);
  const size_t n = idx.size();

  if (n < kHeaderBytes && (n < sizeof(kMagic) || std::memcmp(idx.data(), kMagic, sizeof(kMagic)) == 0))
    LATTICE_FAIL() << idx_path << ": truncated: header needs " << kHeaderBytes << " bytes, file has " << n;
  if (std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0)
    LATTICE_FAIL() << idx_path << ": wrong magic (not a Megatron .idx file)";
  const uint64_t version = read_le<uint64_t>(idx.data() + 9);
  if (version != kVersion)
    LATTICE_FAIL() << idx_path << ": unsupported version " << version << " (expected " << kVersion << ")";
  const uint8_t code = idx[17];
  if (code < 1 || code > 8) LATTICE_FAIL() << idx_path << ": unknown dtype code " << int(code);
  dtype_code_ = IndexDTypeCode(code);
  if (!is_integer_code(dtype_code_))
    LATTICE_FAIL() << idx_path << ": dtype " << code_name(dtype_code_) << " (code " << int(code)
                   << ") cannot hold token ids";
  const uint64_t S = read_le<uint64_t>(idx.data() + 18);
  const uint64_t D = read_le<uint64_t>(idx.data() + 26);
  if (D == 0) LATTICE_FAIL() << idx_path << ": document_count is 0 (must be documents + 1 >= 1)";

  // 128-bit so that absurd counts in a corrupted header cannot overflow the size check.
  const unsigned __int128 need = (unsigned __int128)kHeaderBytes + (unsigned __int128)S * 12 +
                                 (unsigned __int128)D * 8;
  if (need > n) {
    LATTICE_FAIL() << idx_path << ": truncated: header says " << S << " sequences and " << D - 1
                   << " documents, which need "
                   << (need > std::numeric_limits<uint64_t>::max() ? std::string("more than 2^64")
                                                                   : std::to_string(uint64_t(need)))
                   << " bytes, file has " << n;
  }
  if (need < n)
    LATTICE_FAIL() << idx_path << ": " << (n - size_t(need)) << " unexpected bytes after the index ("
                   << S << " sequences, " << D - 1 << " documents need " << uint64_t(need) << " bytes)";

  const uint8_t* p = idx.data() + kHeaderBytes;
  sequence_lengths_.resize(S);
  sequence_offsets_.resize(S);
  document_indices_.resize(D);
  if (S) std::memcpy(sequence_lengths_.data(), p, S * 4);
  p += S * 4;
  if (S) std::memcpy(sequence_offsets_.data(), p, S * 8);
  p += S * 8;
  std::memcpy(document_indices_.data(), p, D * 8);

  if (document_indices_[0] != 0)
    LATTICE_FAIL() << idx_path << ": document index 0 is " << document_indices_[0] << " (must be 0)";
  for (uint64_t k = 1; k < D; ++k) {
    if (document_indices_[k] < document_indices_[k - 1])
      LATTICE_FAIL() << idx_path << ": document indices decrease at document " << k - 1 << " ("
                     << document_indices_[k - 1] << " -> " << document_indices_[k] << ")";
  }
  if (uint64_t(document_indices_[D - 1]) != S)
    LATTICE_FAIL() << idx_path << ": last document index is " << document_indices_[D - 1]
                   << ", expected the sequence count " << S;

  // The .bin: it must hold every sequence the index points at.
  const int fd = ::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) LATTICE_FAIL() << bin_path << ": cannot open: " << std::strerror(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    LATTICE_FAIL() << bin_path << ": cannot stat: " << std::strerror(e);
  }
  bin_size_ = size_t(st.st_size);

  const size_t tb = token_bytes();
  uint64_t bin_needed = 0;
  int64_t worst_seq = -1;
  for (uint64_t i = 0; i < S; ++i) {
    const int32_t len = sequence_lengths_[i];
    const int64_t off = sequence_offsets_[i];
    if (len < 0 || off < 0) {
      ::close(fd);
      LATTICE_FAIL() << idx_path << ": sequence " << i << " has " << (len < 0 ? "negative length " : "negative offset ")
                     << (len < 0 ? int64_t(len) : off);
    }
    const uint64_t end = uint64_t(off) + uint64_t(len) * tb;
    if (end > bin_needed) bin_needed = end, worst_seq = int64_t(i);
  }
  if (bin_needed > bin_size_) {
    ::close(fd);
    LATTICE_FAIL() << bin_path << ": truncated: index needs " << bin_needed << " bytes (sequence " << worst_seq
                   << " ends there), file has " << bin_size_;
  }

  if (bin_size_ > 0) {
    void* m = ::mmap(nullptr, bin_size_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      LATTICE_FAIL() << bin_path << ": mmap failed: " << std::strerror(e);
    }
    bin_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping stays valid
}

IndexedDataset::~IndexedDataset() {
  if (bin_) ::munmap(const_cast<uint8_t*>(bin_), bin_size_);
}

size_t IndexedDataset::token_bytes() const { return code_bytes(dtype_code_); }

int64_t IndexedDataset::num_tokens() const {
  int64_t total = 0;
  for (int32_t len : sequence_lengths_) total += len;
  return total;
}

void IndexedDataset::get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  LATTICE_CHECK(seq >= 0 && seq < num_sequences()) << prefix_ << ": sequence " << seq << " out of range";
  LATTICE_CHECK(offset >= 0 && length >= 0 && offset + length <= sequence_lengths_[seq])
      << prefix_ << ": tokens [" << offset << ", " << offset + length << ") of sequence " << seq
      << " (length " << sequence_lengths_[seq] << ")";
  const uint8_t* p = bin_ + sequence_offsets_[seq] + offset * int64_t(token_bytes());
  switch (dtype_code_) {
    case IndexDTypeCode::u16:
      for (int64_t i = 0; i < length; ++i) out[i] = read_le<uint16_t>(p + 2 * i);
      break;
    case IndexDTypeCode::i32:
      if (length) std::memcpy(out, p, size_t(length) * 4);
      break;
    default:
      for (int64_t i = 0; i < length; ++i) out[i] = int32_t(load_token(p, dtype_code_, i));
  }
}

void IndexedDataset::validate_token_ids(int64_t vocab_size) const {
  const std::string bin_path = prefix_ + ".bin";
  for (int64_t s = 0; s < num_sequences(); ++s) {
    const uint8_t* p = bin_ + sequence_offsets_[s];
    const int64_t len = sequence_lengths_[s];
    for (int64_t i = 0; i < len; ++i) {
      const int64_t id = load_token(p, dtype_code_, i);
      if (id < 0 || id >= vocab_size)
        LATTICE_FAIL() << bin_path << ": sequence " << s << " position " << i << " has token id " << id
                       << ", outside the vocabulary [0, " << vocab_size << ") (vocab size " << vocab_size
                       << "; wrong --tokenizer-type or --vocab-size?)";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

struct IndexedDatasetBuilder::Impl {
  std::string prefix;
  IndexDTypeCode dtype;
  std::FILE* bin = nullptr;
  std::vector<int32_t> lengths;
  std::vector<int64_t> offsets;
  std::vector<int64_t> doc_indices{0};
  int64_t bin_bytes = 0;
  bool finalized = false;
  std::vector<uint8_t> scratch;

  std::string bin_tmp() const { return prefix + ".bin.tmp"; }
  std::string idx_tmp() const { return prefix + ".idx.tmp"; }
};

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, IndexDTypeCode dtype)
    : impl_(std::make_unique<Impl>()) {
  impl_->prefix = prefix;
  impl_->dtype = dtype;
  if (!is_integer_code(dtype))
    LATTICE_FAIL() << prefix << ".bin: dtype " << code_name(dtype) << " cannot hold token ids";
  impl_->bin = std::fopen(impl_->bin_tmp().c_str(), "wb");
  if (!impl_->bin) LATTICE_FAIL() << impl_->bin_tmp() << ": cannot create: " << std::strerror(errno);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!impl_) return;
  if (impl_->bin) std::fclose(impl_->bin);
  if (!impl_->finalized) {
    std::remove(impl_->bin_tmp().c_str());
    std::remove(impl_->idx_tmp().c_str());
  }
}

void IndexedDatasetBuilder::add_item(const int32_t* tokens, int64_t n) {
  Impl& m = *impl_;
  LATTICE_CHECK(!m.finalized) << m.prefix << ": add_item after finalize";
  LATTICE_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max()) << m.prefix << ": sequence length " << n;
  const size_t tb = code_bytes(m.dtype);
  m.scratch.resize(size_t(n) * tb);
  uint8_t* w = m.scratch.data();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tokens[i];
    int64_t lo = 0, hi = 0;
    switch (m.dtype) {
      case IndexDTypeCode::u8: lo = 0, hi = 255; break;
      case IndexDTypeCode::i8: lo = -128, hi = 127; break;
      case IndexDTypeCode::i16: lo = -32768, hi = 32767; break;
      case IndexDTypeCode::u16: lo = 0, hi = 65535; break;
      default: lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    }
    if (t < lo || t > hi)
      LATTICE_FAIL() << m.prefix << ".bin: token id " << t << " does not fit the dataset dtype "
                     << code_name(m.dtype);
    switch (m.dtype) {
      case IndexDTypeCode::u8: case IndexDTypeCode::i8: w[i] = uint8_t(t); break;
      case IndexDTypeCode::i16: case IndexDTypeCode::u16: {
        const uint16_t v = uint16_t(t);
        std::memcpy(w + 2 * i, &v, 2);
        break;
      }
      case IndexDTypeCode::i32: {
        const int32_t v = int32_t(t);
        std::memcpy(w + 4 * i, &v, 4);
        break;
      }
      case IndexDTypeCode::i64: std::memcpy(w + 8 * i, &t, 8); break;
      case IndexDTypeCode::f32: case IndexDTypeCode::f64: break;
    }
  }
  if (n && std::fwrite(w, 1, m.scratch.size(), m.bin) != m.scratch.size())
    LATTICE_FAIL() << m.bin_tmp() << ": write failed: " << std::strerror(errno);
  m.lengths.push_back(int32_t(n));
  m.offsets.push_back(m.bin_bytes);
  m.bin_bytes += int64_t(m.scratch.size());
}

void IndexedDatasetBuilder::end_document() {
  LATTICE_CHECK(!impl_->finalized) << impl_->prefix << ": end_document after finalize";
  impl_->doc_indices.push_back(int64_t(impl_->lengths.size()));
}

void IndexedDatasetBuilder::finalize() {
  Impl& m = *impl_;
  LATTICE_CHECK(!m.finalized) << m.prefix << ": finalize called twice";
  // Sequences added after the last end_document() form a last document.
  if (m.doc_indices.back() != int64_t(m.lengths.size())) m.doc_indices.push_back(int64_t(m.lengths.size()));

  const int bin_err = std::fflush(m.bin) != 0 || std::ferror(m.bin) ? errno : 0;
  const int close_err = std::fclose(m.bin) != 0 ? errno : 0;
  m.bin = nullptr;
  if (bin_err || close_err)
    LATTICE_FAIL() << m.bin_tmp() << ": write failed: " << std::strerror(bin_err ? bin_err : close_err);

  std::vector<uint8_t> idx;
  auto put = [&idx](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    idx.insert(idx.end(), b, b + n);
  };
  const uint64_t S = m.lengths.size(), D = m.doc_indices.size();
  const uint8_t code = uint8_t(m.dtype);
  idx.reserve(kHeaderBytes + S * 12 + D * 8);
  put(kMagic, sizeof(kMagic));
  put(&kVersion, 8);
  put(&code, 1);
  put(&S, 8);
  put(&D, 8);
  put(m.lengths.data(), S * 4);
  put(m.offsets.data(), S * 8);
  put(m.doc_indices.data(), D * 8);

  std::FILE* f = std::fopen(m.idx_tmp().c_str(), "wb");
  if (!f) LATTICE_FAIL() << m.idx_tmp() << ": cannot create: " << std::strerror(errno);
  const bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size();
  const int werr = ok ? 0 : errno;
  if (std::fclose(f) != 0 || !ok)
    LATTICE_FAIL() << m.idx_tmp() << ": write failed: " << std::strerror(werr ? werr : errno);

  // .bin first, .idx last: a reader that sees the new .idx also sees the new .bin.
  const std::string bin_path = m.prefix + ".bin", idx_path = m.prefix + ".idx";
  if (std::rename(m.bin_tmp().c_str(), bin_path.c_str()) != 0)
    LATTICE_FAIL() << bin_path << ": cannot rename " << m.bin_tmp() << " into place: " << std::strerror(errno);
  if (std::rename(m.idx_tmp().c_str(), idx_path.c_str()) != 0)
    LATTICE_FAIL() << idx_path << ": cannot rename " << m.idx_tmp() << " into place: " << std::strerror(errno);
  m.finalized = true;
}

}  // namespace lattice
