// Megatron's indexed dataset: prefix.bin (tokens back to back) + prefix.idx (the
// index, format in docs/data-format.md). Reading is memory-mapped; every structural
// problem (missing file, wrong magic/version/dtype, truncation, offsets past the end
// of .bin) is a one-line lattice::Error naming the file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace lattice {

// Megatron's dtype codes in the .idx header.
enum class IndexDTypeCode : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

class IndexedDataset {
 public:
  // Opens prefix.idx and prefix.bin; validates the whole index against the .bin size.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexDTypeCode dtype_code() const { return dtype_code_; }
  size_t token_bytes() const;                       // 2 for u16, 4 for i32, ...
  int64_t num_sequences() const { return int64_t(sequence_lengths_.size()); }
  int64_t num_documents() const { return int64_t(document_indices_.size()) - 1; }
  int64_t num_tokens() const;                       // sum of sequence lengths
  const std::vector<int32_t>& sequence_lengths() const { return sequence_lengths_; }
  const std::vector<int64_t>& sequence_offsets() const { return sequence_offsets_; }   // bytes
  const std::vector<int64_t>& document_indices() const { return document_indices_; }

  // Copies tokens [offset, offset+length) of sequence `seq` into out (as int32).
  void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const;

  // Checks every token id is < vocab_size (and >= 0); throws naming the file,
  // sequence and token otherwise. Called once when training starts.
  void validate_token_ids(int64_t vocab_size) const;

 private:
  std::string prefix_;
  IndexDTypeCode dtype_code_ = IndexDTypeCode::u16;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> sequence_offsets_;
  std::vector<int64_t> document_indices_;
  const uint8_t* bin_ = nullptr;  // mmap of prefix.bin
  size_t bin_size_ = 0;
};

// Writes prefix.bin/.idx. Files are written under temporary names and renamed into
// place by finalize(), so a failure never leaves a half-written pair behind.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& prefix, IndexDTypeCode dtype);
  ~IndexedDatasetBuilder();
  // Appends one sequence (a sentence, in Megatron's words; one per document here).
  void add_item(const int32_t* tokens, int64_t n);
  // Marks the end of the current document.
  void end_document();
  void finalize();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Megatron's choice: uint16 when the vocabulary fits (< 65500), else int32.
IndexDTypeCode index_dtype_for_vocab(int64_t vocab_size);

}  // namespace lattice
