// The train/valid/test sample sources of a run, as Megatron's
// BlendedMegatronDatasetBuilder makes them from --data-path (one prefix, or a blend
// "w1 p1 w2 p2 ..." split by --split) or --train-/--valid-/--test-data-path (a blend
// per split, each using its whole datasets), or --mock-data.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_batches.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "train/arguments.h"

namespace lattice {

// Megatron's sample counts: train = train_iters * GBS (or --train-samples);
// valid = (train_iters / eval_interval + 1) * eval_iters * GBS (every evaluation
// during training plus the one at the end); test = eval_iters * GBS.
struct SampleCounts {
  int64_t train = 0, valid = 0, test = 0;
};
SampleCounts megatron_sample_counts(int64_t train_iters, int64_t train_samples, int64_t eval_interval,
                                    int64_t eval_iters, int64_t global_batch_size);

// "[w1] p1 [w2 p2 ...]": one prefix, weight/prefix pairs, or prefixes without weights (no word a
// number; Megatron blends those by their sizes, one epoch of each).
struct BlendSpec {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // empty: no weights
};
BlendSpec parse_blend(const std::vector<std::string>& list, const char* flag);

// --multiple-validation-sets' sets: --valid-data-path's prefixes, one set each. Fails on an empty
// list and on a weight (an entry that is a number): each set is evaluated alone, unblended.
std::vector<std::string> validation_set_prefixes(const std::vector<std::string>& valid_data_path);

struct TrainingData {
  // valid/test are null when that split is not built (no samples asked for, a split
  // weight of 0, or no --valid-/--test-data-path): that evaluation is skipped.
  std::shared_ptr<const SampleSource> train, valid, test;
  // --multiple-validation-sets: each --valid-data-path dataset alone, built as a validation
  // split of its own (Megatron's: each the whole file, the split's sample count); valid is
  // then null.
  std::vector<std::shared_ptr<const SampleSource>> valid_sets;
  SampleCounts counts;
  std::string summary;  // one line per split: what it reads and how many samples it holds
};

// Opens the datasets (checking every token id < vocab_size) and builds or loads the
// index caches. Throws lattice::Error naming the flag or file on bad input.
TrainingData make_training_data(const TrainArgs& args, int64_t vocab_size);

// One split alone, built for num_samples samples exactly as make_training_data builds
// it (`lattice data samples` uses this). Null when the split is not built. vocab_size
// 0 skips the token-id check (a full pass over the .bin files).
std::shared_ptr<const SampleSource> make_split_data(const TrainArgs& args, int64_t vocab_size,
                                                    Split split, int64_t num_samples,
                                                    std::string* summary = nullptr);

// The end-of-document token for --eod-mask-loss / --reset-position-ids /
// --reset-attention-mask: the tokenizer's, or V-1 for --mock-data (its documents end
// with V-1). -1 when none is known; fails when one of those flags needs it.
int32_t resolve_eod_token(const TrainArgs& args, const Tokenizer* tokenizer, int64_t vocab_size);

}  // namespace lattice
