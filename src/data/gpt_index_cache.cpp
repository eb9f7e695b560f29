#include "data/gpt_index_cache.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace lattice {

namespace {

constexpr char kMagic[8] = {'L', 'A', 'T', 'G', 'P', 'T', 'I', 'X'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 8 * 8;

struct Header {
  uint64_t version, description_bytes, num_epochs, separate_final_epoch;
  uint64_t n_document, n_sample, n_shuffle, checksum;
};

uint64_t checksum_of(const std::string& description, const GPTDatasetIndices& x) {
  uint64_t h = fnv1a64(description.data(), description.size());
  h = fnv1a64(x.document_index.data(), x.document_index.size() * sizeof(int32_t), h);
  h = fnv1a64(x.sample_index.data(), x.sample_index.size() * sizeof(int64_t), h);
  return fnv1a64(x.shuffle_index.data(), x.shuffle_index.size() * sizeof(int64_t), h);
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h) {
  constexpr uint64_t prime = 0x100000001b3ULL;
  const auto* p = static_cast<const uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * prime;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * prime;
  return h;
}

IndexCacheRead read_gpt_index_cache(const std::string& path, const std::string& description) {
  IndexCacheRead r;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return r;
  r.status = IndexCacheRead::invalid;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  File f(std::fopen(path.c_str(), "rb"));
  if (ec || !f) {
    r.reason = "cannot be read";
    return r;
  }
  char magic[8];
  Header h{};
  if (file_size < kHeaderBytes || std::fread(magic, 1, 8, f.get()) != 8 ||
      std::fread(&h, sizeof h, 1, f.get()) != 1 || std::memcmp(magic, kMagic, 8) != 0) {
    r.reason = "not a lattice GPTDataset index cache (bad header)";
    return r;
  }
  if (h.version != kVersion) {
    r.reason = "version " + std::to_string(h.version) + ", expected " + std::to_string(kVersion);
    return r;
  }
  // Counts come from the file: bound them by its size before allocating anything.
  const uint64_t limit = file_size;
  if (h.description_bytes > limit || h.n_document > limit || h.n_sample > limit ||
      h.n_shuffle > limit ||
      kHeaderBytes + h.description_bytes + 4 * h.n_document + 8 * h.n_sample + 8 * h.n_shuffle !=
          file_size) {
    r.reason = "size " + std::to_string(file_size) + " bytes does not match its header (truncated?)";
    return r;
  }
  if (h.n_sample < 2 || h.n_sample % 2 != 0 || h.n_shuffle != h.n_sample / 2 - 1) {
    r.reason = "inconsistent index sizes in its header";
    return r;
  }
  std::string desc(h.description_bytes, '\0');
  GPTDatasetIndices& x = r.indices;
  x.document_index.resize(h.n_document);
  x.sample_index.resize(h.n_sample);
  x.shuffle_index.resize(h.n_shuffle);
  if (std::fread(desc.data(), 1, desc.size(), f.get()) != desc.size() ||
      std::fread(x.document_index.data(), 4, h.n_document, f.get()) != h.n_document ||
      std::fread(x.sample_index.data(), 8, h.n_sample, f.get()) != h.n_sample ||
      std::fread(x.shuffle_index.data(), 8, h.n_shuffle, f.get()) != h.n_shuffle) {
    r.reason = "short read";
    return r;
  }
  if (desc != description) {
    r.reason = "built for other parameters (description differs)";
    return r;
  }
  if (checksum_of(desc, x) != h.checksum) {
    r.reason = "checksum mismatch (corrupted)";
    return r;
  }
  x.num_epochs = int64_t(h.num_epochs);
  x.separate_final_epoch = h.separate_final_epoch != 0;
  r.status = IndexCacheRead::ok;
  return r;
}

void write_gpt_index_cache(const std::string& path, const std::string& description,
                           const GPTDatasetIndices& x) {
  const std::filesystem::path final_path(path);
  std::error_code ec;
  std::filesystem::create_directories(final_path.parent_path(), ec);
  if (ec) LATTICE_FAIL() << final_path.parent_path().string() << ": cannot create: " << ec.message();
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) LATTICE_FAIL() << tmp << ": cannot open for writing: " << std::strerror(errno);
    const Header h{kVersion,
                   description.size(),
                   uint64_t(x.num_epochs),
                   x.separate_final_epoch ? 1u : 0u,
                   x.document_index.size(),
                   x.sample_index.size(),
                   x.shuffle_index.size(),
                   checksum_of(description, x)};
    bool ok = std::fwrite(kMagic, 1, 8, f.get()) == 8 && std::fwrite(&h, sizeof h, 1, f.get()) == 1 &&
              std::fwrite(description.data(), 1, description.size(), f.get()) == description.size() &&
              std::fwrite(x.document_index.data(), 4, x.document_index.size(), f.get()) ==
                  x.document_index.size() &&
              std::fwrite(x.sample_index.data(), 8, x.sample_index.size(), f.get()) ==
                  x.sample_index.size() &&
              std::fwrite(x.shuffle_index.data(), 8, x.shuffle_index.size(), f.get()) ==
                  x.shuffle_index.size();
    ok = ok && std::fflush(f.get()) == 0 && fsync(fileno(f.get())) == 0;
    if (!ok) {
      const int err = errno;
      f.reset();
      std::filesystem::remove(tmp, ec);
      LATTICE_FAIL() << tmp << ": write failed: " << std::strerror(err);
    }
  }
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    LATTICE_FAIL() << path << ": cannot rename the index cache into place: " << ec.message();
  }
}

}  // namespace lattice
