#include "serve/token_text.h"

#include <algorithm>

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

std::string token_piece(const Tokenizer& tok, const std::vector<int32_t>& tokens, size_t k, int32_t t) {
  std::vector<int32_t> window(tokens.begin() + long(k - std::min<size_t>(k, 4)), tokens.begin() + long(k));
  if (window.empty()) return tok.decode({t});
  const std::string before = tok.decode(window);
  window.push_back(t);
  const std::string with = tok.decode(window);
  return with.compare(0, before.size(), before) == 0 ? with.substr(before.size()) : tok.decode({t});
}

std::vector<std::string> token_pieces(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) pieces.push_back(token_piece(tok, tokens, k, tokens[k]));
  return pieces;
}

}  // namespace lattice
