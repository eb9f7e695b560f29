// JsonlChunkReader: line-aligned chunks from a plain or gzip-compressed file (zlib).
#include "data/preprocess_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace lattice {

JsonlChunkReader::JsonlChunkReader(const std::string& path) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) LATTICE_FAIL() << path << ": cannot open: " << std::strerror(errno);
  if (S_ISDIR(st.st_mode)) LATTICE_FAIL() << path << ": is a directory, expected a .jsonl file";
  file_bytes_ = int64_t(st.st_size);
  gzFile gz = gzopen(path.c_str(), "rb");
  if (!gz) LATTICE_FAIL() << path << ": cannot open: " << std::strerror(errno ? errno : ENOMEM);
  gzbuffer(gz, 1 << 20);
  gz_ = gz;
}

JsonlChunkReader::~JsonlChunkReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

size_t JsonlChunkReader::read_some(char* dst, size_t n) {
  gzFile gz = static_cast<gzFile>(gz_);
  const int got = gzread(gz, dst, unsigned(std::min<size_t>(n, size_t(1) << 30)));
  if (got < 0) {
    int code = 0;
    const char* msg = gzerror(gz, &code);
    LATTICE_FAIL() << path_ << ": read failed after " << bytes_read() << " bytes: "
                   << (code == Z_ERRNO ? std::strerror(errno) : msg);
  }
  if (got == 0) {
    int code = 0;
    const char* msg = gzerror(gz, &code);
    if (code != Z_OK && code != Z_BUF_ERROR)
      LATTICE_FAIL() << path_ << ": read failed: " << msg;
    // A gzip stream cut short reads as a clean end with Z_BUF_ERROR; say so.
    if (code == Z_BUF_ERROR) LATTICE_FAIL() << path_ << ": compressed data ends early (truncated .gz file)";
  }
  return size_t(got);
}

bool JsonlChunkReader::next(LineChunk* chunk, size_t target_bytes) {
  std::string& text = chunk->text;
  text.swap(carry_);
  carry_.clear();
  // Read until the chunk holds target_bytes and ends a line; the bytes after its last newline
  // wait for the next chunk. At the end of the input the rest is the chunk.
  size_t searched = 0;  // text[0, searched) holds no newline past target_bytes
  while (true) {
    if (text.size() >= target_bytes) {
      const size_t from = std::max(searched, std::min(target_bytes, text.size()) - 1);
      const void* nl = memrchr(text.data() + from, '\n', text.size() - from);
      if (nl) {
        const size_t cut = size_t(static_cast<const char*>(nl) - text.data()) + 1;
        carry_.assign(text, cut, std::string::npos);
        text.resize(cut);
        break;
      }
      searched = text.size();
    }
    if (eof_) break;
    const size_t old = text.size();
    const size_t want = std::max(target_bytes, size_t(1) << 16);
    text.resize(old + want);
    const size_t got = read_some(text.data() + old, want);
    text.resize(old + got);
    if (got == 0) eof_ = true;
  }
  if (text.empty()) return false;
  chunk->index = next_index_++;
  chunk->first_line_no = next_line_no_;
  next_line_no_ += int64_t(std::count(text.begin(), text.end(), '\n'));
  bytes_read_.fetch_add(int64_t(text.size()), std::memory_order_relaxed);
  const z_off_t off = gzoffset(static_cast<gzFile>(gz_));
  file_pos_.store(off < 0 ? 0 : std::min<int64_t>(int64_t(off), file_bytes_), std::memory_order_relaxed);
  return true;
}

}  // namespace lattice
