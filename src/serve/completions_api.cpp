#include "serve/completions_api.h"

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "serve/request_fields.h"
#include "serve/token_text.h"

namespace lattice {
namespace {

// The prompts of the "prompt" field as token ids (texts encoded, ids checked).
std::vector<std::vector<int32_t>> prompt_ids(const nlohmann::json& req, const Tokenizer& tok, int64_t vocab) {
  auto it = req.find("prompt");
  if (it == req.end() || it->is_null()) throw RequestError("prompt is required");
  const nlohmann::json& p = *it;
  auto ids_of = [&](const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        throw RequestError("prompt: token " + t.dump() + " is not an id in [0, " + std::to_string(vocab) + ")");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return ids;
  };
  auto text_ids = [&](const std::string& text) {
    std::vector<int32_t> ids = tok.encode(text);
    if (ids.empty()) ids.push_back(tok.eod());  // an empty prompt: the start of a document
    return ids;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (p.is_string()) {
    prompts.push_back(text_ids(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_string(); })) {
    for (const auto& x : p) prompts.push_back(text_ids(x.get<std::string>()));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_number(); })) {
    prompts.push_back(ids_of(p));
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](auto& x) { return x.is_array(); })) {
    for (const auto& x : p) {
      if (x.empty()) throw RequestError("prompt: an empty list of token ids");
      prompts.push_back(ids_of(x));
    }
  } else {
    throw RequestError("prompt must be a text, a list of texts, a list of token ids or a list of such lists");
  }
  if (prompts.size() > 128) throw RequestError("prompt: at most 128 prompts, got " + std::to_string(prompts.size()));
  return prompts;
}

std::vector<std::string> stop_strings(const nlohmann::json& req) {
  auto it = req.find("stop");
  if (it == req.end() || it->is_null()) return {};
  std::vector<std::string> stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array() && it->size() <= 4 && std::all_of(it->begin(), it->end(), [](auto& x) { return x.is_string(); })) {
    for (const auto& s : *it) stops.push_back(s.get<std::string>());
  } else {
    throw RequestError("stop must be a text or a list of at most 4 texts");
  }
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  return stops;
}

// Where the first stop string starts in text, or npos.
size_t first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t at = std::string::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

// stream: the choices' texts as they are made, one server-sent event per new piece:
//   data: {"id", "object": "text_completion", "created", "model", "choices": [{"index", "text", "logprobs": null,
//          "finish_reason": null}]}
// then each choice's last event with its finish_reason, then "data: [DONE]". A piece never ends inside
// a UTF-8 character nor passes a stop string (the text that could begin one waits for the next token).
HttpReply stream_completions(std::vector<GenerationRequest> requests, std::vector<std::string> stops,
                             const EndpointContext& ctx, uint64_t id) {
  HttpReply reply;
  reply.content_type = "text/event-stream";
  const std::string head_id = "cmpl-" + std::to_string(id);
  const int64_t created = int64_t(std::time(nullptr));
  reply.stream = [requests = std::move(requests), stops = std::move(stops), &ctx, head_id,
                  created](const std::function<bool(const std::string&)>& write) mutable {
    const Tokenizer& tok = ctx.tokenizer;
    size_t hold = 0;
    for (const std::string& s : stops) hold = std::max(hold, s.size() - 1);
    auto event = [&](size_t index, const std::string& text, const char* finish) {
      nlohmann::json choice = {{"index", index}, {"text", text}, {"logprobs", nullptr},
                               {"finish_reason", finish ? nlohmann::json(finish) : nlohmann::json(nullptr)}};
      nlohmann::json chunk = {{"id", head_id}, {"object", "text_completion"}, {"created", created},
                              {"model", ctx.model_name}, {"choices", {choice}}};
      return "data: " + json_text(chunk) + "\n\n";
    };
    // Written by the worker's callback, read here: the events not yet sent; the client gone.
    std::mutex m;
    std::condition_variable ready;
    std::deque<std::string> events;
    bool finished = false, gone = false;
    std::vector<size_t> sent(requests.size(), 0);  // bytes of each choice's text sent
    auto push = [&](std::string e) {
      {
        std::lock_guard<std::mutex> lock(m);
        events.push_back(std::move(e));
      }
      ready.notify_one();
    };
    KeepGoing keep_going = [&](size_t i, const GenerationResult& r) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (gone) return false;
      }
      const std::string text = continuation_text(tok, r.tokens, r.prompt_length);
      const size_t cut = first_stop(text, stops);
      const size_t end = cut != std::string::npos ? cut : streamable_prefix(text, hold);
      if (end > sent[i]) push(event(i, text.substr(sent[i], end - sent[i]), nullptr));
      sent[i] = std::max(sent[i], end);
      return cut == std::string::npos;
    };
    std::exception_ptr error;
    std::thread decoding([&] {
      try {
        const std::vector<GenerationResult> results = ctx.generate(std::move(requests), keep_going);
        for (size_t i = 0; i < results.size(); ++i) {  // what was held back, and the finish reason
          const GenerationResult& r = results[i];
          std::string text = continuation_text(tok, r.tokens, r.prompt_length);
          const size_t cut = first_stop(text, stops);
          if (cut != std::string::npos) text.resize(cut);
          push(event(i, text.size() > sent[i] ? text.substr(sent[i]) : "",
                     r.stopped || cut != std::string::npos ? "stop" : "length"));
        }
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(m);
        finished = true;
      }
      ready.notify_one();
    });
    for (;;) {
      std::unique_lock<std::mutex> lock(m);
      ready.wait(lock, [&] { return finished || !events.empty(); });
      if (events.empty()) break;  // finished, everything sent
      std::string e = std::move(events.front());
      events.pop_front();
      lock.unlock();
      if (!gone && !write(e)) {
        std::lock_guard<std::mutex> relock(m);
        gone = true;
      }
    }
    decoding.join();
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        if (!gone) write("data: " + json_text({{"error", {{"message", e.what()}, {"type", "server_error"}}}}) + "\n\n");
      }
    }
    if (!gone) write("data: [DONE]\n\n");
  };
  return reply;
}

}  // namespace

HttpReply openai_completions(const nlohmann::json& req, const EndpointContext& ctx, uint64_t id) {
  for (const char* refused : {"suffix", "logit_bias"})
    if (req.contains(refused) && !req[refused].is_null() && !req[refused].empty())
      throw RequestError(std::string(refused) + " is not supported by lattice serve");
  for (const char* penalty : {"frequency_penalty", "presence_penalty"})
    if (number_field(req, penalty, -2.0, 2.0).value_or(0.0) != 0.0)
      throw RequestError(std::string(penalty) + " is not supported by lattice serve (0 only)");
  if (int_field(req, "n", 1, 1'000'000).value_or(1) != 1) throw RequestError("n > 1 is not supported by lattice serve");
  if (int_field(req, "best_of", 1, 1'000'000).value_or(1) != 1)
    throw RequestError("best_of > 1 is not supported by lattice serve");
  const bool stream = bool_field(req, "stream").value_or(false);
  check_known_fields(req, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "logprobs", "echo",
                           "seed", "stop", "n", "best_of", "stream", "suffix", "logit_bias", "frequency_penalty",
                           "presence_penalty", "user"});
  const Tokenizer& tok = ctx.tokenizer;
  const int64_t vocab = tok.vocab_size();
  const std::vector<std::vector<int32_t>> prompts = prompt_ids(req, tok, vocab);
  const int64_t max_tokens = int_field(req, "max_tokens", 0, INT32_MAX).value_or(16);
  SamplingConfig sampling;
  sampling.temperature = float(number_field(req, "temperature", 0.0, 100.0).value_or(1.0));
  sampling.top_p = float(number_field(req, "top_p", 0.0, 1.0).value_or(1.0));
  if (!(sampling.top_p > 0)) throw RequestError("top_p must be a number in (0, 1], got 0");
  sampling.top_k = int_field(req, "top_k", 0, INT32_MAX).value_or(0);
  const std::optional<int64_t> top = int_field(req, "logprobs", 0, 20);
  const bool echo = bool_field(req, "echo").value_or(false);
  const std::optional<int64_t> given_seed = int_field(req, "seed", INT64_MIN, INT64_MAX);
  const std::vector<std::string> stops = stop_strings(req);
  if (!echo && max_tokens == 0) throw RequestError("max_tokens 0 returns nothing without echo");
  if (stream && (echo || top)) throw RequestError(std::string(echo ? "echo" : "logprobs") + " does not go with stream");

  const uint64_t seed = ctx.seed(given_seed);
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i)
    requests.push_back(
        prompt_request(ctx, i, prompts[i], max_tokens, "max_tokens", sampling, seed, top.has_value(), top.value_or(0)));
  if (stream) return stream_completions(std::move(requests), stops, ctx, id);
  KeepGoing keep_going;
  if (!stops.empty())
    keep_going = [&](size_t, const GenerationResult& r) {
      return first_stop(continuation_text(tok, r.tokens, r.prompt_length), stops) == std::string::npos;
    };
  const std::vector<GenerationResult> results = ctx.generate(std::move(requests), keep_going);

  nlohmann::json choices = nlohmann::json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    const int64_t P0 = r.prompt_length, n = int64_t(r.tokens.size());
    prompt_tokens += P0;
    completion_tokens += n - P0;
    std::string added = continuation_text(tok, r.tokens, P0);
    const size_t cut = first_stop(added, stops);
    const bool stopped = r.stopped || cut != std::string::npos;
    if (cut != std::string::npos) added.resize(cut);
    const std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + P0);
    const std::string prompt_text = echo ? tok.decode(prompt) : "";
    // The returned tokens [first, last): the prompt's with echo, and the new ones whose text starts
    // before the cut; each one's offset in the returned text.
    const int64_t first = echo ? 0 : P0;
    std::vector<size_t> offsets;
    int64_t last = first;
    for (int64_t k = first; k < n; ++k) {
      const std::vector<int32_t> head(r.tokens.begin(), r.tokens.begin() + k);
      if (k < P0) {
        offsets.push_back(tok.decode(head).size());
      } else {
        const size_t at = continuation_text(tok, head, P0).size();  // in the new text
        if (cut != std::string::npos && at >= cut) break;
        offsets.push_back(prompt_text.size() + at);
      }
      last = k + 1;
    }
    nlohmann::json choice = {{"index", i},
                             {"text", prompt_text + added},
                             {"finish_reason", stopped ? "stop" : "length"},
                             {"logprobs", nullptr}};
    if (top) {
      nlohmann::json pieces = nlohmann::json::array(), lps = nlohmann::json::array(),
                     tops = *top > 0 ? nlohmann::json::array() : nlohmann::json(nullptr);
      for (int64_t k = first; k < last; ++k) {
        pieces.push_back(token_piece(tok, r.tokens, size_t(k), r.tokens[size_t(k)]));
        if (k == 0) {  // the first token: nothing before it to predict it
          lps.push_back(nullptr);
          if (*top > 0) tops.push_back(nullptr);
          continue;
        }
        lps.push_back(r.logprobs[size_t(k - 1)]);
        if (*top > 0) {
          nlohmann::json best = nlohmann::json::object();
          for (const auto& [t, lp] : r.top_logprobs[size_t(k - 1)]) best[token_piece(tok, r.tokens, size_t(k), t)] = lp;
          tops.push_back(best);
        }
      }
      choice["logprobs"] = {{"tokens", pieces}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
    }
    choices.push_back(choice);
  }
  nlohmann::json reply = {{"id", "cmpl-" + std::to_string(id)},
                          {"object", "text_completion"},
                          {"created", int64_t(std::time(nullptr))},
                          {"model", ctx.model_name},
                          {"choices", choices},
                          {"usage",
                           {{"prompt_tokens", prompt_tokens},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", prompt_tokens + completion_tokens}}}};
  return HttpReply{200, json_text(reply)};
}

HttpReply openai_models(const EndpointContext& ctx) {
  nlohmann::json reply = {
      {"object", "list"},
      {"data", nlohmann::json::array({{{"id", ctx.model_name}, {"object", "model"}, {"owned_by", "lattice"}}})}};
  return HttpReply{200, json_text(reply)};
}

}  // namespace lattice
