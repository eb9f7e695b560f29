// make_training_data: Megatron's sample counts, --data-path (one prefix / a blend) with
// --split, --train-/--valid-/--test-data-path, --mock-data, and bad input (missing .idx,
// a split with no samples, blend weights <= 0).
#include <gtest/gtest.h>

#include <filesystem>

#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/training_data.h"
#include "test_ds_test_util.h"

namespace lattice {
namespace {

using ds_test::expect_error;
using ds_test::temp_dir;
using ds_test::write_dataset;

std::vector<int32_t> lengths(int n, int seed) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(1 + (i * 37 + seed * 11) % 23);
  return v;
}

TrainArgs base_args(const std::string& dir) {
  TrainArgs a;
  a.seq_length = 8;
  a.global_batch_size = 4;
  a.micro_batch_size = 2;
  a.train_iters = 10;
  a.eval_interval = 4;
  a.eval_iters = 2;
  a.seed = 77;
  a.split = "8,1,1";
  a.data_cache_path = dir + "/cache";
  return a;
}

std::vector<int32_t> take(const SampleSource& s, int64_t i) {
  std::vector<int32_t> out(size_t(s.seq_length() + 1));
  s.sample(i, out.data());
  return out;
}

TEST(DsTrainingData, MegatronSampleCounts) {
  const SampleCounts c = megatron_sample_counts(100, 0, 30, 5, 8);
  EXPECT_EQ(c.train, 800);
  EXPECT_EQ(c.valid, (100 / 30 + 1) * 5 * 8);
  EXPECT_EQ(c.test, 40);
  const SampleCounts none = megatron_sample_counts(100, 0, 30, 0, 8);
  EXPECT_EQ(none.valid, 0);
  EXPECT_EQ(none.test, 0);
  EXPECT_EQ(megatron_sample_counts(0, 96, 5, 1, 8).train, 96);
}

TEST(DsTrainingData, SinglePrefixIsSplitLikeMegatron) {
  const std::string dir = temp_dir();
  const auto sizes = lengths(60, 1);
  const std::string p = write_dataset(dir + "/a", sizes);
  TrainArgs a = base_args(dir);
  a.data_path = {p};
  const TrainingData t = make_training_data(a, 1000);
  ASSERT_TRUE(t.train && t.valid && t.test);
  EXPECT_EQ(t.counts.train, 40);
  EXPECT_EQ(t.counts.valid, (10 / 4 + 1) * 2 * 4);
  EXPECT_EQ(t.counts.test, 8);
  auto ds = std::make_shared<IndexedDataset>(p);
  const auto ranges = split_ranges("8,1,1", 60);
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const GPTDataset train(ds, Split::train, ranges[0], 40, cfg), valid(ds, Split::valid, ranges[1], 24, cfg);
  for (int64_t i : {0, 1, 17, 39}) EXPECT_EQ(take(*t.train, i), take(train, i)) << i;
  for (int64_t i : {0, 5, 23}) EXPECT_EQ(take(*t.valid, i), take(valid, i)) << i;
  EXPECT_NE(t.summary.find("valid"), std::string::npos);
}

TEST(DsTrainingData, WeightedDataPathIsABlend) {
  const std::string dir = temp_dir();
  const std::string pa = write_dataset(dir + "/a", lengths(40, 2));
  const std::string pb = write_dataset(dir + "/b", lengths(70, 3));
  TrainArgs a = base_args(dir);
  a.data_path = {"0.25", pa, "0.75", pb};
  const TrainingData t = make_training_data(a, 1000);
  const auto* blend = dynamic_cast<const BlendedDataset*>(t.train.get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 40);
  // Each part is the GPTDataset Megatron builds: its own split, ceil(ceil(n*w)*1.005) samples.
  const auto w = normalize_blend_weights({0.25, 0.75}, "data-path");
  const auto per = blend_samples_per_dataset(w, 40);
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const GPTDataset ga(std::make_shared<IndexedDataset>(pa), Split::train, split_ranges("8,1,1", 40)[0], per[0], cfg);
  const GPTDataset gb(std::make_shared<IndexedDataset>(pb), Split::train, split_ranges("8,1,1", 70)[0], per[1], cfg);
  BlendingIndex order(w, 40);
  for (int64_t s = 0; s < 40; ++s) {
    const auto [d, k] = order.locate(s);
    EXPECT_EQ(take(*t.train, s), take(d == 0 ? static_cast<const SampleSource&>(ga) : gb, k)) << s;
  }
}

TEST(DsTrainingData, PerSplitDataPaths) {
  const std::string dir = temp_dir();
  const std::string pa = write_dataset(dir + "/a", lengths(30, 4));
  const std::string pb = write_dataset(dir + "/b", lengths(5, 5));
  TrainArgs a = base_args(dir);
  a.train_data_path = {pa};
  a.valid_data_path = {"1", pa, "1", pb};
  const TrainingData t = make_training_data(a, 1000);
  ASSERT_TRUE(t.train && t.valid);
  EXPECT_EQ(t.test, nullptr);  // no --test-data-path: no test evaluation
  // The train split uses every sequence of its dataset.
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const GPTDataset whole(std::make_shared<IndexedDataset>(pa), Split::train, SplitRange{true, 0, 30}, 40, cfg);
  for (int64_t i : {0, 9, 39}) EXPECT_EQ(take(*t.train, i), take(whole, i));
  EXPECT_NE(dynamic_cast<const BlendedDataset*>(t.valid.get()), nullptr);
  // One prefix with a weight is that dataset alone, built for the split's samples (Megatron's "blend
  // consists of a single prefix" for a split's own paths), not a blend of one.
  a.train_data_path = {"0.5", pa};
  const TrainingData weighted = make_training_data(a, 1000);
  EXPECT_EQ(dynamic_cast<const BlendedDataset*>(weighted.train.get()), nullptr);
  for (int64_t i : {0, 9, 39}) EXPECT_EQ(take(*weighted.train, i), take(whole, i));
  a.data_path = {pa};
  expect_error([&] { make_training_data(a, 1000); }, {"--data-path", "exclusive"});
}

// --multiple-validation-sets: each --valid-data-path dataset is a validation split of its own, the
// whole file with the split's sample count (what --valid-data-path with that prefix alone builds);
// no blended validation split.
TEST(DsTrainingData, MultipleValidationSetsAreEachDatasetAlone) {
  const std::string dir = temp_dir();
  const std::string pa = write_dataset(dir + "/a", lengths(30, 4));
  const std::string pb = write_dataset(dir + "/b", lengths(7, 5));
  TrainArgs a = base_args(dir);
  a.train_data_path = {pa};
  a.valid_data_path = {pa, pb};
  a.multiple_validation_sets = true;
  const TrainingData t = make_training_data(a, 1000);
  EXPECT_EQ(t.valid, nullptr);
  ASSERT_EQ(t.valid_sets.size(), 2u);
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const int64_t n = (10 / 4 + 1) * 2 * 4;
  const GPTDataset va(std::make_shared<IndexedDataset>(pa), Split::valid, SplitRange{true, 0, 30}, n, cfg);
  const GPTDataset vb(std::make_shared<IndexedDataset>(pb), Split::valid, SplitRange{true, 0, 7}, n, cfg);
  for (int64_t i : {int64_t(0), int64_t(5), n - 1}) {
    EXPECT_EQ(take(*t.valid_sets[0], i), take(va, i)) << i;
    EXPECT_EQ(take(*t.valid_sets[1], i), take(vb, i)) << i;
  }
  a.multiple_validation_sets = false;  // the same prefixes without the flag: one blended split
  a.valid_data_path = {pb};
  const TrainingData alone = make_training_data(a, 1000);
  ASSERT_TRUE(alone.valid && alone.valid_sets.empty());
  for (int64_t i : {int64_t(0), int64_t(5), n - 1}) EXPECT_EQ(take(*alone.valid, i), take(vb, i)) << i;
}

// --full-validation: the validation split (or each --multiple-validation-sets set) is one epoch of its
// dataset, built as Megatron's num_samples None, whatever --eval-iters says; --eval-iters 0 leaves
// it built (and the test split not). A blend of several datasets is refused naming its flag.
TEST(DsTrainingData, FullValidationIsOneEpochOfTheSplit) {
  const std::string dir = temp_dir();
  const std::string pa = write_dataset(dir + "/a", lengths(60, 3));
  const std::string pb = write_dataset(dir + "/b", lengths(9, 4));
  TrainArgs a = base_args(dir);
  a.data_path = {pa};
  a.full_validation = true;
  a.eval_iters = 0;
  const TrainingData t = make_training_data(a, 1000);
  ASSERT_TRUE(t.valid);
  EXPECT_EQ(t.test, nullptr);
  const SplitRange range = split_ranges(a.split, 60)[int(Split::valid)];
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const GPTDataset epoch(std::make_shared<IndexedDataset>(pa), Split::valid, range, kOneEpoch, cfg);
  int64_t tokens = 0;
  for (int64_t s = range.begin; s < range.end; ++s) tokens += lengths(60, 3)[size_t(s)];
  EXPECT_EQ(epoch.size(), (tokens - 1) / 8);
  ASSERT_EQ(t.valid->size(), epoch.size());
  for (int64_t i : {int64_t(0), epoch.size() / 2, epoch.size() - 1}) EXPECT_EQ(take(*t.valid, i), take(epoch, i)) << i;

  TrainArgs sets = base_args(dir);
  sets.train_data_path = {pa};
  sets.valid_data_path = {pa, pb};
  sets.multiple_validation_sets = sets.full_validation = true;
  const TrainingData ts = make_training_data(sets, 1000);
  ASSERT_EQ(ts.valid_sets.size(), 2u);
  int64_t b_tokens = 0;
  for (int32_t n : lengths(9, 4)) b_tokens += n;
  EXPECT_EQ(ts.valid_sets[1]->size(), (b_tokens - 1) / 8);

  a.data_path = {"1", pa, "2", pb};
  expect_error([&] { make_training_data(a, 1000); },
               {"--full-validation", "blends 2 datasets with weights", "--data-path"});
  sets.multiple_validation_sets = false;
  sets.valid_data_path = {"1", pa, "1", pb};
  expect_error([&] { make_training_data(sets, 1000); }, {"--full-validation", "--valid-data-path"});
  sets.valid_data_path = {"1", pb};  // one dataset with a weight is that dataset
  EXPECT_EQ(make_training_data(sets, 1000).valid->size(), (b_tokens - 1) / 8);
}

// Datasets given without weights (Megatron's "p1 p2 ..."): each split of each is one epoch, blended
// by their sizes for the samples the run reads; more than all of them is refused naming the flag.
TEST(DsTrainingData, DatasetsWithoutWeightsBlendByTheirSizes) {
  const std::string dir = temp_dir();
  const std::string pa = write_dataset(dir + "/a", lengths(60, 3));
  const std::string pb = write_dataset(dir + "/b", lengths(20, 4));
  TrainArgs a = base_args(dir);
  a.data_path = {pa, pb};
  a.train_iters = 5;  // 20 samples
  a.eval_iters = 1;   // validation (5 / 4 + 1) x 4 = 8 samples, test 4: within one epoch of each split
  const TrainingData t = make_training_data(a, 1000);
  ASSERT_TRUE(t.train);
  const auto* blend = dynamic_cast<const BlendedDataset*>(t.train.get());
  ASSERT_NE(blend, nullptr);
  GPTDatasetConfig cfg{8, 77, dir + "/other-cache"};
  const SplitRange ra = split_ranges(a.split, 60)[0], rb = split_ranges(a.split, 20)[0];
  const GPTDataset ea(std::make_shared<IndexedDataset>(pa), Split::train, ra, kOneEpoch, cfg);
  const GPTDataset eb(std::make_shared<IndexedDataset>(pb), Split::train, rb, kOneEpoch, cfg);
  EXPECT_EQ(blend->size(), 20);
  // The greedy order of weights proportional to the epochs' sizes, each dataset's samples in its order.
  const BlendingIndex order(normalize_blend_weights({double(ea.size()), double(eb.size())}, "data-path"), 20);
  for (int64_t i = 0; i < 20; ++i) {
    const auto [d, k] = order.locate(i);
    EXPECT_EQ(take(*t.train, i), d == 0 ? take(ea, k) : take(eb, k)) << i;
  }
  EXPECT_GT(order.total_count(1), 0);
  a.train_iters = 1000;  // 4000 samples: more than one epoch of both
  expect_error([&] { make_training_data(a, 1000); }, {"--data-path", "2 datasets given without weights hold",
                                                      "train split, fewer than the 4000", "--train-iters"});
  a.train_iters = 5;
  a.eval_iters = 8;  // 64 validation samples
  expect_error([&] { make_training_data(a, 1000); }, {"valid split, fewer than the 64", "--eval-iters"});
  // --full-validation reads every sample of every listed dataset's split once.
  a.eval_iters = 1;
  a.full_validation = true;
  const TrainingData f = make_training_data(a, 1000);
  const SplitRange va = split_ranges(a.split, 60)[1], vb = split_ranges(a.split, 20)[1];
  const GPTDataset fa(std::make_shared<IndexedDataset>(pa), Split::valid, va, kOneEpoch, cfg);
  const GPTDataset fb(std::make_shared<IndexedDataset>(pb), Split::valid, vb, kOneEpoch, cfg);
  EXPECT_EQ(f.valid->size(), fa.size() + fb.size());
}

TEST(DsTrainingData, ZeroWeightSplitIsSkippedLikeMegatron) {
  const std::string dir = temp_dir();
  TrainArgs a = base_args(dir);
  a.data_path = {write_dataset(dir + "/a", lengths(20, 6))};
  a.split = "100,0,0";
  const TrainingData t = make_training_data(a, 1000);
  EXPECT_TRUE(t.train);
  EXPECT_EQ(t.valid, nullptr);
  EXPECT_EQ(t.test, nullptr);
  a.split = "0,1,0";
  expect_error([&] { make_training_data(a, 1000); }, {"--split 0,1,0", "train split weight 0"});
}

TEST(DsTrainingData, MockSplitsAreDifferentStreams) {
  TrainArgs a = base_args(temp_dir());
  a.mock_data = true;
  const TrainingData t = make_training_data(a, 64);
  ASSERT_TRUE(t.train && t.valid && t.test);
  EXPECT_NE(take(*t.train, 0), take(*t.valid, 0));
  EXPECT_NE(take(*t.valid, 0), take(*t.test, 0));
}

TEST(DsTrainingData, BadInput) {
  const std::string dir = temp_dir();
  const std::string p = write_dataset(dir + "/a", lengths(10, 7));
  TrainArgs a = base_args(dir);
  // A prefix whose .idx is missing.
  std::filesystem::remove(p + ".idx");
  a.data_path = {p};
  expect_error([&] { make_training_data(a, 1000); }, {p + ".idx", "cannot open"});
  // A split with no samples: 10 sequences, the default split gives valid [10, 10).
  const std::string q = write_dataset(dir + "/q", lengths(10, 8));
  a.data_path = {q};
  a.split = "969,30,1";
  expect_error([&] { make_training_data(a, 1000); }, {q, "valid split", "no tokens", "--eval-iters 0"});
  a.eval_iters = 0;  // no evaluation: the empty splits are not built
  EXPECT_NO_THROW(make_training_data(a, 1000));
  // Blend weights <= 0.
  a.data_path = {"1", q, "0", q};
  expect_error([&] { make_training_data(a, 1000); }, {"--data-path", "weight 0", "positive"});
  a.data_path = {"-1", q};
  expect_error([&] { make_training_data(a, 1000); }, {"--data-path", "weight -1"});
  // Token ids beyond the vocabulary.
  a.data_path = {q};
  expect_error([&] { make_training_data(a, 100); }, {q});
  a.split = "9,x";
  expect_error([&] { make_training_data(a, 1000); }, {"--split"});
}

TEST(DsTrainingData, EodToken) {
  TrainArgs a;
  a.mock_data = true;
  EXPECT_EQ(resolve_eod_token(a, nullptr, 64), 63);
  ByteTokenizer tok;
  a.mock_data = false;
  EXPECT_EQ(resolve_eod_token(a, &tok, 257), 256);
  EXPECT_EQ(resolve_eod_token(a, nullptr, 100), -1);
  a.eod_mask_loss = true;
  expect_error([&] { resolve_eod_token(a, nullptr, 100); }, {"--eod-mask-loss", "--tokenizer-type"});
}

}  // namespace
}  // namespace lattice
