// A HuggingFace model's generation_config.json, as far as lattice's generation reads it: the tokens that
// end a generated text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace lattice {

// The tokens that end a generated text: the tokenizer's end of document, then the eos_token_id (an id or a
// list) of the generation_config.json beside the tokenizer's files (tokenizer_model: a file or its folder;
// a converted HuggingFace model's folder: Llama 3.1's <|end_of_text|>, <|eom_id|> and <|eot_id|>, Phi-3's
// <|endoftext|>, <|assistant|> and <|end|>), as transformers' generate stops at any of them. Throws naming
// the file when it is not JSON or an id is no token of tok.
std::vector<int32_t> generation_stop_tokens(const Tokenizer& tok, const std::string& tokenizer_model);

}  // namespace lattice
