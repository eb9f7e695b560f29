// The work of one `lattice preprocess` worker: a chunk of jsonl lines -> the token sequences of
// its documents, per --json-keys key, ready to be appended to the datasets in input order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/preprocess.h"
#include "data/preprocess_reader.h"
#include "data/tokenizer.h"

namespace lattice {

struct EncodedChunk {
  struct Key {
    std::vector<int32_t> tokens;       // all sequences back to back
    std::vector<int32_t> seq_lengths;  // [sequences]
    std::vector<int32_t> doc_seqs;     // [documents] sequences in each document (0 if empty)
  };
  int64_t index = 0;
  int64_t input_bytes = 0;
  int64_t documents = 0, empty_documents = 0;
  std::vector<Key> keys;  // [json_keys]
  int64_t bad_lines = 0;      // skipped (skip_bad_lines)
  std::string first_bad_line;
  std::string error;          // the first bad line when not skipping: the chunk is not to be written
};

// Parses and tokenizes every line of the chunk. Never throws for bad input: a bad line is
// recorded (error, or bad_lines with skip_bad_lines) as "<input> line N: <what is wrong>".
EncodedChunk encode_chunk(const LineChunk& chunk, const PreprocessOptions& opt, const Tokenizer& tok);

}  // namespace lattice
