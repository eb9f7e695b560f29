// The greedy order compares w_d * s - count_d across datasets; a fused multiply-add
// rounds differently from Megatron's (and numpy's) separate multiply and subtract and
// changes ties, so contraction is off in this file.
#pragma GCC optimize("fp-contract=off")
#include "data/blended_dataset.h"

#include <cmath>

#include "core/error.h"

namespace lattice {

namespace {

// numpy's pairwise summation of float64 (umath loops): plain loop below 8 elements,
// 8 accumulators up to 128, halves (at a multiple of 8) above.
double numpy_pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

}  // namespace

std::vector<double> normalize_blend_weights(const std::vector<double>& weights, const char* flag) {
  if (weights.empty()) LATTICE_FAIL() << "--" << flag << ": no datasets";
  for (size_t d = 0; d < weights.size(); ++d)
    if (!(weights[d] > 0) || !std::isfinite(weights[d]))
      LATTICE_FAIL() << "--" << flag << ": weight " << weights[d] << " of dataset " << d + 1
                     << " must be a positive number";
  const double sum = numpy_pairwise_sum(weights.data(), int64_t(weights.size()));
  std::vector<double> w(weights.size());
  for (size_t d = 0; d < w.size(); ++d) w[d] = weights[d] / sum;
  return w;
}

std::vector<int64_t> blend_samples_per_dataset(const std::vector<double>& w, int64_t size, double surplus) {
  std::vector<int64_t> n(w.size());
  for (size_t d = 0; d < w.size(); ++d)
    n[d] = int64_t(std::ceil(std::ceil(double(size) * w[d]) * (1.0 + surplus)));
  return n;
}

BlendingIndex::BlendingIndex(std::vector<double> w, int64_t size) : weights_(std::move(w)), size_(size) {
  LATTICE_CHECK(!weights_.empty() && size_ >= 0) << "BlendingIndex: " << weights_.size()
                                                 << " datasets, size " << size_;
  const size_t D = weights_.size();
  std::vector<int64_t> counts(D, 0);
  block_counts_.reserve(size_t((size_ + kBlock - 1) / kBlock) * D);
  for (int64_t s = 0; s < size_; ++s) {
    if (s % kBlock == 0) block_counts_.insert(block_counts_.end(), counts.begin(), counts.end());
    ++counts[size_t(step(counts, s))];
  }
  totals_ = counts;
}

int64_t BlendingIndex::step(std::vector<int64_t>& counts, int64_t s) const {
  const double x = std::max(double(s), 1.0);
  int64_t best = 0;
  double best_err = weights_[0] * x - double(counts[0]);
  for (size_t d = 1; d < weights_.size(); ++d) {
    const double err = weights_[d] * x - double(counts[d]);
    if (err > best_err) {
      best_err = err;
      best = int64_t(d);
    }
  }
  return best;
}

std::pair<int64_t, int64_t> BlendingIndex::locate(int64_t index) const {
  LATTICE_CHECK(index >= 0 && index < size_) << "blended sample " << index << " out of range [0, " << size_ << ")";
  const size_t D = weights_.size();
  const int64_t b = index / kBlock;
  std::vector<int64_t> counts(block_counts_.begin() + b * D, block_counts_.begin() + (b + 1) * D);
  for (int64_t s = b * kBlock;; ++s) {
    const int64_t d = step(counts, s);
    if (s == index) return {d, counts[size_t(d)]};
    ++counts[size_t(d)];
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets,
                               std::vector<double> w, int64_t size)
    : datasets_(std::move(datasets)), index_(std::move(w), size) {
  LATTICE_CHECK(int64_t(datasets_.size()) == index_.num_datasets())
      << "BlendedDataset: " << datasets_.size() << " datasets, " << index_.num_datasets() << " weights";
  for (size_t d = 0; d < datasets_.size(); ++d) {
    LATTICE_CHECK(datasets_[d]->seq_length() == datasets_[0]->seq_length()) << "BlendedDataset: sequence lengths differ";
    LATTICE_CHECK(datasets_[d]->has_extras() == datasets_[0]->has_extras())
        << "BlendedDataset: datasets with and without loss masks";
    LATTICE_CHECK(index_.total_count(int64_t(d)) <= datasets_[d]->size())
        << "BlendedDataset: dataset " << d << " holds " << datasets_[d]->size() << " samples, the blend takes "
        << index_.total_count(int64_t(d));
  }
}

std::pair<int64_t, int64_t> BlendedDataset::locate(int64_t index) const {
  if (index < 0 || index >= size())
    LATTICE_FAIL() << "blended dataset: sample " << index << " is out of range: the blend holds " << size() << " samples";
  return index_.locate(index);
}

void BlendedDataset::sample(int64_t index, int32_t* out) const {
  const auto [d, k] = locate(index);
  datasets_[size_t(d)]->sample(k, out);
}

void BlendedDataset::sample_with_extras(int64_t index, int32_t* tokens, float* loss_mask, int32_t* segments) const {
  const auto [d, k] = locate(index);
  datasets_[size_t(d)]->sample_with_extras(k, tokens, loss_mask, segments);
}

}  // namespace lattice
