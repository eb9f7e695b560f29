#include "serve/text_generation_service.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "core/device.h"
#include "core/error.h"
#include "core/timer.h"
#include "model/gpt_model.h"
#include "serve/chat_completions_api.h"
#include "serve/completions_api.h"
#include "serve/megatron_api.h"
#include "serve/request_fields.h"
#include "serve/tokenize_api.h"

namespace lattice {

TextGenerationService::TextGenerationService(const GPTModel& model, const Tokenizer& tokenizer, ServeOptions options)
    : model_(model),
      options_(std::move(options)),
      ctx_{tokenizer, model.config().max_position_embeddings, options_.model_name, {}, {},
           options_.chat_template ? &*options_.chat_template : nullptr},
      next_seed_(options_.seed) {
  ctx_.stop_tokens = options_.stop_tokens;
  ctx_.tool_calls = tool_call_format(options_.tool_call_parser,
                                     options_.chat_template ? options_.chat_template->text() : "", "--tool-call-parser");
  const size_t before = device_alloc_stats().allocated_bytes;
  generator_ = std::make_unique<TextGenerator>(model_, options_.sequences, options_.bf16);
  generator_bytes_ = device_alloc_stats().allocated_bytes - before;
  ctx_.seed = [this](std::optional<int64_t> given) {
    if (given) return uint64_t(*given);
    std::lock_guard<std::mutex> lock(mutex_);
    return next_seed_++;
  };
  ctx_.generate = [this](std::vector<GenerationRequest> requests, KeepGoing keep_going) {
    return generate(std::move(requests), std::move(keep_going));
  };
  worker_ = std::thread([this] { work(); });
}

TextGenerationService::~TextGenerationService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

std::vector<GenerationResult> TextGenerationService::generate(std::vector<GenerationRequest> requests,
                                                              KeepGoing keep_going) {
  if (requests.empty()) return {};
  Job job;
  job.requests = std::move(requests);
  job.keep_going = std::move(keep_going);
  job.results.resize(job.requests.size());
  std::future<std::vector<GenerationResult>> result = job.done.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw RequestError("the server is shutting down", 503);
    queue_.push_back(&job);
  }
  wake_.notify_all();
  return result.get();
}

void TextGenerationService::work() {
  TextGenerator& generator = *generator_;
  std::vector<std::pair<Job*, size_t>> prompt_of;  // a generator id's job and prompt (one run's)
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
    }
    prompt_of.clear();
    // The next prompt of the oldest job with one left, as it arrives.
    auto source = [&](GenerationRequest& request, size_t& id) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty()) return false;
      Job* job = queue_.front();
      const size_t i = job->started++;
      if (job->started == job->requests.size()) queue_.pop_front();
      request = job->requests[i];
      id = prompt_of.size();
      prompt_of.emplace_back(job, i);
      return true;
    };
    auto on_token = [&](size_t id, const GenerationResult& r) {
      const auto& [job, i] = prompt_of[id];
      return !job->keep_going || job->keep_going(i, r);
    };
    auto on_done = [&](size_t id, const GenerationResult& r) {
      const auto& [job, i] = prompt_of[id];
      job->results[i] = r;
      if (++job->finished == job->requests.size()) job->done.set_value(std::move(job->results));
    };
    try {
      generator.run(source, on_token, on_done);
    } catch (...) {  // (the endpoints check what the generator refuses): every job begun fails
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<Job*> failed;
      for (const auto& [job, i] : prompt_of)
        if (job->finished < job->requests.size() && std::find(failed.begin(), failed.end(), job) == failed.end())
          failed.push_back(job);
      for (Job* job : failed) {
        queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
        job->done.set_exception(std::current_exception());
      }
    }
  }
}

namespace {

// given == want (not empty), in a time that does not depend on where they first differ.
bool same_secret(const std::string& given, const std::string& want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ want[i % want.size()]);
  return diff == 0;
}

}  // namespace

HttpReply TextGenerationService::handle(const std::string& method, const std::string& path, const std::string& body,
                                        const std::string& authorization) {
  const Timer timer;
  HttpReply reply;
  const bool megatron = path == "/api", completions = path == "/completions" || path == "/v1/completions",
             chat = path == "/chat/completions" || path == "/v1/chat/completions", models = path == "/v1/models",
             health = path == "/health", tokenize_path = path == "/tokenize" || path == "/v1/tokenize",
             detokenize_path = path == "/detokenize" || path == "/v1/detokenize";
  try {
    if (!options_.api_key.empty() && !health && !same_secret(authorization, "Bearer " + options_.api_key)) {
      throw RequestError(authorization.empty() ? "this server needs an API key: Authorization: Bearer <key>"
                                               : "the API key in Authorization is wrong",
                         401);
    } else if (!megatron && !completions && !chat && !models && !health && !tokenize_path && !detokenize_path) {
      reply = HttpReply{404,
                        "no such endpoint: " + path +
                            " (PUT /api, POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST "
                            "/tokenize, POST /detokenize, GET /health)\n",
                        "text/plain"};
    } else if (megatron && method != "PUT") {
      reply = HttpReply{405, "/api takes PUT (Megatron's text generation API)\n", "text/plain"};
    } else if ((completions || chat || tokenize_path || detokenize_path) && method != "POST") {
      reply = HttpReply{405, path + " takes POST\n", "text/plain"};
    } else if ((models || health) && method != "GET") {
      reply = HttpReply{405, path + " takes GET\n", "text/plain"};
    } else if (health) {  // the server is up and its worker takes requests
      reply = HttpReply{200, "{\"status\":\"ok\"}"};
    } else if (models) {
      reply = openai_models(ctx_);
    } else if (megatron) {
      reply = megatron_generate(parse_request_body(body), ctx_);
    } else if (tokenize_path) {
      reply = tokenize(parse_request_body<nlohmann::ordered_json>(body), ctx_);
    } else if (detokenize_path) {
      reply = detokenize(parse_request_body(body), ctx_);
    } else {
      uint64_t id;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        id = next_id_++;
      }
      // (a chat request's objects in their order: a tool's schema reaches the template as written)
      reply = chat ? openai_chat_completions(parse_request_body<nlohmann::ordered_json>(body), ctx_, id)
                   : openai_completions(parse_request_body(body), ctx_, id);
    }
  } catch (const RequestError& e) {
    // Megatron answers with the message alone; OpenAI's clients read {"error": {"message": ...}}.
    reply = megatron ? HttpReply{e.status, std::string(e.what()) + "\n", "text/plain"}
                     : HttpReply{e.status,
                                 json_text({{"error", {{"message", e.what()}, {"type", "invalid_request_error"}}}})};
  } catch (const std::exception& e) {
    reply = megatron ? HttpReply{500, std::string(e.what()) + "\n", "text/plain"}
                     : HttpReply{500, json_text({{"error", {{"message", e.what()}, {"type", "server_error"}}}})};
  }
  if (options_.log) {
    std::fprintf(stderr, "serve: %s %s -> %d (%.1f ms)%s%s\n", method.c_str(), path.c_str(), reply.status, timer.ms(),
                 reply.status >= 400 ? ": " : "",
                 reply.status >= 400 ? reply.body.substr(0, reply.body.find_first_of("\n")).c_str() : "");
  }
  return reply;
}

}  // namespace lattice
