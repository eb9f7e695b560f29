#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace lattice {

int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& cfg,
                     const PhiloxStream& stream, uint64_t draw) {
  LATTICE_CHECK(V > 0) << "empty vocabulary";
  if (cfg.temperature <= 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  int64_t keep = V;
  if (cfg.top_k > 0) keep = std::min(keep, cfg.top_k);
  std::vector<double> probs(static_cast<size_t>(keep));
  const double max_logit = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((double(logits[order[i]]) - max_logit) / cfg.temperature);
    sum += probs[i];
  }
  if (cfg.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= cfg.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  const double u = stream.uniform(draw) * sum;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) return order[i];
  }
  return order[keep - 1];
}

}  // namespace lattice
