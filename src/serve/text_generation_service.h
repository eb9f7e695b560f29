// TextGenerationService: what `lattice serve` answers, without the sockets (cli/serve.cpp puts it
// behind an HTTP server; the tests call handle() directly).
//
// Routes: PUT /api (Megatron-LM's, serve/megatron_api.h), POST /completions and /v1/completions
// (OpenAI's, serve/completions_api.h), POST /chat/completions and /v1/chat/completions
// (serve/chat_completions_api.h), GET /v1/models, GET /health (200 while serving). A bad request is answered 400 with a one-line
// message naming the field; an unknown path 404; a known path with another method 405.
//
// One worker thread runs the model (its OpenMP threads and device stream stay one set), with
// continuous batching: the prompts of every request fill the generator's sequences (--batch-size) as
// they come, a prompt that arrives while others decode starting at the next step where a sequence is
// free (TextGenerator::run with a source). Each prompt samples from its own stream, so a request's
// tokens do not depend on what else is being served.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chat/chat_template.h"
#include "model/text_generation.h"
#include "serve/endpoint.h"

namespace lattice {

class GPTModel;

struct ServeOptions {
  int64_t sequences = 8;   // prompts decoded together
  bool bf16 = false;       // GPTInference's bf16 weights
  uint64_t seed = 1234;    // requests without a seed take seed, seed + 1, ... in arrival order
  std::string model_name;  // the completions API's "model"
  // Non-empty: every request but GET /health must carry "Authorization: Bearer <api_key>" (401 otherwise).
  std::string api_key;
  bool log = true;         // one line per request on stderr
  std::optional<ChatTemplate> chat_template;  // the chat completions' (none: they are refused)
  // How the chat completions read the model's tool calls (serve/tool_calls.h): auto (the template's form),
  // hermes, llama3_json, mistral or none.
  std::string tool_call_parser = "auto";
  std::vector<int32_t> stop_tokens;  // the tokens that end a text (none: the tokenizer's end of document)
};

class TextGenerationService {
 public:
  // The model and tokenizer must outlive the service.
  TextGenerationService(const GPTModel& model, const Tokenizer& tokenizer, ServeOptions options);
  ~TextGenerationService();  // finishes the work in hand, then stops the worker

  // authorization: the request's Authorization header ("" when it has none).
  HttpReply handle(const std::string& method, const std::string& path, const std::string& body,
                   const std::string& authorization = "");

  // The device memory the generator holds: the KV cache of --batch-size sequences and its buffers.
  size_t generator_bytes() const { return generator_bytes_; }

 private:
  struct Job {
    std::vector<GenerationRequest> requests;
    KeepGoing keep_going;
    std::promise<std::vector<GenerationResult>> done;
    std::vector<GenerationResult> results;  // (the worker's)
    size_t started = 0, finished = 0;       // prompts handed to the generator, and complete
  };
  std::vector<GenerationResult> generate(std::vector<GenerationRequest> requests, KeepGoing keep_going);
  void work();

  const GPTModel& model_;
  ServeOptions options_;
  std::unique_ptr<TextGenerator> generator_;  // made here, run by the worker
  size_t generator_bytes_ = 0;
  EndpointContext ctx_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable wake_;
  std::deque<Job*> queue_;  // jobs with prompts not yet started, in arrival order
  bool stopping_ = false;
  uint64_t next_seed_, next_id_ = 0;
  std::thread worker_;
};

}  // namespace lattice
