// Megatron's TikTokenizer (--tokenizer-type TikTokenizer --tokenizer-model vocab.json
// --tiktoken-pattern v1|v2 [--tiktoken-num-special-tokens S] [--tiktoken-special-tokens T ...]
// [--vocab-size V]): OpenAI's tiktoken algorithm over a vocabulary of byte strings by rank, as
// Nemotron's and Mistral's (tekken) vocabularies ship it.
//   vocab.json     a JSON list, entry i {"rank": i, "token_bytes": base64, "token_str": ...}; the
//                  first 256 are the single bytes 0..255. Only the first V - S entries are used.
//   ids            0..S-1 the special tokens: --tiktoken-special-tokens (default <unk> <s> </s>;
//                  they must include those three) then <SPECIAL_k> up to S (default 1000); then
//                  rank r is id S + r. V defaults to 131072 (2^17), as in Megatron.
//   encoding       Megatron's tokenize(): tiktoken's encode_ordinary. The text is cut by the
//                  pattern (v1 or v2, Megatron's), a piece that is a token is that token, and the
//                  others merge adjacent parts by the rank of their concatenation, lowest first,
//                  leftmost among equals. Special tokens in the text are plain text.
//   end of doc     </s>; decoding writes the tokens' bytes (special tokens as their text).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/regex.h"
#include "data/tokenizer.h"

namespace lattice {

class TikTokenizer : public Tokenizer {
 public:
  // Throws lattice::Error naming the flag or the file and what is wrong.
  TikTokenizer(const std::string& path, const std::string& pattern, int64_t vocab_size, int64_t num_special_tokens,
               const std::vector<std::string>& special_tokens);
  ~TikTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  const char* name() const override { return "TikTokenizer"; }

  // Megatron's two patterns, by --tiktoken-pattern name ("v1", "v2"); throws on another name.
  static const char* pattern_regex(const std::string& name);

 private:
  ByteLevelBpe bpe_;  // ids S + rank
  std::unique_ptr<Regex> regex_;
  std::vector<std::string> special_;  // [S] id -> text
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1;
};

}  // namespace lattice
