// OpenAI's chat completions API (POST /v1/chat/completions, also /chat/completions), what chat clients
// speak:
//   {"model": name, "messages": [{"role": "system" | "user" | "assistant" | "tool", "content": text |
//    [{"type": "text", "text": ...}, ...], ...}], "max_tokens" (or "max_completion_tokens"): what fits
//    the context, "temperature": 1, "top_p": 1, "top_k": 0, "seed", "stop", "stream": false,
//    "logprobs": false, "top_logprobs": 0..20, "tools": [...], "tool_choice": "auto" | "none" | "required" |
//    {"type": "function", "function": {"name"}},
//    "chat_template_kwargs": {...}, "add_generation_prompt": true, "n": 1,
//    "stream_options": {"include_usage": false}}
// answered with
//   {"id": "chatcmpl-...", "object": "chat.completion", "created", "model",
//    "choices": [{"index": j, "message": {"role": "assistant", "content": ...}, "finish_reason": "stop" | "length",
//                 "logprobs": null | {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}}],
//    "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}.
// The conversation is the model's chat template's text (chat/chat_template.h: the messages, the tools,
// chat_template_kwargs as more variables), encoded without the tokenizer's added ids (the template
// writes them) as HuggingFace's apply_chat_template(tokenize=True) does; a message's list of text parts
// is their texts joined by newlines. Decoding stops at the tokenizer's end-of-document token (the
// tokenizer_config's eos_token: <|eot_id|> or <|im_end|> for chat models) and the stop strings.
// Choice j draws what /v1/completions' choice j draws for the template's text and seed. "stream": true
// answers with "chat.completion.chunk" events: each choice's assistant role first, then each new piece
// of a choice's content, then its finish reason, with include_usage a chunk with "usage" and no
// choices, then "data: [DONE]". When the request offers tools, the model's tool calls are read from its
// text in the server's form (serve/tool_calls.h: --tool-call-parser, by default the template's):
// the message's "tool_calls" [{"id", "type": "function", "function": {"name", "arguments"}}] (the first
// only with "parallel_tool_calls": false), its content the text before them (null for none), and
// finish_reason "tool_calls"; streamed, the text from where a call may begin waits, and the last delta
// carries the calls (each with its "index"). tool_choice "required" or {"type": "function", "function":
// {"name"}} ends the prompt with a call's opening (serve/tool_calls.h's forced_tool_call_opening), read with
// what the model writes after it. An assistant message's tool call arguments sent as JSON text
// reach the template as the object. A template's raise_exception (roles that must alternate, a role it
// does not take) is answered 400 with the template's message.
#pragma once
#include <nlohmann/json.hpp>

#include "serve/endpoint.h"

namespace lattice {

// A chat request's conversation ("messages", "add_generation_prompt", "tools", "tool_choice",
// "chat_template_kwargs") through the chat template, encoded; tools: whether it offers tools (not refused
// by tool_choice "none"). A RequestError for a bad one, the template's raise_exception included, or for a
// server without a template.
// forced: with tool_choice "required" or a named function, the opening of a call in the server's tool-call
// form, which ends the prompt (serve/tool_calls.h); its completion is read after it.
struct ChatPrompt {
  std::vector<int32_t> tokens;
  bool tools = false;
  std::string forced;
};
ChatPrompt chat_prompt(const nlohmann::ordered_json& request, const EndpointContext& ctx);

// The reply to a chat completions request (a RequestError for a bad one), read with its objects' keys in
// their order (a tool's schema reaches the template as the client wrote it). id: the completion's number.
HttpReply openai_chat_completions(const nlohmann::ordered_json& request, const EndpointContext& ctx, uint64_t id);

}  // namespace lattice
