// ByteTokenizer and the --tokenizer-type factory.
#include "data/tokenizer.h"

#include "core/error.h"

namespace lattice {

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
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
  if (type == "GPT2BPETokenizer") LATTICE_FAIL() << "--tokenizer-type GPT2BPETokenizer is not supported yet";
  LATTICE_FAIL() << "--tokenizer-type: unknown tokenizer '" << type << "' (supported: ByteTokenizer)";
}

}  // namespace lattice
