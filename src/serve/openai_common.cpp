#include "serve/openai_common.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "serve/request_fields.h"
#include "serve/token_text.h"

namespace lattice {

SamplingConfig openai_sampling(const nlohmann::json& req, int64_t vocab_size) {
  SamplingConfig sampling;
  sampling.frequency_penalty = float(number_field(req, "frequency_penalty", -2.0, 2.0).value_or(0.0));
  sampling.presence_penalty = float(number_field(req, "presence_penalty", -2.0, 2.0).value_or(0.0));
  sampling.repetition_penalty = float(number_field(req, "repetition_penalty", 0.0, 1e6).value_or(1.0));
  if (!(sampling.repetition_penalty > 0)) throw RequestError("repetition_penalty must be a number > 0, got 0");
  if (auto bias = req.find("logit_bias"); bias != req.end() && !bias->is_null()) {
    if (!bias->is_object()) throw RequestError("logit_bias must be an object of token id: bias");
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      char* end = nullptr;
      const long long id = std::strtoll(it.key().c_str(), &end, 10);
      if (it.key().empty() || *end != '\0' || id < 0 || id >= vocab_size)
        throw RequestError("logit_bias: '" + it.key() + "' is not a token id (0 to " + std::to_string(vocab_size - 1) + ")");
      if (!it.value().is_number() || !(std::fabs(it.value().get<double>()) <= 100.0))
        throw RequestError("logit_bias[\"" + it.key() + "\"] must be a number in [-100, 100], got " + it.value().dump());
      sampling.logit_bias.emplace_back(int32_t(id), it.value().get<float>());
    }
  }
  sampling.temperature = float(number_field(req, "temperature", 0.0, 100.0).value_or(1.0));
  sampling.top_p = float(number_field(req, "top_p", 0.0, 1.0).value_or(1.0));
  if (!(sampling.top_p > 0)) throw RequestError("top_p must be a number in (0, 1], got 0");
  sampling.top_k = int_field(req, "top_k", 0, INT32_MAX).value_or(0);
  return sampling;
}

int64_t choices_per_prompt(const nlohmann::json& req) {
  const int64_t n = int_field(req, "n", 1, 128).value_or(1);
  if (int_field(req, "best_of", 1, 1'000'000).value_or(n) != n)
    throw RequestError("best_of other than n is not supported by lattice serve (it does not rank samples)");
  return n;
}

nlohmann::json usage_of(const std::vector<GenerationResult>& results, int64_t n) {
  int64_t prompt = 0, completion = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (int64_t(i) % n == 0) prompt += results[i].prompt_length;
    completion += int64_t(results[i].tokens.size()) - results[i].prompt_length;
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

bool stream_includes_usage(const nlohmann::json& req) {
  auto options = req.find("stream_options");
  if (options == req.end() || options->is_null()) return false;
  if (!options->is_object()) throw RequestError("stream_options must be an object");
  check_known_fields(*options, {"include_usage", "continuous_usage_stats"});
  if (bool_field(*options, "continuous_usage_stats").value_or(false))
    throw RequestError("stream_options.continuous_usage_stats is not supported by lattice serve");
  return bool_field(*options, "include_usage").value_or(false);
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

size_t first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t at = std::string::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

KeepGoing stop_at_strings(const Tokenizer& tok, const std::vector<std::string>& stops) {
  if (stops.empty()) return {};
  return [&tok, stops](size_t, const GenerationResult& r) {
    return first_stop(continuation_text(tok, r.tokens, r.prompt_length), stops) == std::string::npos;
  };
}

HttpReply stream_choices(std::vector<GenerationRequest> requests, std::vector<std::string> stops,
                         const EndpointContext& ctx, ChunkOf chunk, std::vector<nlohmann::json> opening,
                         ClosingOf closing, HeldFrom held_from) {
  HttpReply reply;
  reply.content_type = "text/event-stream";
  reply.stream = [requests = std::move(requests), stops = std::move(stops), &ctx, chunk = std::move(chunk),
                  opening = std::move(opening), closing = std::move(closing),
                  held_from = std::move(held_from)](const std::function<bool(const std::string&)>& write) mutable {
    const Tokenizer& tok = ctx.tokenizer;
    size_t hold = 0;
    for (const std::string& s : stops) hold = std::max(hold, s.size() - 1);
    auto event = [&](size_t index, const std::string& text, const char* finish) {
      return "data: " + json_text(chunk(index, text, finish)) + "\n\n";
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
      size_t end = cut != std::string::npos ? cut : streamable_prefix(text, hold);
      if (held_from) end = std::min(end, held_from(text.substr(0, end)));
      if (end > sent[i]) push(event(i, text.substr(sent[i], end - sent[i]), nullptr));
      sent[i] = std::max(sent[i], end);
      return cut == std::string::npos;
    };
    for (const nlohmann::json& c : opening) push("data: " + json_text(c) + "\n\n");
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
        if (closing) push("data: " + json_text(closing(results)) + "\n\n");
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


}  // namespace lattice
