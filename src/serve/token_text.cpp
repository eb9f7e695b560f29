#include "serve/token_text.h"

namespace lattice {

std::string continuation_text(const Tokenizer& tok, const std::vector<int32_t>& tokens, int64_t prompt_length) {
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + prompt_length);
  const std::vector<int32_t> added(tokens.begin() + prompt_length, tokens.end());
  if (added.empty()) return "";
  const std::string before = tok.decode(prompt), all = tok.decode(tokens);
  if (all.compare(0, before.size(), before) == 0) return all.substr(before.size());
  return tok.decode(added);
}

size_t streamable_prefix(const std::string& text, size_t hold) {
  size_t end = text.size() > hold ? text.size() - hold : 0;
  // Back off from a lead byte whose character is not complete before end.
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) end -= back;
    break;
  }
  return end;
}

std::vector<std::string> token_pieces(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  for (int32_t t : tokens) pieces.push_back(tok.decode({t}));
  return pieces;
}

}  // namespace lattice
