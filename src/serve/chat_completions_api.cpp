#include "serve/chat_completions_api.h"

#include <ctime>

#include "chat/chat_template.h"
#include "core/error.h"
#include "serve/openai_common.h"
#include "serve/request_fields.h"
#include "serve/token_text.h"

namespace lattice {
namespace {
using nlohmann::json;
using ojson = nlohmann::ordered_json;  // the request's objects in their order, as the template reads them

// The messages as the template reads them: each an object with a text "role"; a "content" that is a
// list of text parts becomes their texts joined by newlines; a tool call's "arguments" that OpenAI's
// clients send as JSON text becomes the object it holds (templates write it with tojson). Other fields
// (name, tool_call_id, ...) pass through.
ojson template_messages(const ojson& req) {
  auto it = req.find("messages");
  if (it == req.end() || !it->is_array() || it->empty()) throw RequestError("messages must be a non-empty list");
  ojson messages = ojson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    ojson m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw RequestError(where + " must be an object with a text \"role\"");
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      for (const ojson& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw RequestError(where + ".content: only {\"type\": \"text\", \"text\": ...} parts are supported, got " +
                             part.dump().substr(0, 80));
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      *content = text;
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      throw RequestError(where + ".content must be a text, a list of text parts or null");
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array())
      for (ojson& call : *calls) {
        ojson* args = call.is_object() && call.contains("function") && call["function"].is_object() &&
                              call["function"].contains("arguments")
                          ? &call["function"]["arguments"]
                          : nullptr;
        if (args && args->is_string()) {
          ojson parsed = ojson::parse(args->get<std::string>(), nullptr, false);
          if (!parsed.is_discarded() && parsed.is_object()) *args = std::move(parsed);
        }
      }
    messages.push_back(std::move(m));
  }
  return messages;
}

// The template's other variables: tools, and chat_template_kwargs (enable_thinking, ...).
// tool_choice: "auto" or "none" (or absent): nullopt; "required": ""; {"type": "function", "function":
// {"name": N}}: N, which must be one of the tools'. Anything else is refused naming it.
std::optional<std::string> forced_call(const ojson& req) {
  const auto choice = req.find("tool_choice");
  if (choice == req.end() || choice->is_null() || (choice->is_string() && (*choice == "auto" || *choice == "none")))
    return std::nullopt;
  const auto tools = req.find("tools");
  const bool offered = tools != req.end() && tools->is_array() && !tools->empty();
  if (choice->is_string() && *choice == "required") {
    if (!offered) throw RequestError("tool_choice \"required\" needs tools");
    return std::string();
  }
  const bool named = choice->is_object() && choice->value("type", "") == "function" && choice->contains("function") &&
                     (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
                     (*choice)["function"]["name"].is_string();
  if (!named)
    throw RequestError("tool_choice " + choice->dump().substr(0, 80) +
                       " is not supported (\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
                       "{\"name\": ...}})");
  const std::string name = (*choice)["function"]["name"].get<std::string>();
  if (offered)
    for (const ojson& t : *tools) {
      const ojson& f = t.is_object() && t.contains("function") ? t["function"] : t;
      if (f.is_object() && f.value("name", "") == name) return name;
    }
  throw RequestError("tool_choice names the function \"" + name + "\", which is none of the tools");
}

ojson template_extras(const ojson& req) {
  ojson extra = ojson::object();
  if (auto tools = req.find("tools"); tools != req.end() && !tools->is_null()) {
    if (!tools->is_array()) throw RequestError("tools must be a list");
    extra["tools"] = *tools;
  }
  if (auto choice = req.find("tool_choice"); choice != req.end() && !choice->is_null()) {
    if (choice->is_string() && *choice == "none") extra.erase("tools");
    else forced_call(req);  // checks it
  }
  if (auto kwargs = req.find("chat_template_kwargs"); kwargs != req.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) throw RequestError("chat_template_kwargs must be an object");
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      if (it.key() == "messages" || it.key() == "add_generation_prompt")
        throw RequestError("chat_template_kwargs." + it.key() + ": give it as the request's own field");
      extra[it.key()] = it.value();
    }
  }
  return extra;
}

// A choice's tool calls as OpenAI lists them (with "index" in a stream's delta); parallel false: the first only.
json tool_calls_of(ToolCallFormat f, const ParsedToolCalls& parsed, uint64_t id, size_t choice, bool parallel,
                   bool indexed) {
  json calls = json::array();
  for (size_t k = 0; k < parsed.calls.size() && (parallel || k == 0); ++k) {
    json call = openai_tool_call(f, parsed.calls[k], id, choice, k);
    if (indexed) call["index"] = k;
    calls.push_back(std::move(call));
  }
  return calls;
}

// A returned token's entry of "logprobs": its text, log-probability and bytes.
json token_entry(const std::string& piece, float logprob) {
  json bytes = json::array();
  for (unsigned char c : piece) bytes.push_back(int(c));
  return {{"token", piece}, {"logprob", logprob}, {"bytes", bytes}};
}

}  // namespace

ChatPrompt chat_prompt(const ojson& request, const EndpointContext& ctx) {
  if (!ctx.chat_template)
    throw RequestError("this server has no chat template: the tokenizer's folder holds none; start lattice serve "
                       "with --chat-template FILE (or use /v1/completions)");
  const auto gen = request.find("add_generation_prompt");
  if (gen != request.end() && !gen->is_null() && !gen->is_boolean())
    throw RequestError("add_generation_prompt must be true or false");
  const bool add_generation_prompt = gen == request.end() || gen->is_null() || gen->get<bool>();
  const ojson extras = template_extras(request);
  ChatPrompt out;
  out.tools = extras.contains("tools") && !extras["tools"].empty();
  if (const std::optional<std::string> name = forced_call(request)) {  // tool_choice required or named
    if (ctx.tool_calls == ToolCallFormat::none)
      throw RequestError("tool_choice " + request["tool_choice"].dump().substr(0, 80) +
                         " needs the model's tool-call form, and this server reads none (lattice serve "
                         "--tool-call-parser hermes|llama3_json|mistral)");
    if (!add_generation_prompt) throw RequestError("tool_choice \"required\" or a named function needs add_generation_prompt");
    out.forced = forced_tool_call_opening(ctx.tool_calls, *name);
  }
  std::string text;
  try {
    text = ctx.chat_template->render(template_messages(request), add_generation_prompt, extras);
  } catch (const Error& e) {  // the template's raise_exception, or what it cannot do with these messages
    throw RequestError(e.what());
  }
  out.tokens = ctx.tokenizer.encode_without_specials(text + out.forced);
  return out;
}

HttpReply openai_chat_completions(const ojson& request, const EndpointContext& ctx, uint64_t id) {
  const json req = request;
  const SamplingConfig sampling = openai_sampling(req, ctx.tokenizer.vocab_size());
  const int64_t n = choices_per_prompt(req);
  check_known_fields(req, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                           "top_k", "seed", "stop", "stream", "stream_options", "n", "best_of", "logprobs", "top_logprobs",
                           "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "user", "tools", "tool_choice",
                           "parallel_tool_calls", "chat_template_kwargs", "add_generation_prompt", "response_format"});
  if (auto format = req.find("response_format");
      format != req.end() && !format->is_null() && !(format->is_object() && format->value("type", "") == "text"))
    throw RequestError("response_format " + format->dump().substr(0, 80) +
                       " is not supported by lattice serve ({\"type\": \"text\"} only)");
  const bool stream = bool_field(req, "stream").value_or(false);
  const bool usage_chunk = stream_includes_usage(req);
  const bool logprobs = bool_field(req, "logprobs").value_or(false);
  const int64_t top = int_field(req, "top_logprobs", 0, 20).value_or(0);
  if (top > 0 && !logprobs) throw RequestError("top_logprobs needs logprobs: true");
  if (stream && logprobs) throw RequestError("logprobs does not go with stream");
  const std::vector<std::string> stops = stop_strings(req);
  const bool parallel = bool_field(req, "parallel_tool_calls").value_or(true);
  ChatPrompt chat = chat_prompt(request, ctx);
  // The model's tool calls are read when the request offers tools (and tool_choice is not "none").
  const ToolCallFormat calls = chat.tools ? ctx.tool_calls : ToolCallFormat::none;
  const Tokenizer& tok = ctx.tokenizer;
  std::vector<int32_t> prompt = std::move(chat.tokens);  // (chat.forced is read below)
  if (prompt.empty()) prompt.push_back(tok.eod());
  const int64_t room = ctx.context - int64_t(prompt.size());
  std::optional<int64_t> max_tokens = int_field(req, "max_completion_tokens", 1, INT32_MAX);
  if (!max_tokens) max_tokens = int_field(req, "max_tokens", 1, INT32_MAX);
  if (!max_tokens && room < 1)
    throw RequestError("the conversation is " + std::to_string(prompt.size()) +
                       " tokens, which fill the model's context of " + std::to_string(ctx.context));
  const uint64_t seed = ctx.seed(int_field(req, "seed", INT64_MIN, INT64_MAX));
  std::vector<GenerationRequest> requests;  // choice j from prompt_stream(seed, j)
  for (int64_t j = 0; j < n; ++j) {
    requests.push_back(prompt_request(ctx, 0, prompt, max_tokens.value_or(room), "max_tokens", sampling, seed, logprobs, top));
    requests.back().stream = prompt_stream(seed, size_t(j));
  }
  const std::string head_id = "chatcmpl-" + std::to_string(id);
  const int64_t created = int64_t(std::time(nullptr));

  if (stream) {
    const json head = {{"id", head_id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", ctx.model_name}};
    auto chunk_of = [head](size_t index, const json& delta, const char* finish) {
      json chunk = head;
      chunk["choices"] = {{{"index", index}, {"delta", delta}, {"logprobs", nullptr},
                           {"finish_reason", finish ? json(finish) : json(nullptr)}}};
      return chunk;
    };
    std::vector<json> opening;  // each choice's role first
    for (int64_t j = 0; j < n; ++j) opening.push_back(chunk_of(size_t(j), {{"role", "assistant"}, {"content", ""}}, nullptr));
    ClosingOf closing;
    if (usage_chunk)
      closing = [head, n](const std::vector<GenerationResult>& results) {
        json chunk = head;
        chunk["choices"] = json::array();
        chunk["usage"] = usage_of(results, n);
        return chunk;
      };
    // With tool calls read, the text from where a call may begin waits for the end and is read whole: the
    // last delta carries the content before the calls and the calls.
    // A forced call (tool_choice required or named) waits whole, read after its opening.
    HeldFrom held;
    if (!chat.forced.empty()) held = [](const std::string&) { return size_t(0); };
    else if (calls != ToolCallFormat::none) held = [calls](const std::string& t) { return tool_calls_start(calls, t); };
    return stream_choices(
        std::move(requests), stops, ctx,
        [chunk_of, calls, id, parallel, forced = chat.forced](size_t index, const std::string& last,
                                                                const char* finish) {
          const std::string piece = finish ? forced + last : last;
          const ParsedToolCalls parsed = finish ? parse_tool_calls(calls, piece) : ParsedToolCalls{};
          if (!parsed.called)
            return chunk_of(index, piece.empty() ? json::object() : json{{"content", piece}}, finish);
          json delta = {{"tool_calls", tool_calls_of(calls, parsed, id, index, parallel, true)}};
          if (!parsed.content.empty()) delta["content"] = parsed.content;
          return chunk_of(index, delta, "tool_calls");
        },
        std::move(opening), closing, held);
  }

  const std::vector<GenerationResult> results = ctx.generate(std::move(requests), stop_at_strings(tok, stops));
  json choices = json::array();
  for (size_t j = 0; j < results.size(); ++j) {
    const GenerationResult& r = results[j];
    const int64_t P0 = r.prompt_length, length = int64_t(r.tokens.size());
    std::string content = continuation_text(tok, r.tokens, P0);
    const size_t cut = first_stop(content, stops);
    if (cut != std::string::npos) content.resize(cut);
    json choice = {{"index", j},
                   {"message", {{"role", "assistant"}, {"content", chat.forced + content}}},
                   {"logprobs", nullptr},
                   {"finish_reason", r.stopped || cut != std::string::npos ? "stop" : "length"}};
    if (const ParsedToolCalls parsed = parse_tool_calls(calls, chat.forced + content); parsed.called) {
      choice["message"]["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
      choice["message"]["tool_calls"] = tool_calls_of(calls, parsed, id, j, parallel, false);
      choice["finish_reason"] = "tool_calls";
    }
    if (logprobs) {
      json entries = json::array();
      for (int64_t k = P0; k < length; ++k) {
        // the tokens whose text starts before the cut
        if (cut != std::string::npos &&
            continuation_text(tok, std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + k), P0).size() >= cut)
          break;
        json entry = token_entry(token_piece(tok, r.tokens, size_t(k), r.tokens[size_t(k)]), r.logprobs[size_t(k - 1)]);
        json best = json::array();
        if (top > 0)
          for (const auto& [t, lp] : r.top_logprobs[size_t(k - 1)])
            best.push_back(token_entry(token_piece(tok, r.tokens, size_t(k), t), lp));
        entry["top_logprobs"] = best;
        entries.push_back(entry);
      }
      choice["logprobs"] = {{"content", entries}};
    }
    choices.push_back(choice);
  }
  const json reply = {{"id", head_id},         {"object", "chat.completion"}, {"created", created},
                      {"model", ctx.model_name}, {"choices", choices},          {"usage", usage_of(results, n)}};
  return HttpReply{200, json_text(reply)};
}

}  // namespace lattice
