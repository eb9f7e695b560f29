// TextGenerator: decodes many prompts with one KV cache of several sequences (GPTInference), as
// `lattice generate --batch-size` and `lattice serve` do.
//
// The prompts that take free sequences of the cache at the same step are prefilled together, in one
// forward (GPTInference::append of several parts: one GEMM per linear layer over all their rows, each
// attention over its own sequence); then one step
// (GPTInference::step) per new token runs the new tokens of every prompt in flight through the
// model together; a finished prompt's sequence is taken by the next prompt, also one that arrived
// while the others were decoding (continuous batching: run(source, ...)). Each prompt samples as it
// would alone (its own stream, its own logits), so its tokens do not depend on the batch.
//
// Context: positions are absolute, so a sequence holds at most max_position_embeddings (P) tokens.
// A longer prompt keeps its last P tokens; when decoding fills the context, the sequence restarts
// from the last half of it (one new prefill).
//
// Log-probabilities (GenerationRequest::logprobs) are those of the model's distribution,
// log_softmax of its logits over the real vocabulary, whatever the sampling settings: what an
// evaluation scores a continuation by.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "model/sampling.h"

namespace lattice {

class GPTModel;
class GPTInference;

struct GenerationRequest {
  std::vector<int32_t> prompt;   // token ids, at least one
  int64_t max_new_tokens = 0;
  SamplingConfig sampling;
  PhiloxStream stream{0, 0};     // the sampler's draws: draw n picks the (n + 1)-th new token
  std::vector<int32_t> stop_tokens;  // a sampled one ends decoding and is not kept (none: max_new_tokens only)
  // The log-probability of every token after the first (the prompt's and the new ones); with
  // top_logprobs > 0 also the top_logprobs likeliest tokens' at each of those positions. The whole
  // prompt must then fit the context (no token of it is dropped).
  bool logprobs = false;
  int64_t top_logprobs = 0;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // the prompt, then the new tokens
  int64_t prompt_length = 0;
  // With logprobs: [tokens - 1], logprobs[i] = log p(tokens[i + 1] | tokens[0..i]).
  std::vector<float> logprobs;
  // With top_logprobs: [tokens - 1][top_logprobs] (token, log p), the likeliest first (ties: lower id).
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  bool stopped = false;  // ended by the stop token or by the token callback, not by max_new_tokens
};

struct GenerationTiming {
  int64_t prefill_tokens = 0, new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
};

// log p(token) under log_softmax(logits[0:V]) and, for top > 0, the top likeliest tokens' (likeliest
// first, ties: the lower id) into *best.
float token_logprob(const float* logits, int64_t V, int32_t token, int64_t top = 0,
                    std::vector<std::pair<int32_t, float>>* best = nullptr);

class TextGenerator {
 public:
  // After each new token is appended to the result of request i; false ends request i there.
  using TokenCallback = std::function<bool(size_t request, const GenerationResult& result)>;
  // When request i is complete (its result final).
  using DoneCallback = std::function<void(size_t request, const GenerationResult& result)>;

  // sequences: the prompts decoded together (the cache's sequences, each max_position_embeddings
  // tokens). bf16: GPTInference's bf16 weights. The model must outlive the generator, untrained.
  TextGenerator(const GPTModel& model, int64_t sequences, bool bf16);
  ~TextGenerator();

  // Decodes every request; results in request order. Throws lattice::Error for a request it cannot
  // run (an empty prompt, a token outside the vocabulary, logprobs of a prompt longer than the context).
  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& requests,
                                    const TokenCallback& on_token = {}, const DoneCallback& on_done = {});

  // Continuous batching: whenever a sequence is free (before each step), asks `source` for a request
  // to start there (false: none now) with the id the callbacks name it by; returns when no request is
  // in flight and the source has none. A request that cannot run throws lattice::Error from here.
  using Source = std::function<bool(GenerationRequest& request, size_t& id)>;
  void run(const Source& source, const TokenCallback& on_token, const DoneCallback& on_done);

  const GenerationTiming& timing() const { return timing_; }
  int64_t context() const { return context_; }  // max_position_embeddings

 private:
  const GPTModel& model_;
  std::unique_ptr<GPTInference> cache_;
  int64_t sequences_, context_, vocab_, padded_vocab_;
  GenerationTiming timing_;
};

}  // namespace lattice
