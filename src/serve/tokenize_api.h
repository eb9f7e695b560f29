// vLLM's tokenizer endpoints (POST /tokenize and /detokenize, also under /v1), which clients use to count
// and cut tokens without the model's tokenizer at hand (lm-evaluation-harness's remote tokenizer):
//   /tokenize  {"prompt": text, "add_special_tokens": true} or {"messages": [...], "add_generation_prompt":
//              true, "tools", "chat_template_kwargs"} (the chat completions' conversation), "return_token_strs"
//              -> {"count": n, "max_model_len": the context, "tokens": [ids], "token_strs": null | [texts]}
//   /detokenize {"tokens": [ids]} -> {"prompt": text}
// A text prompt is encoded as /v1/completions encodes it (with add_special_tokens false as a chat template's
// text: without the ids the tokenizer adds); a conversation as /v1/chat/completions does. token_strs are the
// tokens' texts in their places (lattice's pieces, not the vocabulary's raw strings).
#pragma once
#include <nlohmann/json.hpp>

#include "serve/endpoint.h"

namespace lattice {

HttpReply tokenize(const nlohmann::ordered_json& request, const EndpointContext& ctx);
HttpReply detokenize(const nlohmann::json& request, const EndpointContext& ctx);

}  // namespace lattice
