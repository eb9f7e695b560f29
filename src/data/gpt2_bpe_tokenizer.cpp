// GPT-2 byte-level BPE: loading vocab.json/merges.txt, encode (data/byte_level_bpe.h), decode.
#include "data/gpt2_bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/gpt2_pretokenizer.h"

namespace lattice {

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  load_vocab(vocab_file);
  load_merges(merge_file);
}

void GPT2BPETokenizer::load_vocab(const std::string& vocab_file) {
  const std::string where = "--vocab-file " + vocab_file;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_tokenizer_file(vocab_file, "--vocab-file " + vocab_file));
  } catch (const nlohmann::json::parse_error& e) {
    LATTICE_FAIL() << where << ": not valid JSON (byte " << e.byte << "); expected GPT-2's vocab.json";
  }
  if (!j.is_object() || j.empty())
    LATTICE_FAIL() << where << ": expected a JSON object of token -> id (GPT-2's vocab.json)";
  std::vector<bool> seen(j.size(), false);
  std::string bytes;
  for (const auto& [token, value] : j.items()) {
    if (!value.is_number_integer())
      LATTICE_FAIL() << where << ": id of token '" << token << "' is " << value.type_name() << ", expected an integer";
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id >= int64_t(j.size()))
      LATTICE_FAIL() << where << ": id " << id << " of token '" << token << "' is outside 0.." << j.size() - 1
                     << " (ids must be 0..N-1 for N entries)";
    if (seen[size_t(id)]) LATTICE_FAIL() << where << ": id " << id << " is used twice (token '" << token << "')";
    seen[size_t(id)] = true;
    if (token == "<|endoftext|>") {
      eod_ = int32_t(id);
      bytes = token;
    } else if (!byte_alphabet_to_bytes(token, &bytes)) {
      LATTICE_FAIL() << where << ": token '" << token << "' (id " << id
                     << ") has a character outside GPT-2's byte-to-unicode alphabet";
    }
    // The special token's text is also a byte string ordinary tokens could spell; the first id
    // added encodes it.
    bpe_.add_token(int32_t(id), bytes);
  }
  if (eod_ < 0) LATTICE_FAIL() << where << ": no '<|endoftext|>' token (the end-of-document id)";
  if (const int b = bpe_.index_bytes(); b >= 0)
    LATTICE_FAIL() << where << ": no token for byte " << b << " (a byte-level BPE vocab has all 256)";
}

void GPT2BPETokenizer::load_merges(const std::string& merge_file) {
  const std::string where = "--merge-file " + merge_file;
  const std::string text = read_tokenizer_file(merge_file, "--merge-file " + merge_file);
  std::string left, right;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      LATTICE_FAIL() << where << " line " << line_no << ": expected '<left> <right>', got '" << line << "'";
    const std::string_view l = line.substr(0, sp), r = line.substr(sp + 1);
    if (!byte_alphabet_to_bytes(l, &left) || !byte_alphabet_to_bytes(r, &right))
      LATTICE_FAIL() << where << " line " << line_no << ": '" << line
                     << "' has a character outside GPT-2's byte-to-unicode alphabet";
    auto id_of = [&](const std::string& bytes, std::string_view shown) {
      const int32_t id = bpe_.find(bytes);
      if (id < 0)
        LATTICE_FAIL() << where << " line " << line_no << ": '" << shown << "' is not a token of --vocab-file"
                       << " (the vocab and merges files do not belong together)";
      return id;
    };
    const int32_t a = id_of(left, l), b = id_of(right, r);
    const int32_t merged = id_of(left + right, std::string(l) + std::string(r));
    if (!bpe_.add_merge(a, b, merged))
      LATTICE_FAIL() << where << " line " << line_no << ": merge '" << line << "' appears twice";
  }
  if (bpe_.num_merges() == 0) LATTICE_FAIL() << where << ": no merges (expected GPT-2's merges.txt)";
}

void GPT2BPETokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  for (size_t pos = 0, end = 0; pos < text.size(); pos = end) {
    end = gpt2_piece_end(text, pos);
    bpe_.encode_piece(text.substr(pos, end - pos), out);
  }
}

std::vector<int32_t> GPT2BPETokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, &ids);
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (!bpe_.has_id(id))
      LATTICE_FAIL() << "GPT2BPETokenizer: token id " << id << " is outside the vocabulary (0.."
                     << bpe_.num_ids() - 1 << ")";
    text += bpe_.bytes_of(id);
  }
  return text;
}

}  // namespace lattice
