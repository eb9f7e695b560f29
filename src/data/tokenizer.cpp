// ByteTokenizer and the --tokenizer-type factory.
#include "data/tokenizer.h"

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"

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

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file) {
  if (type == "ByteTokenizer") return std::make_unique<ByteTokenizer>();
  if (type == "GPT2BPETokenizer") {
    if (vocab_file.empty()) LATTICE_FAIL() << "--vocab-file is required with --tokenizer-type GPT2BPETokenizer";
    if (merge_file.empty()) LATTICE_FAIL() << "--merge-file is required with --tokenizer-type GPT2BPETokenizer";
    return std::make_unique<GPT2BPETokenizer>(vocab_file, merge_file);
  }
  LATTICE_FAIL() << "--tokenizer-type: unknown tokenizer '" << type
                 << "' (supported: ByteTokenizer, GPT2BPETokenizer)";
}

}  // namespace lattice
