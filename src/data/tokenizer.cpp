// ByteTokenizer and the --tokenizer-type factory.
#include "data/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

namespace lattice {

std::string read_tokenizer_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LATTICE_FAIL() << what << ": cannot open: " << std::strerror(errno);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) LATTICE_FAIL() << what << ": read failed";
  return ss.str();
}

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

void ByteTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  for (char c : text) out->push_back(int32_t(static_cast<unsigned char>(c)));
}

// The end-of-document token and ids outside the byte range decode to nothing.
std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id <= 255) text.push_back(char(static_cast<unsigned char>(id)));
  return text;
}

std::vector<int32_t> NullTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  encode_append(text, &ids);
  return ids;
}

void NullTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  for (size_t pos = 0; pos < text.size();) {
    if (space(text[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !space(text[end])) ++end;
    const std::string_view word = text.substr(pos, end - pos);
    int64_t id = 0;
    bool ok = word.size() <= 18;
    for (char c : word) {
      ok = ok && c >= '0' && c <= '9';
      id = id * 10 + (c - '0');
    }
    if (!ok || id > n_)
      LATTICE_FAIL() << "NullTokenizer: '" << word.substr(0, 40) << "' is not a token id (0.." << n_
                     << ", the text of a NullTokenizer is ids separated by white space)";
    out->push_back(int32_t(id));
    pos = end;
  }
}

std::string NullTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) text.push_back(' ');
    text += std::to_string(ids[i]);
  }
  return text;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec) {
  const std::string& type = spec.type;
  auto refuse = [&](bool given, const char* flag, const char* belongs_to) {
    if (given)
      LATTICE_FAIL() << flag << " does not apply to --tokenizer-type " << type << " (it belongs to " << belongs_to << ")";
  };
  const bool sentencepiece = SentencePieceTokenizer::is_type(type);
  const bool known = type == "ByteTokenizer" || type == "GPT2BPETokenizer" || type == "HuggingFaceTokenizer" ||
                     type == "NullTokenizer" || type == "TikTokenizer" || sentencepiece;
  if (!known)
    LATTICE_FAIL() << "--tokenizer-type: unknown tokenizer '" << type
                   << "' (supported: ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
                      "GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, NullTokenizer)";
  // Each file or size flag belongs to some types; given to another it is an error, so that a
  // forgotten --tokenizer-type does not silently train on another tokenizer.
  if (type != "GPT2BPETokenizer") {
    refuse(!spec.vocab_file.empty(), "--vocab-file", "GPT2BPETokenizer");
    refuse(!spec.merge_file.empty(), "--merge-file", "GPT2BPETokenizer");
  }
  if (type != "HuggingFaceTokenizer" && type != "TikTokenizer" && !sentencepiece)
    refuse(!spec.model.empty(), "--tokenizer-model", "HuggingFaceTokenizer, TikTokenizer and the SentencePiece tokenizers");
  if (type != "SentencePieceTokenizer")
    refuse(spec.vocab_extra_ids != 0, "--vocab-extra-ids", "SentencePieceTokenizer");
  if (type != "TikTokenizer") {
    refuse(!spec.tiktoken_pattern.empty(), "--tiktoken-pattern", "TikTokenizer");
    refuse(spec.tiktoken_num_special_tokens != 0, "--tiktoken-num-special-tokens", "TikTokenizer");
    refuse(!spec.tiktoken_special_tokens.empty(), "--tiktoken-special-tokens", "TikTokenizer");
  }

  if (type == "ByteTokenizer") return std::make_unique<ByteTokenizer>();
  if (type == "GPT2BPETokenizer") {
    if (spec.vocab_file.empty()) LATTICE_FAIL() << "--vocab-file is required with --tokenizer-type GPT2BPETokenizer";
    if (spec.merge_file.empty()) LATTICE_FAIL() << "--merge-file is required with --tokenizer-type GPT2BPETokenizer";
    return std::make_unique<GPT2BPETokenizer>(spec.vocab_file, spec.merge_file);
  }
  if (type == "HuggingFaceTokenizer") {
    if (spec.model.empty())
      LATTICE_FAIL() << "--tokenizer-model is required with --tokenizer-type HuggingFaceTokenizer (tokenizer.json or "
                        "the folder that holds it)";
    return std::make_unique<HuggingFaceTokenizer>(spec.model);
  }
  if (sentencepiece) {
    if (spec.model.empty())
      LATTICE_FAIL() << "--tokenizer-model is required with --tokenizer-type " << type
                     << " (a SentencePiece model file, or the folder that holds tokenizer.model)";
    const auto kind = type == "Llama2Tokenizer"             ? SentencePieceTokenizer::Kind::kLlama2
                      : type == "GPTSentencePieceTokenizer" ? SentencePieceTokenizer::Kind::kGptSentencePiece
                                                            : SentencePieceTokenizer::Kind::kSentencePiece;
    return std::make_unique<SentencePieceTokenizer>(kind, spec.model, spec.vocab_extra_ids);
  }
  if (type == "TikTokenizer") {
    if (spec.model.empty())
      LATTICE_FAIL() << "--tokenizer-model is required with --tokenizer-type TikTokenizer (its JSON vocabulary)";
    if (spec.tiktoken_pattern.empty())
      LATTICE_FAIL() << "--tiktoken-pattern v1|v2 is required with --tokenizer-type TikTokenizer";
    return std::make_unique<TikTokenizer>(spec.model, spec.tiktoken_pattern, spec.vocab_size,
                                          spec.tiktoken_num_special_tokens ? spec.tiktoken_num_special_tokens : 1000,
                                          spec.tiktoken_special_tokens);
  }
  // NullTokenizer
  if (spec.vocab_size <= 0 || spec.vocab_size >= INT32_MAX)
    LATTICE_FAIL() << "--vocab-size N (1.." << INT32_MAX - 1
                   << ") is required with --tokenizer-type NullTokenizer (ids 0..N-1; N is the end of document)";
  return std::make_unique<NullTokenizer>(spec.vocab_size);
}

}  // namespace lattice
