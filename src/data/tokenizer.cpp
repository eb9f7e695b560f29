// ByteTokenizer and the --tokenizer-type factory.
#include "data/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"
#include "data/hf_tokenizer.h"

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
  auto refuse = [&](const std::string& value, const char* flag, const char* belongs_to) {
    if (!value.empty())
      LATTICE_FAIL() << flag << " does not apply to --tokenizer-type " << type << " (it belongs to " << belongs_to << ")";
  };
  if (type == "ByteTokenizer") {
    refuse(spec.vocab_file, "--vocab-file", "GPT2BPETokenizer");
    refuse(spec.merge_file, "--merge-file", "GPT2BPETokenizer");
    refuse(spec.model, "--tokenizer-model", "HuggingFaceTokenizer");
    return std::make_unique<ByteTokenizer>();
  }
  if (type == "GPT2BPETokenizer") {
    refuse(spec.model, "--tokenizer-model", "HuggingFaceTokenizer");
    if (spec.vocab_file.empty()) LATTICE_FAIL() << "--vocab-file is required with --tokenizer-type GPT2BPETokenizer";
    if (spec.merge_file.empty()) LATTICE_FAIL() << "--merge-file is required with --tokenizer-type GPT2BPETokenizer";
    return std::make_unique<GPT2BPETokenizer>(spec.vocab_file, spec.merge_file);
  }
  if (type == "HuggingFaceTokenizer") {
    refuse(spec.vocab_file, "--vocab-file", "GPT2BPETokenizer");
    refuse(spec.merge_file, "--merge-file", "GPT2BPETokenizer");
    if (spec.model.empty())
      LATTICE_FAIL() << "--tokenizer-model is required with --tokenizer-type HuggingFaceTokenizer (tokenizer.json or "
                        "the folder that holds it)";
    return std::make_unique<HuggingFaceTokenizer>(spec.model);
  }
  if (type == "NullTokenizer") {
    refuse(spec.vocab_file, "--vocab-file", "GPT2BPETokenizer");
    refuse(spec.merge_file, "--merge-file", "GPT2BPETokenizer");
    refuse(spec.model, "--tokenizer-model", "HuggingFaceTokenizer");
    if (spec.vocab_size <= 0 || spec.vocab_size >= INT32_MAX)
      LATTICE_FAIL() << "--vocab-size N (1.." << INT32_MAX - 1
                     << ") is required with --tokenizer-type NullTokenizer (ids 0..N-1; N is the end of document)";
    return std::make_unique<NullTokenizer>(spec.vocab_size);
  }
  LATTICE_FAIL() << "--tokenizer-type: unknown tokenizer '" << type
                 << "' (supported: ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer)";
}

}  // namespace lattice
