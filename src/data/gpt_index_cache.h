// The GPTDataset index cache file: one file holding the description the indices were
// built from, the three index arrays and a checksum, written under a temporary name
// and renamed into place (a reader never sees a partial file). A file whose size,
// description or checksum does not match is rejected with the reason.
//
// Layout (little-endian): "LATGPTIX" | u64 version (1) | u64 description bytes |
// u64 num_epochs | u64 separate_final_epoch | u64 document_index count (i32) |
// u64 sample_index count (i64) | u64 shuffle_index count (i64) | u64 checksum |
// description | document_index | sample_index | shuffle_index.
#pragma once
#include <cstdint>
#include <string>

#include "data/gpt_dataset.h"

namespace lattice {

// FNV-1a over 64-bit words (bytes for the tail): names cache files and checks them.
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ULL);

struct IndexCacheRead {
  enum Status { missing, ok, invalid } status = missing;
  std::string reason;  // why an existing file is invalid
  GPTDatasetIndices indices;
};

IndexCacheRead read_gpt_index_cache(const std::string& path, const std::string& description);

// Throws lattice::Error naming the file when it cannot be written.
void write_gpt_index_cache(const std::string& path, const std::string& description,
                           const GPTDatasetIndices& indices);

}  // namespace lattice
