// Next-token sampling (model/sampling.h): greedy, and the distributions of temperature, top-k and top-p
// sampling against the probabilities they state, measured over many draws of the stream.
#include "model/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace lattice {
namespace {

constexpr int64_t kV = 40;
constexpr int kDraws = 200000;

std::vector<float> logits(int64_t V = kV) {
  std::vector<float> l(static_cast<size_t>(V));
  for (int64_t t = 0; t < V; ++t) l[size_t(t)] = float(std::sin(1.7 * double(t)) * 2.5);
  l[7] = l[3];  // a tie: the lower id is the likelier
  return l;
}

// The probabilities sampling with cfg states: softmax(logits / T) over the top-k tokens (ties: the lower
// id), then the likeliest of those whose mass reaches top_p, renormalized.
std::vector<double> stated(const std::vector<float>& l, const SamplingConfig& cfg) {
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const size_t keep = cfg.top_k > 0 ? size_t(cfg.top_k) : l.size();
  std::vector<double> p(l.size(), 0.0);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[size_t(order[i])] = std::exp((l[order[i]] - l[order[0]]) / cfg.temperature);
  double cum = 0;
  size_t nucleus = keep;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[size_t(order[i])] / sum;
    if (cum >= cfg.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  for (size_t i = nucleus; i < l.size(); ++i) p[size_t(order[i])] = 0.0;
  const double kept = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= kept;
  return p;
}

// Every token's frequency over `draws` draws is its stated probability within 5 standard errors, and a
// token of probability 0 never comes.
void expect_distribution(const SamplingConfig& cfg, int64_t V = kV, int draws = kDraws) {
  const std::vector<float> l = logits(V);
  const std::vector<double> p = stated(l, cfg);
  std::vector<int> count(static_cast<size_t>(V), 0);
  const PhiloxStream stream{42, 7};
  for (int d = 0; d < draws; ++d) ++count[size_t(sample_token(l.data(), V, cfg, stream, uint64_t(d)))];
  for (int64_t t = 0; t < V; ++t) {
    const double f = double(count[size_t(t)]) / draws, pt = p[size_t(t)];
    if (pt == 0.0) {
      EXPECT_EQ(count[size_t(t)], 0) << "token " << t << " is outside the kept set";
      continue;
    }
    EXPECT_NEAR(f, pt, 5.0 * std::sqrt(pt * (1 - pt) / draws) + 1e-9)
        << "token " << t << " (T " << cfg.temperature << ", top-k " << cfg.top_k << ", top-p " << cfg.top_p << ")";
  }
}

TEST(Sampling, GreedyIsTheFirstLargestLogit) {
  const std::vector<float> l = logits();
  const int64_t best = std::max_element(l.begin(), l.end()) - l.begin();
  EXPECT_EQ(sample_token(l.data(), kV, SamplingConfig{0.0f}, PhiloxStream{1, 2}, 0), best);
}

TEST(Sampling, TemperatureSamplesTheSoftmax) {
  expect_distribution(SamplingConfig{1.0f});
  expect_distribution(SamplingConfig{0.5f});
}

TEST(Sampling, TopKAndTopPKeepTheLikeliestTokens) {
  expect_distribution(SamplingConfig{1.0f, 5});
  expect_distribution(SamplingConfig{1.0f, 0, 0.6f});
  expect_distribution(SamplingConfig{0.7f, 12, 0.9f});
  // 600 tokens: the nucleus grows past the first sorted prefix (256 tokens).
  expect_distribution(SamplingConfig{1.0f, 0, 0.999f}, 600, 60000);
}

TEST(Sampling, TiesAtTheTopKBoundaryKeepTheLowerId) {
  std::vector<float> l(size_t(kV), 0.0f);  // every logit equal: top-3 keeps ids 0, 1 and 2
  SamplingConfig cfg{1.0f, 3};
  for (int d = 0; d < 300; ++d) EXPECT_LT(sample_token(l.data(), kV, cfg, PhiloxStream{3, 4}, uint64_t(d)), 3);
}

TEST(Sampling, TheSameDrawGivesTheSameToken) {
  const std::vector<float> l = logits();
  for (const SamplingConfig& cfg : {SamplingConfig{1.0f}, SamplingConfig{0.8f, 6, 0.7f}})
    for (uint64_t d = 0; d < 50; ++d)
      EXPECT_EQ(sample_token(l.data(), kV, cfg, PhiloxStream{9, 1}, d), sample_token(l.data(), kV, cfg, PhiloxStream{9, 1}, d));
}

}  // namespace
}  // namespace lattice

namespace lattice {
namespace {

// The penalties and the bias, each against its formula worked by hand: the repetition penalty divides
// a positive logit of a token seen anywhere (prompt included) and multiplies a negative one, once per
// token; frequency and presence count the generated tokens only; the bias is added last.
TEST(Sampling, AdjustLogitsPenaltiesAndBias) {
  const std::vector<float> base = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  const std::vector<int32_t> tokens = {1, 3, 3, 0, 0, 2};  // the prompt {1, 3, 3}, then 0, 0, 2
  auto adjusted = [&](const SamplingConfig& c) {
    std::vector<float> l = base;
    adjust_logits(l.data(), int64_t(l.size()), c, tokens, 3);
    return l;
  };
  SamplingConfig none;
  EXPECT_FALSE(none.adjusts());
  EXPECT_EQ(adjusted(none), base);
  SamplingConfig rep;
  rep.repetition_penalty = 2.0f;
  EXPECT_TRUE(rep.adjusts());
  EXPECT_EQ(adjusted(rep), (std::vector<float>{1.0f, -2.0f, 0.25f, 1.5f, -2.0f}));  // token 4 unseen
  SamplingConfig counts;
  counts.frequency_penalty = 0.5f;
  counts.presence_penalty = 0.25f;
  // token 0 generated twice: 2 - 2 x 0.5 - 0.25; token 2 once: 0.5 - 0.5 - 0.25; 1 and 3 only in the prompt
  EXPECT_EQ(adjusted(counts), (std::vector<float>{0.75f, -1.0f, -0.25f, 3.0f, -2.0f}));
  SamplingConfig bias;
  bias.logit_bias = {{4, 10.0f}, {3, -100.0f}};
  EXPECT_EQ(adjusted(bias), (std::vector<float>{2.0f, -1.0f, 0.5f, -97.0f, 8.0f}));
  SamplingConfig all = counts;
  all.repetition_penalty = 2.0f;
  all.logit_bias = {{0, 1.0f}};
  EXPECT_EQ(adjusted(all), (std::vector<float>{1.0f - 1.0f - 0.25f + 1.0f, -2.0f, 0.25f - 0.5f - 0.25f, 1.5f, -2.0f}));
}

}  // namespace
}  // namespace lattice
