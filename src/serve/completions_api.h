// OpenAI's completions API (POST /v1/completions, also /completions as Megatron-LM serves it), the
// one evaluation harnesses and OpenAI clients speak:
//   {"model": name, "prompt": text | [text, ...] | [id, ...] | [[id, ...], ...], "max_tokens": 16,
//    "temperature": 1, "top_p": 1, "top_k": 0, "logprobs": null | n, "echo": false, "seed": s,
//    "stop": null | text | [text, ...], "n": 1, "best_of": n, "stream": false,
//    "stream_options": {"include_usage": false}}
// answered with
//   {"id": "cmpl-...", "object": "text_completion", "created": unix time, "model": name,
//    "choices": [{"index": i, "text": ..., "finish_reason": "stop" | "length",
//                 "logprobs": {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: log p}],
//                              "text_offset": [...]}}],
//    "usage": {"prompt_tokens": ..., "completion_tokens": ..., "total_tokens": ...}}.
// temperature 0 is greedy. With echo the prompt's text and tokens come first (its first token has no
// log-probability: null). "logprobs" (n <= 20) returns every returned token's log-probability and the
// n likeliest tokens' at each position (absent when the field is). Decoding stops at the
// end-of-document token and at the first stop string (the text cut before it). Token-id prompts are
// decoded as given (no tokenization). n samples each prompt n times: choice i * n + j is prompt i's
// j-th (at most 128 choices a request; usage counts a prompt's tokens once). "stream": true answers
// with server-sent events as OpenAI does: one "data: {...}" chunk per new piece of a choice's text, its
// last one with the finish_reason, with include_usage a chunk with "usage" and no choices, then
// "data: [DONE]" (not with echo or logprobs). best_of other than n, suffix, logit_bias and the
// frequency and presence penalties are refused, naming the field; other unknown fields too.
#pragma once
#include <nlohmann/json.hpp>

#include "serve/endpoint.h"

namespace lattice {

// The reply to a completions request (a RequestError for a bad one). id: the completion's number.
HttpReply openai_completions(const nlohmann::json& request, const EndpointContext& ctx, uint64_t id);

// GET /v1/models: the one model served, by its name.
HttpReply openai_models(const EndpointContext& ctx);

}  // namespace lattice
