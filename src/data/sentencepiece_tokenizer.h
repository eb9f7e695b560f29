// Megatron's three SentencePiece tokenizers (--tokenizer-type T --tokenizer-model tokenizer.model),
// encoding and decoding through Google's SentencePiece library (libsentencepiece): the model file
// (protobuf) says the algorithm (BPE or unigram), the normalizer, byte fallback, digit splitting
// and the dummy prefix, so Llama 2's, Mistral's, Gemma's or a model trained with spm_train read
// the same way. What Megatron adds around the library, per type:
//   SentencePieceTokenizer     special tokens after the model's pieces, each added with the next
//                              id unless the model has that piece: <CLS>, <SEP>, <EOD>, <MASK>,
//                              then the pad, bos and eos pieces (<PAD>, <BOS>, <EOS> when the
//                              model has none), then <extra_id_0..N-1> (--vocab-extra-ids N).
//                              They are found in the text first (the earliest; among equal places
//                              the one added first) and the text between them goes to the model.
//                              Decoding writes each special token as " TOKEN ". EOD is <EOD>.
//   GPTSentencePieceTokenizer  the model alone; the end of document is its eos id.
//   Llama2Tokenizer            the model's bos id, then the text's ids; the end of document is its
//                              eos id.
// The vocabulary is the model's pieces (plus SentencePieceTokenizer's additions).
//
// A HuggingFace model's folder may add tokens to the model's pieces (tokenizer_config.json's
// added_tokens_decoder: Phi-3's <|user|>, <|assistant|>, <|end|> after Llama 2's 32000 pieces). For
// Llama2Tokenizer and GPTSentencePieceTokenizer they extend the vocabulary (their ids after the pieces,
// one after the other), a chat template's text finds them as their ids (with their lstrip and rstrip: the
// whitespace before or after them taken with them, as HuggingFace's tokenizers take it), decoding writes
// their text, and the end of document is the eos_token tokenizer_config.json names when it is one of them.
// Megatron's encode (preprocess) stays the model's alone.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace lattice {

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class Kind { kSentencePiece, kGptSentencePiece, kLlama2 };

  // `path`: the model file, or a folder holding tokenizer.model. Throws lattice::Error naming
  // --tokenizer-model, the file and what is wrong (missing, not a SentencePiece model, no eos).
  SentencePieceTokenizer(Kind kind, const std::string& path, int64_t vocab_extra_ids = 0);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;
  void encode_append(std::string_view text, std::vector<int32_t>* out) const override;
  // A chat template's text: Llama2Tokenizer and GPTSentencePieceTokenizer find the model's bos and eos
  // pieces' texts (<s>, </s>) in it as those ids, as HuggingFace's tokenizers find special tokens, and
  // encode the text between them with the model alone (no bos added). SentencePieceTokenizer: encode.
  std::vector<int32_t> encode_without_specials(const std::string& text) const override;
  // The library's decoding (control tokens such as <s> give nothing); SentencePieceTokenizer's
  // special tokens as " TOKEN ". Throws naming an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  const char* name() const override;

  // The model file actually read (a folder's tokenizer.model).
  const std::string& model_file() const { return file_; }
  // Whether --tokenizer-type `type` is one of the three.
  static bool is_type(const std::string& type) {
    return type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer";
  }

 private:
  void encode_model(std::string_view text, std::vector<int32_t>* out) const;  // the library alone
  // HuggingFace's added tokens beside the model (tokenizer_config.json's added_tokens_decoder).
  void read_added_tokens(const std::string& config_file);
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool lstrip = false, rstrip = false;
  };
  std::vector<AddedToken> added_;

  Kind kind_;
  std::string file_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int64_t pieces_ = 0;                                // the model's piece count
  std::vector<std::pair<std::string, int32_t>> special_;  // SentencePieceTokenizer's, in order added
  std::unordered_map<int32_t, std::string> special_text_;  // id -> token
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, bos_ = -1;
};

}  // namespace lattice
