// Streaming input for `lattice preprocess`: reads a .jsonl or .jsonl.gz file (zlib reads plain
// files through unchanged) in chunks of whole lines, so memory stays bounded by the chunk size
// (plus the longest line) whatever the file size.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

namespace lattice {

struct LineChunk {
  int64_t index = 0;          // 0, 1, 2, ... in input order
  int64_t first_line_no = 1;  // 1-based line number of the chunk's first line
  std::string text;           // whole lines, each ending in '\n' (the file's last line may not)
};

class JsonlChunkReader {
 public:
  // Throws lattice::Error naming the file if it cannot be opened or is a directory.
  explicit JsonlChunkReader(const std::string& path);
  ~JsonlChunkReader();
  JsonlChunkReader(const JsonlChunkReader&) = delete;
  JsonlChunkReader& operator=(const JsonlChunkReader&) = delete;

  // Fills *chunk with the next lines (about target_bytes of them, at least one whole line);
  // false at the end of the input. Throws naming the file on a read or decompression error.
  bool next(LineChunk* chunk, size_t target_bytes);

  int64_t file_bytes() const { return file_bytes_; }  // size on disk (compressed for .gz)
  // Position in the file on disk after the last chunk; safe to read from another thread.
  int64_t file_bytes_read() const { return file_pos_.load(std::memory_order_relaxed); }
  // Uncompressed bytes handed out so far; safe to read from another thread.
  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  size_t read_some(char* dst, size_t n);  // 0 at the end

  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::string carry_;   // bytes read past the last full line of the previous chunk
  int64_t next_index_ = 0, next_line_no_ = 1;
  int64_t file_bytes_ = 0;
  std::atomic<int64_t> bytes_read_{0}, file_pos_{0};
  bool eof_ = false;
};

}  // namespace lattice
