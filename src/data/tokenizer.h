// Tokenizers. ByteTokenizer: ids 0..255 are the bytes, 256 is the end-of-document.
// NullTokenizer (Megatron's, for text that is already token ids): the text is ids separated by
// white space, --vocab-size N of them (0..N-1), and N is the end-of-document (N + 1 in all).
// GPT2BPETokenizer (OpenAI's byte-level BPE): data/gpt2_bpe_tokenizer.h.
// HuggingFaceTokenizer (tokenizer.json, byte-level BPE: Llama 3 and others): data/hf_tokenizer.h.
// SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer (a SentencePiece model file:
// Llama 2, Mistral, T5, ...): data/sentencepiece_tokenizer.h.
// TikTokenizer (tiktoken's algorithm over a JSON list of ranked byte strings: Nemotron, Mistral's
// tekken): data/tiktoken_tokenizer.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Appends the ids of `text` to *out (no temporary vector on the preprocessing hot path).
  virtual void encode_append(std::string_view text, std::vector<int32_t>* out) const {
    const std::vector<int32_t> ids = encode(std::string(text));
    out->insert(out->end(), ids.begin(), ids.end());
  }
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The ids of the text alone, without those the tokenizer adds around every text (HuggingFace's
  // post-processor template, such as Llama 3's <|begin_of_text|>): HuggingFace's
  // encode(text, add_special_tokens=False), how a chat template's text is encoded (it writes them).
  virtual std::vector<int32_t> encode_without_specials(const std::string& text) const { return encode(text); }
  virtual int64_t vocab_size() const = 0;   // unpadded
  virtual int32_t eod() const = 0;
  virtual const char* name() const = 0;
};

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  const char* name() const override { return "ByteTokenizer"; }
};

class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size) : n_(vocab_size) {}
  // Throws naming the word that is not an id in 0..N (the end of document included).
  std::vector<int32_t> encode(const std::string& text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  // The ids in decimal, separated by single spaces.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return n_ + 1; }
  int32_t eod() const override { return int32_t(n_); }
  const char* name() const override { return "NullTokenizer"; }

 private:
  int64_t n_;
};

// A tokenizer file's whole content; `what` (the flag and the path) starts the error when it
// cannot be opened or read.
std::string read_tokenizer_file(const std::string& path, const std::string& what);

// The tokenizer flags (Megatron's names).
struct TokenizerSpec {
  std::string type = {};        // --tokenizer-type
  std::string vocab_file = {};  // --vocab-file (GPT2BPETokenizer)
  std::string merge_file = {};  // --merge-file (GPT2BPETokenizer)
  std::string model = {};       // --tokenizer-model (HuggingFaceTokenizer: tokenizer.json or its folder;
                                // the SentencePiece types: tokenizer.model or its folder;
                                // TikTokenizer: its JSON vocabulary)
  int64_t vocab_size = 0;  // --vocab-size (NullTokenizer: ids 0..N-1, N the end of document)
  int64_t vocab_extra_ids = 0;  // --vocab-extra-ids (SentencePieceTokenizer: <extra_id_0..N-1>)
  // TikTokenizer: --tiktoken-pattern (v1 or v2), --tiktoken-num-special-tokens (0: Megatron's
  // 1000), --tiktoken-special-tokens (empty: <unk> <s> </s>); --vocab-size (0: 131072).
  std::string tiktoken_pattern = {};
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> tiktoken_special_tokens = {};
};

// Builds the tokenizer named by --tokenizer-type: ByteTokenizer; GPT2BPETokenizer from
// --vocab-file and --merge-file; HuggingFaceTokenizer and the SentencePiece types from
// --tokenizer-model; NullTokenizer of --vocab-size. Errors name the flag (unknown type, missing,
// superfluous or bad file).
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec);

}  // namespace lattice
