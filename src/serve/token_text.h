// Texts of decoded tokens as `lattice serve` returns them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace lattice {

// The text tokens[prompt_length:] add after the prompt's: decode(tokens) past decode(prompt) when that
// is its prefix (so that tokenizers whose decode joins tokens, with spaces or word markers, continue
// as they decode), else the new tokens decoded alone.
std::string continuation_text(const Tokenizer& tok, const std::vector<int32_t>& tokens, int64_t prompt_length);

// Each token's own text (decode of it alone): [tokens.size()].
std::vector<std::string> token_pieces(const Tokenizer& tok, const std::vector<int32_t>& tokens);

}  // namespace lattice
