// Megatron-LM's text generation API (tools/run_text_generation_server.py): PUT /api with
//   {"prompts": [text, ...], "tokens_to_generate": 64, "logprobs": false, "temperature": 1.0,
//    "top_k": 0, "top_p": 0.0, "add_BOS": false, "stop_on_eol": false, "stop_on_double_eol": false,
//    "random_seed": -1, "no_log": false}
// answered with
//   {"text": [prompt + generated text, ...], "segments": [[each token's text, ...], ...],
//    "tokens": [[prompt and generated ids, ...], ...], "logprobs": [[log p of each token after the first]]}
// ("logprobs" only when asked). Megatron's checks and limits: at most 128 prompts, temperature in
// (0, 100], top_k in [0, 1000], top_p in [0, 1] and not with top_k, tokens_to_generate 0 only with
// logprobs, an empty prompt only with add_BOS (the end-of-document token put first), the prompt and
// tokens_to_generate within the context. Decoding stops at the end-of-document token, and with
// stop_on_eol (stop_on_double_eol) after the token that makes a newline (two newlines in a row).
// Beam search and Megatron's older sampling options (beam_width, top_p_decay, top_p_bound,
// prevent_newline_after_colon, length_penalty, stop_token) are refused, naming the field.
#pragma once
#include <nlohmann/json.hpp>

#include "serve/endpoint.h"

namespace lattice {

// The reply to a PUT /api request (a RequestError for a bad one).
HttpReply megatron_generate(const nlohmann::json& request, const EndpointContext& ctx);

}  // namespace lattice
