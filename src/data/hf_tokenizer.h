// HuggingFaceTokenizer (Megatron's --tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH):
// a byte-level BPE tokenizer read from HuggingFace's tokenizer.json, as Llama 3, GPT-2 and most
// recent vocabularies ship it. PATH is the folder that holds tokenizer.json, or the file itself.
// What is read, and how it encodes (as HuggingFace's tokenizers library does):
//   added_tokens    found in the text first, longest match at the leftmost place; lstrip/rstrip
//                   take the white space beside them. Each is its own id. As HuggingFace's, those
//                   with "normalized": false are found in the text as given, then the rest in the
//                   normalized text between them.
//   normalizer      NFC, NFD, NFKC or NFKD (Unicode normalization, by ICU; Qwen2's NFC), alone or
//                   as a Sequence of one.
//   pre_tokenizer   cuts the text between them into pieces: ByteLevel (use_regex: GPT-2's pattern;
//                   add_prefix_space), Split (a regex or string pattern; behaviour Isolated,
//                   Removed, MergedWithPrevious, MergedWithNext or Contiguous; invert), Digits,
//                   or a Sequence of these (Llama 3: Split on its regex, then ByteLevel).
//   model           BPE over each piece's bytes: vocab, merges ("a b" strings or [a, b] pairs)
//                   by rank, ignore_merges (a piece that is a token is that token).
//   post_processor  TemplateProcessing's single sequence: the ids before and after the text
//                   (Llama 3's <|begin_of_text|>); ByteLevel (no change to ids); a Sequence.
//   decoder         ByteLevel: tokens back to their bytes, added tokens to their text.
// The end-of-document id (Megatron's tokenizer.eod) is eos_token of tokenizer_config.json, else
// of special_tokens_map.json, beside tokenizer.json. The vocabulary size is the highest id + 1.
// Anything else (another normalizer, another model, BPE dropout, byte fallback, another
// pre-tokenizer, processor or decoder) is refused at load with one line naming the file and the key.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/byte_level_bpe.h"
#include "data/regex.h"
#include "data/tokenizer.h"

namespace lattice {

class HuggingFaceTokenizer : public Tokenizer {
 public:
  // Throws lattice::Error naming --tokenizer-model, the file and what is wrong.
  explicit HuggingFaceTokenizer(const std::string& path);
  ~HuggingFaceTokenizer() override;

  // HuggingFace's encode(text) (add_special_tokens on): the template's ids around the text's.
  std::vector<int32_t> encode(const std::string& text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  std::vector<int32_t> encode_without_specials(const std::string& text) const override;
  // The tokens' bytes back to back, added tokens as their text; throws on an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  const char* name() const override { return "HuggingFaceTokenizer"; }

  // One pre-tokenizer step (tokenizer.json's pre_tokenizer, flattened); defined in the .cpp.
  struct Step;
  struct AddedToken {
    int32_t id;
    std::string content;
    bool lstrip, rstrip;
    bool normalized;  // found in the normalized text (after the others, which are found in the raw text)
  };
  enum class Normalization { none, nfc, nfd, nfkc, nfkd };

 private:
  // The added tokens of one pass, longest first, and the bytes they start with.
  struct AddedSet {
    std::vector<AddedToken> tokens;
    bool first_bytes[256] = {};
  };
  // Splits `text` on `set`'s tokens: each token's id to *out, each stretch between them to gap().
  template <class Gap>
  void split_added(std::string_view text, const AddedSet& set, std::vector<int32_t>* out, Gap&& gap) const;
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;  // no added tokens in it
  void encode_body(std::string_view text, std::vector<int32_t>* out) const;  // without the template's ids

  ByteLevelBpe bpe_;
  std::vector<AddedToken> added_;       // longest content first
  AddedSet added_raw_, added_normalized_;  // the two passes: "normalized" false, then true
  Normalization normalization_ = Normalization::none;
  std::unordered_map<int32_t, std::string> added_text_;  // id -> content
  std::vector<std::unique_ptr<Step>> steps_;
  bool add_prefix_space_ = false;       // a leading ByteLevel pre-tokenizer's
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // TemplateProcessing's single sequence
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1;
};

}  // namespace lattice
