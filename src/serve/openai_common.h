// What the OpenAI endpoints (serve/completions_api.h, serve/chat_completions_api.h) share: the sampling
// fields, stop strings, and answering with server-sent events as the text is made.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/endpoint.h"

namespace lattice {

// temperature (1; 0 is greedy), top_p (1), top_k (0: all), frequency_penalty and presence_penalty (-2 to 2;
// 0), repetition_penalty (vLLM's; > 0, 1: none) and logit_bias ({"token id": -100 to 100}; ids of the
// vocabulary of vocab_size tokens), as model/sampling.h applies them; the log-probabilities returned stay
// the model's.
SamplingConfig openai_sampling(const nlohmann::json& request, int64_t vocab_size);

// "n": the choices made for each prompt (1 to 128; 1). best_of may only repeat it (lattice does not
// rank samples).
int64_t choices_per_prompt(const nlohmann::json& request);

// "usage" of the results, n of them per prompt (a prompt's tokens counted once):
// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage_of(const std::vector<GenerationResult>& results, int64_t n);

// stream_options.include_usage (false): whether a stream ends with a chunk carrying "usage".
bool stream_includes_usage(const nlohmann::json& request);

// The "stop" field: null, a text or a list of at most 4 texts (empty texts dropped).
std::vector<std::string> stop_strings(const nlohmann::json& request);

// Where the first stop string starts in text, or npos.
size_t first_stop(const std::string& text, const std::vector<std::string>& stops);

// A KeepGoing that stops a request's decoding at its first stop string (none without stops).
KeepGoing stop_at_strings(const Tokenizer& tok, const std::vector<std::string>& stops);

// The event of choice `index`'s next piece of text; finish: nullptr, then "stop" or "length" on its last.
using ChunkOf = std::function<nlohmann::json(size_t index, const std::string& piece, const char* finish)>;

// The stream's last chunk, made from the results (the usage), or null for none.
using ClosingOf = std::function<nlohmann::json(const std::vector<GenerationResult>& results)>;

// Where the text that waits for the end of the decoding begins in a text being written (npos: none of it).
using HeldFrom = std::function<size_t(const std::string& text)>;

// stream: true. Runs the requests and answers with server-sent events: first the `opening` chunks, then
// "data: <chunk>" per new piece of a choice's text, each choice's last one with its finish reason, then
// `closing`'s chunk where given, then "data: [DONE]". A piece never ends inside a UTF-8 character nor
// passes a stop string (the text that could begin one waits for the next token); with held_from, the
// text from where it says waits for the last piece (a tool call, read whole). A client that goes away
// ends the decoding.
HttpReply stream_choices(std::vector<GenerationRequest> requests, std::vector<std::string> stops,
                         const EndpointContext& ctx, ChunkOf chunk, std::vector<nlohmann::json> opening = {},
                         ClosingOf closing = {}, HeldFrom held_from = {});

}  // namespace lattice
