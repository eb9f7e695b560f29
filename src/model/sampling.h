// Next-token sampling from logits: temperature, top-k, top-p (nucleus); temperature 0
// is greedy. Draws come from a counter-based stream, so a seed gives the same text.
// Before sampling, the logits may be adjusted for the text so far (adjust_logits): OpenAI's
// frequency and presence penalties and logit_bias, and the repetition penalty of HuggingFace and vLLM.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/philox.h"

namespace lattice {

struct SamplingConfig {
  float temperature = 1.0f;
  int64_t top_k = 0;    // 0: off
  float top_p = 1.0f;   // 1: off
  // OpenAI's: logit[t] -= count[t] x frequency_penalty + (count[t] > 0) x presence_penalty, count[t] the
  // times t was generated so far (the prompt not counted).
  float frequency_penalty = 0.0f, presence_penalty = 0.0f;
  // HuggingFace's and vLLM's: a token of the prompt or the text so far has its logit divided by it when
  // positive, multiplied when negative (1: off).
  float repetition_penalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's: (token, added to its logit)
  bool adjusts() const {
    return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty();
  }
};

// The logits [V] as cfg's penalties and bias make them for a text of `tokens`, of which the first
// prompt_length are the prompt: in order the repetition penalty, the frequency and presence penalties,
// the bias.
void adjust_logits(float* logits, int64_t V, const SamplingConfig& cfg, const std::vector<int32_t>& tokens,
                   int64_t prompt_length);

// logits: [V] (the real vocabulary only). `draw` is the draw index in the stream.
int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& cfg,
                     const PhiloxStream& stream, uint64_t draw);

}  // namespace lattice
