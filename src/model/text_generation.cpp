#include "model/text_generation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/timer.h"
#include "model/gpt_inference.h"
#include "model/gpt_model.h"

namespace lattice {

float token_logprob(const float* logits, int64_t V, int32_t token, int64_t top,
                    std::vector<std::pair<int32_t, float>>* best) {
  LATTICE_CHECK(token >= 0 && token < V) << "token " << token << " outside the vocabulary of " << V;
  const double max_logit = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t t = 0; t < V; ++t) sum += std::exp(double(logits[t]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  if (top > 0 && best) {
    const int64_t n = std::min(top, V);
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int64_t t = 0; t < V; ++t) ids[size_t(t)] = int32_t(t);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    best->clear();
    for (int64_t i = 0; i < n; ++i) best->emplace_back(ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - log_z));
  }
  return float(double(logits[token]) - log_z);
}

TextGenerator::TextGenerator(const GPTModel& model, int64_t sequences, bool bf16)
    : model_(model),
      sequences_(sequences),
      context_(model.config().max_position_embeddings),
      vocab_(model.config().vocab_size),
      padded_vocab_(model.config().padded_vocab_size) {
  LATTICE_CHECK(sequences >= 1) << "TextGenerator needs at least one sequence, got " << sequences;
  cache_ = std::make_unique<GPTInference>(model, 0, bf16, sequences);
}

TextGenerator::~TextGenerator() = default;

namespace {

void check_request(const GenerationRequest& r, size_t id, int64_t V, int64_t P) {
  if (r.prompt.empty()) LATTICE_FAIL() << "prompt " << id << " has no tokens";
  for (int32_t t : r.prompt)
    if (t < 0 || t >= V) LATTICE_FAIL() << "prompt " << id << ": token " << t << " outside the vocabulary of " << V;
  if (r.logprobs && int64_t(r.prompt.size()) > P)
    LATTICE_FAIL() << "prompt " << id << ": " << r.prompt.size() << " tokens with log-probabilities, more than the context of "
                   << P;
}

}  // namespace

std::vector<GenerationResult> TextGenerator::run(const std::vector<GenerationRequest>& requests,
                                                 const TokenCallback& on_token, const DoneCallback& on_done) {
  for (size_t i = 0; i < requests.size(); ++i) check_request(requests[i], i, vocab_, context_);
  std::vector<GenerationResult> results(requests.size());
  size_t next = 0;
  run([&](GenerationRequest& r, size_t& id) {
        if (next == requests.size()) return false;
        id = next;
        r = requests[next++];
        return true;
      },
      on_token,
      [&](size_t id, const GenerationResult& r) {
        results[id] = r;
        if (on_done) on_done(id, results[id]);
      });
  return results;
}

void TextGenerator::run(const Source& source, const TokenCallback& on_token, const DoneCallback& on_done) {
  const int64_t P = context_, V = vocab_, Vp = padded_vocab_, S = sequences_;
  struct InFlight {
    GenerationRequest request;
    GenerationResult out;
    size_t id = 0;
    int64_t start = 0, made = 0;  // the first token in the context; new tokens so far
    std::vector<float> logits;    // [Vp] the next token's
    bool busy = false;
  };
  std::vector<InFlight> seqs(static_cast<size_t>(S));
  // The sequences' contexts from scratch into their cache rows, in one forward; the first time, with
  // log-probabilities asked, every position's logits for the prompt's.
  auto prefill = [&](const std::vector<int64_t>& which, bool first) {
    if (which.empty()) return;
    const Timer timer;
    std::vector<GPTInference::Part> parts;
    int64_t rows = 0;
    for (int64_t s : which) {
      InFlight& q = seqs[size_t(s)];
      const int64_t n = int64_t(q.out.tokens.size()) - q.start;
      const bool all = first && q.request.logprobs;
      cache_->reset(s);
      parts.push_back({s, q.out.tokens.data() + q.start, n, all});
      rows += all ? n : 1;
      timing_.prefill_tokens += n;
    }
    std::vector<float> logits(static_cast<size_t>(rows * Vp));
    cache_->append(parts, logits.data());
    const float* row = logits.data();
    for (const GPTInference::Part& part : parts) {
      InFlight& q = seqs[size_t(part.seq)];
      GenerationResult& out = q.out;
      if (part.all_positions) {
        std::vector<std::pair<int32_t, float>> best;
        for (int64_t i = 0; i + 1 < part.n; ++i) {
          out.logprobs.push_back(
              token_logprob(row + i * Vp, V, out.tokens[size_t(i + 1)], q.request.top_logprobs, &best));
          if (q.request.top_logprobs > 0) out.top_logprobs.push_back(best);
        }
        row += (part.n - 1) * Vp;
      }
      std::copy(row, row + Vp, q.logits.begin());
      row += Vp;
    }
    timing_.prefill_s += timer.seconds();
  };
  auto finish = [&](int64_t s) {
    InFlight& q = seqs[size_t(s)];
    q.busy = false;
    if (on_done) on_done(q.id, q.out);
  };
  const Timer all_timer;
  const double prefill_before = timing_.prefill_s;
  for (;;) {
    // Free sequences take the source's next requests, prefilled together.
    std::vector<int64_t> fresh;
    for (int64_t s = 0; s < S; ++s) {
      InFlight& q = seqs[size_t(s)];
      if (q.busy) continue;
      q = InFlight{};
      if (!source(q.request, q.id)) break;
      check_request(q.request, q.id, V, P);
      q.out.tokens = q.request.prompt;
      q.out.prompt_length = int64_t(q.out.tokens.size());
      q.start = std::max<int64_t>(0, q.out.prompt_length - P);
      q.logits.resize(static_cast<size_t>(Vp));
      q.busy = true;
      fresh.push_back(s);
    }
    prefill(fresh, true);
    // Each request in flight samples its next token; those that go on are stepped together.
    std::vector<int32_t> tokens;
    std::vector<int64_t> stepped;
    bool any = false;
    for (int64_t s = 0; s < S; ++s) {
      InFlight& q = seqs[size_t(s)];
      if (!q.busy) continue;
      any = true;
      const GenerationRequest& r = q.request;
      GenerationResult& out = q.out;
      if (q.made == r.max_new_tokens) {
        finish(s);
        continue;
      }
      int32_t next;
      if (r.sampling.adjusts()) {  // penalties and bias on a copy: the log-probabilities stay the model's
        std::vector<float> adjusted(q.logits.begin(), q.logits.begin() + V);
        adjust_logits(adjusted.data(), V, r.sampling, out.tokens, out.prompt_length);
        next = sample_token(adjusted.data(), V, r.sampling, r.stream, uint64_t(q.made));
      } else {
        next = sample_token(q.logits.data(), V, r.sampling, r.stream, uint64_t(q.made));
      }
      if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), next) != r.stop_tokens.end()) {
        out.stopped = true;
        finish(s);
        continue;
      }
      if (r.logprobs) {
        std::vector<std::pair<int32_t, float>> best;
        out.logprobs.push_back(token_logprob(q.logits.data(), V, next, r.top_logprobs, &best));
        if (r.top_logprobs > 0) out.top_logprobs.push_back(std::move(best));
      }
      out.tokens.push_back(next);
      ++timing_.new_tokens;
      ++q.made;
      if (on_token && !on_token(q.id, out)) {
        out.stopped = true;
        finish(s);
        continue;
      }
      if (q.made == r.max_new_tokens) {  // no logits needed after the last token
        finish(s);
        continue;
      }
      const int64_t length = int64_t(out.tokens.size());
      if (length - q.start > P) {  // the context is full: its last half prefilled again, alone
        q.start = length - std::max<int64_t>(1, P / 2);
        prefill({s}, false);
        continue;
      }
      tokens.push_back(next);
      stepped.push_back(s);
    }
    if (!any) break;  // (the source had nothing for a free sequence)
    if (tokens.empty()) continue;
    std::vector<float> logits(tokens.size() * size_t(Vp));
    cache_->step(tokens.data(), stepped.data(), int64_t(tokens.size()), logits.data());
    for (size_t i = 0; i < stepped.size(); ++i)
      std::copy(logits.begin() + int64_t(i) * Vp, logits.begin() + int64_t(i + 1) * Vp,
                seqs[size_t(stepped[i])].logits.begin());
  }
  timing_.decode_s += all_timer.seconds() - (timing_.prefill_s - prefill_before);
}

}  // namespace lattice
