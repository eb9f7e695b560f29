#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace lattice {

void adjust_logits(float* logits, int64_t V, const SamplingConfig& cfg, const std::vector<int32_t>& tokens,
                   int64_t prompt_length) {
  if (cfg.repetition_penalty != 1.0f) {
    std::vector<bool> seen(static_cast<size_t>(V), false);
    for (int32_t t : tokens)
      if (t >= 0 && t < V && !seen[size_t(t)]) {
        seen[size_t(t)] = true;
        float& l = logits[t];
        l = l > 0 ? l / cfg.repetition_penalty : l * cfg.repetition_penalty;
      }
  }
  if (cfg.frequency_penalty != 0.0f || cfg.presence_penalty != 0.0f) {
    std::vector<int32_t> count(static_cast<size_t>(V), 0);
    for (size_t k = size_t(std::max<int64_t>(prompt_length, 0)); k < tokens.size(); ++k)
      if (tokens[k] >= 0 && tokens[k] < V) ++count[size_t(tokens[k])];
    for (int64_t t = 0; t < V; ++t)
      if (count[size_t(t)] > 0) logits[t] -= float(count[size_t(t)]) * cfg.frequency_penalty + cfg.presence_penalty;
  }
  for (const auto& [t, bias] : cfg.logit_bias)
    if (t >= 0 && t < V) logits[t] += bias;
}

namespace {

// The token whose cumulative weight (over `ids` in their order) first exceeds u.
int32_t pick(const std::vector<int32_t>& ids, const std::vector<double>& w, int64_t n, double u) {
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += w[size_t(i)];
    if (u < cum) return ids[size_t(i)];
  }
  return ids[size_t(n - 1)];
}

}  // namespace

int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& cfg,
                     const PhiloxStream& stream, uint64_t draw) {
  LATTICE_CHECK(V > 0) << "empty vocabulary";
  if (cfg.temperature <= 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);
  const double max_logit = *std::max_element(logits, logits + V);
  auto weight = [&](int32_t t) { return std::exp((double(logits[t]) - max_logit) / cfg.temperature); };
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  if (cfg.top_k <= 0 && cfg.top_p >= 1.0f) {  // the whole vocabulary, in id order: no sort
    std::vector<double> w(static_cast<size_t>(V));
    double sum = 0;
    for (int64_t t = 0; t < V; ++t) sum += w[size_t(t)] = weight(int32_t(t));
    return pick(ids, w, V, stream.uniform(draw) * sum);
  }
  // Top-k and top-p take the likeliest tokens first (ties: the lower id): sorted as far as needed.
  auto likelier = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const int64_t keep = cfg.top_k > 0 ? std::min(V, cfg.top_k) : V;
  std::vector<double> w;
  double sum = 0;
  if (keep < V) {
    std::nth_element(ids.begin(), ids.begin() + keep, ids.end(), likelier);
    ids.resize(size_t(keep));
  }
  for (int32_t t : ids) sum += weight(t);  // the kept tokens' total (id order after the selection)
  if (cfg.top_p >= 1.0f) {
    std::sort(ids.begin(), ids.end(), likelier);
    for (int32_t t : ids) w.push_back(weight(t));
    return pick(ids, w, keep, stream.uniform(draw) * sum);
  }
  // Nucleus: the sorted prefix whose mass reaches top_p, found by sorting prefixes of growing length.
  for (int64_t sorted = std::min<int64_t>(keep, 256);; sorted = std::min(keep, 4 * sorted)) {
    std::partial_sort(ids.begin(), ids.begin() + sorted, ids.end(), likelier);
    w.clear();
    double cum = 0;
    int64_t n = 0;
    while (n < sorted && cum / sum < double(cfg.top_p)) cum += w.emplace_back(weight(ids[size_t(n++)]));
    if (cum / sum >= double(cfg.top_p) || sorted == keep) return pick(ids, w, n, stream.uniform(draw) * cum);
  }
}

}  // namespace lattice
