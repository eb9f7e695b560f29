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

// How much of a text being made can be sent now: its longest prefix that ends neither inside a UTF-8
// character (a byte-level token may end mid-character) nor within its last `hold` bytes (where a stop
// string may be beginning).
size_t streamable_prefix(const std::string& text, size_t hold);

// The text token t adds after tokens[0:k]: decode of up to 4 tokens before it with t, past their own
// decode (so that SentencePiece's word marker shows as the space it is mid-text, and a byte-level
// character's bytes stay with their neighbours), or t decoded alone when that is no prefix.
std::string token_piece(const Tokenizer& tok, const std::vector<int32_t>& tokens, size_t k, int32_t t);

// Each token's text in its place: token_piece(tok, tokens, k, tokens[k]) for every k.
std::vector<std::string> token_pieces(const Tokenizer& tok, const std::vector<int32_t>& tokens);

}  // namespace lattice
