// GPT2BPETokenizer: OpenAI's byte-level BPE (GPT-2, Megatron's --tokenizer-type GPT2BPETokenizer).
//   vocab.json (--vocab-file):  {"<token>": id, ...}, tokens written in GPT-2's byte-to-unicode
//                               alphabet; 50257 entries, "<|endoftext|>" = 50256 for GPT-2
//   merges.txt (--merge-file):  "#version" line, then one merge "<left> <right>" per line, by rank
// encode: pre-tokenise (gpt2_pretokenizer.h), then BPE each piece from its bytes, merging the
// lowest-ranked adjacent pair first (leftmost on ties), as OpenAI's encoder.py (data/byte_level_bpe.h;
// pieces are cached per thread). Special tokens in the text are plain text: "<|endoftext|>"
// encodes to 7 ordinary tokens; eod() is the id documents are ended with.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace lattice {

class GPT2BPETokenizer : public Tokenizer {
 public:
  // Throws lattice::Error naming --vocab-file / --merge-file and the entry or line that is wrong:
  // missing or unreadable file, bad JSON, ids not 0..N-1, a byte without a token, no
  // "<|endoftext|>", a malformed merge line, or a merge whose parts or result are not in the vocab
  // (the two files do not belong together).
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);

  std::vector<int32_t> encode(const std::string& text) const override;
  // Appends the ids of `text` to *out.
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  // The bytes of the tokens back to back; throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return bpe_.num_ids(); }
  int32_t eod() const override { return eod_; }
  const char* name() const override { return "GPT2BPETokenizer"; }
  int64_t num_merges() const { return bpe_.num_merges(); }

  // BPE of one pre-tokenised piece, without the cache; appends to *out.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const { bpe_.bpe(piece, out); }

 private:
  void load_vocab(const std::string& vocab_file);
  void load_merges(const std::string& merge_file);

  ByteLevelBpe bpe_;
  int32_t eod_ = -1;
};

}  // namespace lattice
