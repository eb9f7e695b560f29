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

std::vector<std::string> token_pieces(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<std::string> pieces;
  pieces.reserve(tokens.size());
  for (int32_t t : tokens) pieces.push_back(tok.decode({t}));
  return pieces;
}

}  // namespace lattice
