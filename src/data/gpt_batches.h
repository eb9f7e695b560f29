// Micro-batch sources for training: each sample is S+1 consecutive tokens (inputs
// are tokens[0:S], labels tokens[1:S+1]); consecutive samples overlap by one token.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace lattice {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes sample `index` (S+1 tokens) into out.
  virtual void sample(int64_t index, int32_t* out) const = 0;
  // Whether samples carry their own loss mask and segments (SFT's packed conversations, data/sft_dataset.h).
  virtual bool has_extras() const { return false; }
  // With has_extras(): sample `index` at once with its loss mask [S] (1 where the label tokens[t + 1] is
  // trained) and the segment of each input position [S] (a segment is a document: positions restart and
  // attention stays within it).
  virtual void sample_with_extras(int64_t index, int32_t* tokens, float* /*loss_mask*/, int32_t* /*segments*/) const {
    sample(index, tokens);
  }
  virtual int64_t seq_length() const = 0;
  // The distinct samples it indexes; -1 when it has no end (it wraps around, or is synthetic).
  virtual int64_t size() const { return -1; }
};

// Samples in document order from an indexed dataset (all documents back to back,
// sample i = tokens [i*S, i*S + S]); wraps around when the data is exhausted. Training
// uses Megatron's shuffled order (GPTDataset, data/gpt_dataset.h); this stays for
// library users who want the plain order.
class SequentialSamples : public SampleSource {
 public:
  SequentialSamples(std::shared_ptr<IndexedDataset> ds, int64_t seq_length);
  void sample(int64_t index, int32_t* out) const override;
  int64_t seq_length() const override { return S_; }

 private:
  std::shared_ptr<IndexedDataset> ds_;
  int64_t S_;
  std::vector<int64_t> seq_start_token_;  // cumulative token offset of each sequence
  int64_t total_tokens_ = 0;
};

// Megatron's --mock-data: synthetic documents, deterministic in the index.
class MockSamples : public SampleSource {
 public:
  MockSamples(int64_t vocab_size, int64_t seq_length, uint64_t seed);
  void sample(int64_t index, int32_t* out) const override;
  int64_t seq_length() const override { return S_; }

 private:
  int64_t V_, S_;
  uint64_t seed_;
};

// Fills a micro-batch: tokens [B, S+1] from samples first_sample .. first_sample+B-1.
void fill_micro_batch(const SampleSource& src, int64_t first_sample, int64_t B, int32_t* tokens);

// A micro-batch's inputs: tokens [B, S+1]; from a source with extras also the loss mask [B, S] of the labels
// tokens[:, 1:] and the input positions' segments [B, S] (empty otherwise: the model's own masks apply).
struct MicroBatch {
  std::vector<int32_t> tokens;
  std::vector<float> loss_mask;
  std::vector<int32_t> segments;
  const float* loss_mask_or_null() const { return loss_mask.empty() ? nullptr : loss_mask.data(); }
  const int32_t* segments_or_null() const { return segments.empty() ? nullptr : segments.data(); }
};
void fill_micro_batch(const SampleSource& src, int64_t first_sample, int64_t B, MicroBatch* out);

}  // namespace lattice
