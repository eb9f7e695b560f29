// Megatron's GPTDataset: the train/valid/test split of an indexed dataset (by
// sequence), and the three indices that fix the sample order, built exactly as
// Megatron builds them (docs/data-format.md, "Sample order"):
//   document_index [E*N]     E shuffled copies of the split's sequence ids (int32)
//   sample_index   [n+1, 2]  (position in document_index, token offset) where sample k
//                            starts; sample k = tokens from row k to row k+1, inclusive
//   shuffle_index  [n]       permutation of the n samples
// with one numpy RandomState(seed) shared, in that order, by all the shuffles.
// Training sample i is sample shuffle_index[i]: S+1 tokens (inputs [0:S], labels [1:S+1]).
// The indices are cached in a file named by a hash of everything they depend on.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "data/indexed_dataset.h"

namespace lattice {

enum class Split { train = 0, valid = 1, test = 2 };
const char* split_name(Split s);        // "train", "valid", "test"
Split parse_split_name(const std::string& name, const char* flag);

// One split's sequences [begin, end). present == false when the split's weight is 0
// (Megatron builds no dataset for it).
struct SplitRange {
  bool present = false;
  int64_t begin = 0, end = 0;
};

// Megatron's --split "a,b,c" (1 to 3 non-negative numbers, missing ones 0): weights
// normalised, cumulative bookends, and begin/end = round-half-to-even(bookend * N).
std::array<SplitRange, 3> split_ranges(const std::string& split, int64_t num_sequences);

// num_samples asking for one epoch (Megatron's None, --full-validation's validation split):
// E = 1, the (T - 1) / S samples of the split's sequences taken once.
constexpr int64_t kOneEpoch = -1;

// The indices (no I/O). Built for at least num_samples samples: the epoch count E is
// the smallest with E*T >= num_samples*S + 1, and all (E*T - 1) / S samples are indexed.
struct GPTDatasetIndices {
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  std::vector<int32_t> document_index;  // [E*N]
  std::vector<int64_t> sample_index;    // [(n+1)*2]
  std::vector<int64_t> shuffle_index;   // [n]
  int64_t num_samples() const { return int64_t(shuffle_index.size()); }
};

// sequence_lengths: the whole dataset's; the split is sequences [range.begin, range.end).
// Fails (naming `what`) when the split holds no tokens or the seed is not below 2^32.
GPTDatasetIndices build_gpt_dataset_indices(const std::vector<int32_t>& sequence_lengths,
                                            const SplitRange& range, int64_t num_samples,
                                            int64_t seq_length, uint64_t seed,
                                            const std::string& what);

struct GPTDatasetConfig {
  int64_t seq_length = 0;
  uint64_t random_seed = 1234;
  std::string path_to_cache;  // --data-cache-path; empty: <dir of the prefix>/cache/GPTDataset_indices
};

class GPTDataset : public SampleSource {
 public:
  // Loads the indices from the cache when a valid file is there, else builds them and
  // writes the cache (a corrupted cache file is reported and rebuilt, never used).
  GPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split, const SplitRange& range,
             int64_t num_samples, const GPTDatasetConfig& config);

  // Samples available, >= the num_samples asked for (with kOneEpoch: the epoch's).
  int64_t size() const override { return indices_.num_samples(); }
  void sample(int64_t index, int32_t* out) const override;
  int64_t seq_length() const override { return S_; }

  const GPTDatasetIndices& indices() const { return indices_; }
  const std::string& cache_file() const { return cache_file_; }  // empty: not cached
  bool loaded_from_cache() const { return loaded_from_cache_; }
  std::string description() const { return description_; }

 private:
  std::shared_ptr<const IndexedDataset> ds_;
  Split split_;
  int64_t S_;
  GPTDatasetIndices indices_;
  std::string description_, cache_file_;
  bool loaded_from_cache_ = false;
};

}  // namespace lattice
