// GPT-2's pre-tokenisation: the text is cut into pieces by the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (leftmost alternative wins), implemented by hand on UTF-8. \s is Unicode White_Space, as in
// tiktoken (OpenAI's Rust encoder); the class table is generated from node's regex engine
// (scripts/gen-unicode-table.mjs). BPE then runs on each piece separately.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lattice {

enum class CharClass : uint8_t { kOther = 0, kLetter, kNumber, kSpace };

// Class of a code point (kOther for anything not a letter, number or white space).
CharClass unicode_class(uint32_t cp);

// Decodes the UTF-8 character at text[pos] (pos < text.size()): sets *len to its byte length and
// returns its class. A byte that does not start a valid UTF-8 character is one kOther character
// of length 1, so every byte string (even invalid UTF-8) is cut into pieces that cover it exactly.
CharClass char_class_at(std::string_view text, size_t pos, size_t* len);

// End (exclusive) of the piece that starts at text[pos], pos < text.size(). Pieces are never
// empty, so `for (p = 0; p < n; p = end) end = gpt2_piece_end(text, p);` walks the whole text.
size_t gpt2_piece_end(std::string_view text, size_t pos);

}  // namespace lattice
