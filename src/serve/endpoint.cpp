#include "serve/endpoint.h"

#include "serve/request_fields.h"

namespace lattice {

GenerationRequest prompt_request(const EndpointContext& ctx, size_t i, std::vector<int32_t> prompt, int64_t max_new,
                                 const char* max_field, const SamplingConfig& sampling, uint64_t seed, bool logprobs,
                                 int64_t top_logprobs) {
  if (int64_t(prompt.size()) + max_new > ctx.context)
    throw RequestError("prompt " + std::to_string(i) + ": " + std::to_string(prompt.size()) + " tokens + " + max_field +
                       " " + std::to_string(max_new) + " is longer than the model's context of " +
                       std::to_string(ctx.context));
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.sampling = sampling;
  r.stream = prompt_stream(seed, i);
  r.stop_tokens = ctx.stop_tokens.empty() ? std::vector<int32_t>{ctx.tokenizer.eod()} : ctx.stop_tokens;
  r.logprobs = logprobs;
  r.top_logprobs = top_logprobs;
  return r;
}

std::string json_text(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace lattice
