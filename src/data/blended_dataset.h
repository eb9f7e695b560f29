// Megatron's BlendedDataset (--data-path w1 p1 w2 p2 ...): sample s of the blend is
// the next unused sample of dataset argmax_d(w_d * max(s, 1) - count_d(s)), ties to the
// lowest index, where w are the normalised weights and count_d(s) the samples dataset
// d gave to blend samples 0..s-1. The greedy order keeps every prefix of the blend as
// close to the weights as it can be.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "data/gpt_batches.h"
#include "data/gpt_dataset.h"

namespace lattice {

// Megatron's normalize(): w / numpy.sum(w) in float64 (numpy's pairwise summation, so
// the weights, and hence the order, are bit-identical). `flag` names the weights in errors:
// each must be finite and > 0.
std::vector<double> normalize_blend_weights(const std::vector<double>& weights, const char* flag);

// Samples each dataset of a blend of `size` samples is built with: Megatron's
// ceil(ceil(size * w_d) * (1 + surplus)), surplus --mid-level-dataset-surplus (0.005 by default;
// the greedy order never takes more than ceil(size * w_d) from a dataset).
std::vector<int64_t> blend_samples_per_dataset(const std::vector<double>& normalized_weights, int64_t size,
                                               double surplus = 0.005);

// The greedy order, for `size` samples. Instead of Megatron's two arrays of `size`
// entries (GBs for long runs) it keeps the per-dataset counts every kBlock samples and
// replays at most kBlock steps to place a sample: O(size/kBlock * D) memory.
class BlendingIndex {
 public:
  static constexpr int64_t kBlock = 1024;
  BlendingIndex(std::vector<double> normalized_weights, int64_t size);
  int64_t size() const { return size_; }
  int64_t num_datasets() const { return int64_t(weights_.size()); }
  // (dataset, sample of that dataset) of blend sample `index` < size().
  std::pair<int64_t, int64_t> locate(int64_t index) const;
  // Samples dataset d gives to the whole blend.
  int64_t total_count(int64_t d) const { return totals_[size_t(d)]; }

 private:
  int64_t step(std::vector<int64_t>& counts, int64_t s) const;  // returns the dataset of sample s
  std::vector<double> weights_;
  int64_t size_;
  std::vector<int64_t> block_counts_;  // [blocks, D]: counts before sample b*kBlock
  std::vector<int64_t> totals_;        // [D]
};

// A blend of GPTDatasets (pretraining) or of SftSamples (--sft's JSONL files, whose samples carry a
// loss mask and segments: then the blend's do too).
class BlendedDataset : public SampleSource {
 public:
  // datasets[d] must hold at least the samples the blend takes from it; all of one sequence length and
  // all with extras or none.
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets,
                 std::vector<double> normalized_weights, int64_t size);
  int64_t size() const override { return index_.size(); }
  void sample(int64_t index, int32_t* out) const override;
  bool has_extras() const override { return datasets_[0]->has_extras(); }
  void sample_with_extras(int64_t index, int32_t* tokens, float* loss_mask, int32_t* segments) const override;
  int64_t seq_length() const override { return datasets_[0]->seq_length(); }
  const BlendingIndex& blending_index() const { return index_; }

 private:
  std::pair<int64_t, int64_t> locate(int64_t index) const;  // checked against size()
  std::vector<std::shared_ptr<const SampleSource>> datasets_;
  BlendingIndex index_;
};

}  // namespace lattice
