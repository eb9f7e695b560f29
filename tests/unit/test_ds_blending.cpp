// BlendedDataset's greedy order and per-dataset sizes against the numpy reference and
// the public vector; blend parsing and its bad input.
#include <gtest/gtest.h>

#include "data/blended_dataset.h"
#include "data/training_data.h"
#include "test_ds_test_util.h"

namespace lattice {
namespace {

using ds_test::expect_error;
using ds_test::reference;

TEST(DsBlending, PublicVector) {
  // reference/megatron.md: weights [.5, .25, .25], 8 samples -> [0,1,2,0,0,1,2,0].
  BlendingIndex b(normalize_blend_weights({0.5, 0.25, 0.25}, "data-path"), 8);
  std::vector<int64_t> order;
  for (int64_t s = 0; s < 8; ++s) order.push_back(b.locate(s).first);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 2, 0}));
}

TEST(DsBlending, MatchesNumpyReference) {
  for (const auto& c : reference()["blend_cases"]) {
    const auto raw = c["weights"].get<std::vector<double>>();
    SCOPED_TRACE(c["weights"].dump());
    const auto w = normalize_blend_weights(raw, "data-path");
    EXPECT_EQ(w, c["normalized"].get<std::vector<double>>());  // bit-identical
    const int64_t size = c["size"].get<int64_t>();
    EXPECT_EQ(blend_samples_per_dataset(w, size), c["samples_per_dataset"].get<std::vector<int64_t>>());
    BlendingIndex b(w, size);
    const auto di = c["dataset_index"].get<std::vector<int64_t>>();
    const auto dsi = c["dataset_sample_index"].get<std::vector<int64_t>>();
    int mismatches = 0;
    for (int64_t s = 0; s < size; ++s) {
      const auto [d, k] = b.locate(s);
      if ((d != di[size_t(s)] || k != dsi[size_t(s)]) && ++mismatches <= 3)
        ADD_FAILURE() << "sample " << s << ": (" << d << ", " << k << "), expected (" << di[size_t(s)]
                      << ", " << dsi[size_t(s)] << ")";
    }
    for (int64_t d = 0; d < b.num_datasets(); ++d)
      EXPECT_LE(b.total_count(d), blend_samples_per_dataset(w, size)[size_t(d)]);
  }
}

TEST(DsBlending, ParsesWeightPrefixPairs) {
  const BlendSpec one = parse_blend({"data/a"}, "data-path");
  EXPECT_EQ(one.prefixes, (std::vector<std::string>{"data/a"}));
  EXPECT_TRUE(one.weights.empty());
  const BlendSpec two = parse_blend({"0.3", "a", "7", "b"}, "data-path");
  EXPECT_EQ(two.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(two.weights, (std::vector<double>{0.3, 7.0}));
  // Prefixes without weights (no word a number), even or odd in count: blended by their sizes.
  const BlendSpec listed = parse_blend({"data/a", "data/b", "data/c"}, "data-path");
  EXPECT_EQ(listed.prefixes, (std::vector<std::string>{"data/a", "data/b", "data/c"}));
  EXPECT_TRUE(listed.weights.empty());
  EXPECT_EQ(parse_blend({"a", "b"}, "data-path").prefixes.size(), 2u);
}

// --mid-level-dataset-surplus: each dataset is built for ceil(ceil(size * w) * (1 + surplus)) samples;
// the greedy order never takes more than ceil(size * w), so no surplus still suffices.
TEST(DsBlending, SurplusIsMegatronsMidLevelDatasetSurplus) {
  const std::vector<double> w = normalize_blend_weights({0.3, 0.7}, "data-path");
  EXPECT_EQ(blend_samples_per_dataset(w, 100), (std::vector<int64_t>{31, 71}));  // 30 x 1.005, 70 x 1.005
  EXPECT_EQ(blend_samples_per_dataset(w, 100, 0.5), (std::vector<int64_t>{45, 105}));
  for (const std::vector<double>& weights :
       {std::vector<double>{0.3, 0.7}, {1, 1, 1}, {0.01, 5, 0.2, 3}, {1e-3, 1}}) {
    const std::vector<double> nw = normalize_blend_weights(weights, "data-path");
    for (int64_t size : {1, 7, 100, 1001}) {
      const std::vector<int64_t> none = blend_samples_per_dataset(nw, size, 0.0);
      const BlendingIndex b(nw, size);
      for (int64_t d = 0; d < b.num_datasets(); ++d) EXPECT_LE(b.total_count(d), none[size_t(d)]) << size << " " << d;
    }
  }
}

TEST(DsBlending, RejectsBadWeights) {
  expect_error([] { parse_blend({"0", "a", "1", "b"}, "data-path"); }, {"--data-path", "weight 0", "positive"});
  expect_error([] { parse_blend({"1", "a", "-2", "b"}, "train-data-path"); }, {"--train-data-path", "weight -2"});
  // Some words numbers, some not: pairs were meant.
  expect_error([] { parse_blend({"x", "a", "1", "b"}, "data-path"); }, {"--data-path", "'x' is not a weight"});
  expect_error([] { parse_blend({"1", "a", "b"}, "valid-data-path"); }, {"--valid-data-path", "pairs"});
  expect_error([] { parse_blend({"nan", "a", "1", "b"}, "data-path"); }, {"--data-path", "positive"});
  expect_error([] { normalize_blend_weights({1.0, 0.0}, "test-data-path"); }, {"--test-data-path", "dataset 2"});
}

}  // namespace
}  // namespace lattice
