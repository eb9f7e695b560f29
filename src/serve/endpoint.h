// What `lattice serve`'s endpoints (serve/megatron_api.h, serve/completions_api.h) are given: the
// tokenizer, the model's context, and the generator, which runs a request's prompts (with those of
// other requests waiting at the time) and returns their results in order.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "model/text_generation.h"
#include "serve/tool_calls.h"

namespace lattice {

class ChatTemplate;

struct HttpReply {
  HttpReply() = default;
  HttpReply(int status, std::string body, std::string content_type = "application/json")
      : status(status), body(std::move(body)), content_type(std::move(content_type)) {}
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  // A streamed answer (server-sent events) instead of body: the HTTP layer calls it once with a
  // writer of the next piece, which returns false when the client has gone (the stream then ends).
  std::function<void(const std::function<bool(const std::string&)>& write)> stream;
};

// Whether request i's decoding goes on after its latest token (false: it stops there).
using KeepGoing = std::function<bool(size_t request, const GenerationResult& result)>;

struct EndpointContext {
  const Tokenizer& tokenizer;
  int64_t context = 0;     // tokens a sequence holds (max_position_embeddings)
  std::string model_name;  // as the completions API reports it
  // A request's sampling seed: the one it gives, else the server's next (--seed, then counted up).
  std::function<uint64_t(std::optional<int64_t> given)> seed;
  std::function<std::vector<GenerationResult>(std::vector<GenerationRequest>, KeepGoing)> generate;
  const ChatTemplate* chat_template = nullptr;  // the chat completions' (none: they are refused)
  ToolCallFormat tool_calls = ToolCallFormat::none;  // how the chat completions find the model's tool calls
  std::vector<int32_t> stop_tokens;  // the tokens that end a text (none given: the end of document)
};

// The sampler's stream of prompt i of a request seeded `seed`: `lattice generate --seed seed`'s for
// its i-th prompt, so that a request's samples are those of generate given the same prompts.
inline PhiloxStream prompt_stream(uint64_t seed, size_t i) {
  return PhiloxStream{seed, fnv1a32("generate"), uint32_t(i), 0};
}

// Prompt i's request of an endpoint's call: its tokens, max_new new ones (refused naming max_field
// when the two would not fit the context), the sampling, prompt_stream(seed, i), stopping at the
// end-of-document token (ctx.stop_tokens when given); logprobs and top_logprobs as GenerationRequest's.
GenerationRequest prompt_request(const EndpointContext& ctx, size_t i, std::vector<int32_t> prompt, int64_t max_new,
                                 const char* max_field, const SamplingConfig& sampling, uint64_t seed,
                                 bool logprobs = false, int64_t top_logprobs = 0);

// JSON text of v; invalid UTF-8 (a byte-level token cut inside a character) replaced by U+FFFD.
std::string json_text(const nlohmann::json& v);

}  // namespace lattice
