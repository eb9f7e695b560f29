// ByteTokenizer and the --tokenizer-type factory.
#include "data/tokenizer.h"

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"
#include "data/hf_tokenizer.h"

namespace lattice {

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
  LATTICE_FAIL() << "--tokenizer-type: unknown tokenizer '" << type
                 << "' (supported: ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer)";
}

}  // namespace lattice
