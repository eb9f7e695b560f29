// The byte-level BPE engine shared by GPT2BPETokenizer and HuggingFaceTokenizer: a vocabulary of
// byte strings, a table of merges by rank, and the merge loop (lowest rank first, leftmost on
// ties) over one pre-tokenised piece, with a per-thread cache of pieces.
// Files write tokens in GPT-2's byte-to-unicode alphabet (byte b as one code point: printable
// Latin-1 bytes as themselves, the others as 256 + k); byte_alphabet_to_bytes() reads it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lattice {

// A token as written in vocab/merges (UTF-8 of alphabet characters) -> its raw bytes; false if a
// character is not in GPT-2's byte alphabet.
bool byte_alphabet_to_bytes(std::string_view s, std::string* out);

class ByteLevelBpe {
  struct StringHash {  // lets the maps be searched with a string_view
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

 public:
  ByteLevelBpe();

  // Room for this many tokens and merges (loading is mostly hash-table inserts).
  void reserve(size_t tokens, size_t merges) {
    bytes_to_id_.reserve(tokens);
    merges_.reserve(merges);
  }
  // Token `id` spells `bytes`. When two ids spell the same bytes the first one added encodes them.
  void add_token(int32_t id, const std::string& bytes);
  // Id of the token spelling `bytes`, or -1.
  int32_t find(std::string_view bytes) const;
  // The pair (left, right) merges into `merged`, with the next rank (the order of the calls).
  // False when the pair already has a merge.
  bool add_merge(int32_t left, int32_t right, int32_t merged);
  // The pair merges into `merged` with the given rank; pairs may share a rank (tiktoken's rule:
  // every split of a token into two tokens has that token's rank, so among them the leftmost
  // merges first). Not to be mixed with add_merge. False when the pair already has a merge.
  bool add_merge_ranked(int32_t left, int32_t right, int32_t merged, uint32_t rank);
  // After the tokens: looks up the 256 single bytes. Returns the first byte without a token, or
  // -1 when all have one.
  int index_bytes();
  // ignore_merges (HuggingFace's BPE option): a piece that is itself a token encodes as that token.
  void set_whole_piece_first(bool on) { whole_piece_first_ = on; }

  int64_t num_ids() const { return int64_t(id_to_bytes_.size()); }  // highest id + 1
  int64_t num_merges() const { return int64_t(merges_.size()); }
  bool has_id(int32_t id) const { return id >= 0 && id < int32_t(id_to_bytes_.size()) && has_id_[size_t(id)]; }
  const std::string& bytes_of(int32_t id) const { return id_to_bytes_[size_t(id)]; }

  // BPE of one piece, without the cache; appends to *out.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  // The ids of one pre-tokenised piece (the cache, then bpe()); appends to *out.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  std::vector<std::string> id_to_bytes_;  // [V] raw bytes of each token
  std::vector<bool> has_id_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_to_id_;
  int32_t byte_ids_[256];                 // id of each single byte
  std::unordered_map<uint64_t, uint64_t> merges_;  // (left << 32 | right) -> (rank << 32 | merged id)
  uint64_t next_rank_ = 0;
  bool whole_piece_first_ = false;
  uint64_t instance_ = 0;                 // tells this engine's per-thread cache apart
};

}  // namespace lattice
