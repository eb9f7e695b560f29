// GPTDataset against the independent numpy reference (tests/fixtures/
// make_gpt_dataset_reference.py): MT19937 and numpy's shuffle, --split bookends, the
// document/sample/shuffle indices (public vector, multi-epoch, separately shuffled last
// epoch, empty sequences, split ranges, extreme seeds) and the samples themselves; the
// index cache (reuse, corruption, truncation, read-only directory).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "data/gpt_dataset.h"
#include "data/gpt_index_cache.h"
#include "data/numpy_random.h"
#include "test_ds_test_util.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;
using ds_test::expect_error;
using ds_test::reference;
using ds_test::temp_dir;
using ds_test::write_dataset;

TEST(DsNumpyRandom, MatchesNumpyRandomState) {
  NumpyRandomState rng{1234};
  const uint32_t first[5] = {822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u};
  for (uint32_t v : first) EXPECT_EQ(rng.next_uint32(), v);
  NumpyRandomState shuf{1234};
  std::vector<int> a(10);
  std::iota(a.begin(), a.end(), 0);
  shuf.shuffle(a.data(), 10);
  EXPECT_EQ(a, (std::vector<int>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
}

TEST(DsNumpyRandom, RandomIntervalStaysInRange) {
  NumpyRandomState rng{5};
  for (uint64_t max : {uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(1000), uint64_t(0xffffffff),
                       uint64_t(0x100000000ULL), uint64_t(0x123456789abULL)})
    for (int k = 0; k < 200; ++k) EXPECT_LE(rng.random_interval(max), max);
  EXPECT_EQ(rng.random_interval(0), 0u);
}

TEST(DsSplit, MatchesMegatronBookends) {
  for (const auto& c : reference()["split_cases"]) {
    const auto r = split_ranges(c["split"].get<std::string>(), c["num_sequences"].get<int64_t>());
    for (int i = 0; i < 3; ++i) {
      const auto& want = c["ranges"][i];
      SCOPED_TRACE(c["split"].get<std::string>() + " N=" + std::to_string(c["num_sequences"].get<int64_t>()) +
                   " split " + std::to_string(i));
      EXPECT_EQ(r[i].present, !want.is_null());
      if (!want.is_null()) {
        EXPECT_EQ(r[i].begin, want[0].get<int64_t>());
        EXPECT_EQ(r[i].end, want[1].get<int64_t>());
      }
    }
  }
}

TEST(DsSplit, RejectsMalformedSplits) {
  for (const char* bad : {"", "a,b", "1,2,3,4", "0,0,0", "-1,2", "1,,2", "1e3"})
    expect_error([&] { split_ranges(bad, 10); }, {"--split"});
}

// The dataset of a reference case, written to a temp dir.
std::shared_ptr<IndexedDataset> case_dataset(const nlohmann::json& c, const std::string& dir) {
  return std::make_shared<IndexedDataset>(
      write_dataset(dir + "/data", c["sequence_lengths"].get<std::vector<int32_t>>()));
}

SplitRange case_range(const nlohmann::json& c) {
  return SplitRange{true, c["range"][0].get<int64_t>(), c["range"][1].get<int64_t>()};
}

void expect_matches_reference(const GPTDataset& ds, const nlohmann::json& c) {
  const GPTDatasetIndices& x = ds.indices();
  EXPECT_EQ(x.num_epochs, c["num_epochs"].get<int64_t>());
  EXPECT_EQ(x.separate_final_epoch, c["separate_final_epoch"].get<bool>());
  EXPECT_EQ(x.document_index, c["document_index"].get<std::vector<int32_t>>());
  EXPECT_EQ(x.sample_index, c["sample_index"].get<std::vector<int64_t>>());
  EXPECT_EQ(x.shuffle_index, c["shuffle_index"].get<std::vector<int64_t>>());
  std::vector<int32_t> got(size_t(ds.seq_length() + 1));
  int64_t i = 0;
  for (const auto& want : c["samples"]) {
    ds.sample(i, got.data());
    EXPECT_EQ(got, want.get<std::vector<int32_t>>()) << "sample " << i;
    ++i;
  }
  EXPECT_GT(i, 0);
}

GPTDatasetConfig case_config(const nlohmann::json& c, const std::string& cache) {
  GPTDatasetConfig cfg;
  cfg.seq_length = c["seq_length"].get<int64_t>();
  cfg.random_seed = c["seed"].get<uint64_t>();
  cfg.path_to_cache = cache;
  return cfg;
}

TEST(DsGPTDataset, MatchesNumpyReference) {
  for (const auto& c : reference()["dataset_cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string dir = temp_dir() + "/" + c["name"].get<std::string>();
    fs::create_directories(dir);
    auto ds = case_dataset(c, dir);
    // The split range is computed, not copied from the fixture.
    const auto ranges = split_ranges(c["split"].get<std::string>(), ds->num_sequences());
    const SplitRange range = ranges[c["split_index"].get<int>()];
    EXPECT_EQ(range.begin, case_range(c).begin);
    EXPECT_EQ(range.end, case_range(c).end);
    GPTDataset g(ds, Split(c["split_index"].get<int>()), range, c["num_samples"].get<int64_t>(),
                 case_config(c, dir + "/cache"));
    EXPECT_FALSE(g.loaded_from_cache());
    EXPECT_GE(g.size(), c["num_samples"].get<int64_t>());
    expect_matches_reference(g, c);
  }
}

TEST(DsGPTDataset, PublicVector) {
  // reference/megatron.md: sizes [5,3,7,2,6,4,9,1,8,5], S=8, 5 samples, seed 1234.
  const std::vector<int32_t> sizes{5, 3, 7, 2, 6, 4, 9, 1, 8, 5};
  const auto x = build_gpt_dataset_indices(sizes, SplitRange{true, 0, 10}, 5, 8, 1234, "public");
  EXPECT_EQ(x.document_index, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(x.sample_index, (std::vector<int64_t>{0, 0, 2, 0, 4, 0, 5, 3, 6, 3, 8, 1, 9, 0}));
  EXPECT_EQ(x.shuffle_index, (std::vector<int64_t>{5, 0, 3, 4, 2, 1}));
  // One epoch (--full-validation, Megatron's num_samples None): 50 tokens make (50 - 1) / 8 = 6
  // samples, one epoch, so the same indices as 5 samples asked for.
  const auto epoch = build_gpt_dataset_indices(sizes, SplitRange{true, 0, 10}, kOneEpoch, 8, 1234, "public");
  EXPECT_EQ(epoch.num_epochs, 1);
  EXPECT_EQ(epoch.document_index, x.document_index);
  EXPECT_EQ(epoch.sample_index, x.sample_index);
  EXPECT_EQ(epoch.shuffle_index, x.shuffle_index);
  // A longer run needs two epochs and indexes more than one epoch's samples.
  EXPECT_EQ(build_gpt_dataset_indices(sizes, SplitRange{true, 0, 10}, 7, 8, 1234, "public").num_epochs, 2);
  expect_error([&] { build_gpt_dataset_indices({3, 2}, SplitRange{true, 0, 2}, kOneEpoch, 8, 1234, "p (valid split)"); },
               {"p (valid split)", "5 tokens", "--seq-length 8"});
  const std::string dir = temp_dir();
  auto ds = std::make_shared<IndexedDataset>(write_dataset(dir + "/p", sizes));
  GPTDatasetConfig cfg;
  cfg.seq_length = 8;
  cfg.path_to_cache = dir + "/cache";
  GPTDataset g(ds, Split::train, SplitRange{true, 0, 10}, 5, cfg);
  std::vector<int32_t> s0(9), want;
  g.sample(0, s0.data());
  for (int p = 1; p < 9; ++p) want.push_back(ds_test::ref_token(6, p));  // sequence 6 [1:9]
  want.push_back(ds_test::ref_token(3, 0));                               // + sequence 3 [0:1]
  EXPECT_EQ(s0, want);
  expect_error([&] { g.sample(6, s0.data()); }, {"sample 6", "out of range"});
}

TEST(DsGPTDataset, RejectsSplitWithoutTokensAndLargeSeeds) {
  const std::vector<int32_t> sizes{4, 0, 0, 3};
  expect_error([&] { build_gpt_dataset_indices(sizes, SplitRange{true, 1, 3}, 10, 4, 1, "p (valid split)"); },
               {"p (valid split)", "no tokens", "--split"});
  expect_error([&] { build_gpt_dataset_indices(sizes, SplitRange{true, 2, 2}, 1, 4, 1, "p (test split)"); },
               {"p (test split)", "no tokens"});
  expect_error([&] { build_gpt_dataset_indices(sizes, SplitRange{true, 0, 4}, 1, 4, 1ULL << 32, "p"); },
               {"--seed", "2^32"});
}

class DsIndexCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    c_ = &reference()["dataset_cases"][1];  // multi-epoch
    ds_ = case_dataset(*c_, dir_);
    cfg_ = case_config(*c_, dir_ + "/cache");
  }
  std::unique_ptr<GPTDataset> make() {
    return std::make_unique<GPTDataset>(ds_, Split::train, case_range(*c_), (*c_)["num_samples"].get<int64_t>(), cfg_);
  }
  std::string dir_;
  const nlohmann::json* c_ = nullptr;
  std::shared_ptr<IndexedDataset> ds_;
  GPTDatasetConfig cfg_;
};

TEST_F(DsIndexCache, IsReusedAndNamedByItsParameters) {
  auto first = make();
  ASSERT_FALSE(first->cache_file().empty());
  EXPECT_TRUE(fs::exists(first->cache_file()));
  EXPECT_NE(first->cache_file().find("-GPTDataset-train-indices.bin"), std::string::npos);
  auto second = make();
  EXPECT_TRUE(second->loaded_from_cache());
  EXPECT_EQ(second->cache_file(), first->cache_file());
  expect_matches_reference(*second, *c_);
  // Another seed is another file.
  cfg_.random_seed += 1;
  auto other = make();
  EXPECT_FALSE(other->loaded_from_cache());
  EXPECT_NE(other->cache_file(), first->cache_file());
  // No temporary files are left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/cache")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 2);
}

TEST_F(DsIndexCache, CorruptedFileIsDetectedAndRebuilt) {
  const auto first = make();
  const std::string file = first->cache_file(), desc = first->description();
  const auto size = fs::file_size(file);
  {  // flip bits of one byte of the shuffle index
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char b = 0;
    f.seekg(std::streamoff(size - 5));
    f.read(&b, 1);
    b = char(b ^ 0x5a);
    f.seekp(std::streamoff(size - 5));
    f.write(&b, 1);
  }
  const auto verdict = read_gpt_index_cache(file, desc);
  EXPECT_EQ(verdict.status, IndexCacheRead::invalid);
  EXPECT_NE(verdict.reason.find("checksum"), std::string::npos) << verdict.reason;
  auto rebuilt = make();
  EXPECT_FALSE(rebuilt->loaded_from_cache());
  expect_matches_reference(*rebuilt, *c_);
  EXPECT_EQ(read_gpt_index_cache(file, desc).status, IndexCacheRead::ok);  // rewritten
}

TEST_F(DsIndexCache, TruncatedOrForeignFileIsRejected) {
  const auto first = make();
  const std::string file = first->cache_file(), desc = first->description();
  fs::resize_file(file, fs::file_size(file) - 8);
  auto verdict = read_gpt_index_cache(file, desc);
  EXPECT_EQ(verdict.status, IndexCacheRead::invalid);
  EXPECT_NE(verdict.reason.find("size"), std::string::npos) << verdict.reason;
  auto rebuilt = make();
  EXPECT_FALSE(rebuilt->loaded_from_cache());
  expect_matches_reference(*rebuilt, *c_);
  // A file written for other parameters under this name is not used.
  EXPECT_EQ(read_gpt_index_cache(file, desc + " ").status, IndexCacheRead::invalid);
  std::ofstream(file, std::ios::trunc) << "not an index";
  EXPECT_EQ(read_gpt_index_cache(file, desc).status, IndexCacheRead::invalid);
  EXPECT_EQ(read_gpt_index_cache(file + ".absent", desc).status, IndexCacheRead::missing);
}

TEST_F(DsIndexCache, UnwritableCacheDirectoryStillWorks) {
  std::ofstream(dir_ + "/blocker") << "a file where the cache directory should be";
  cfg_.path_to_cache = dir_ + "/blocker/cache";
  auto g = make();
  EXPECT_TRUE(g->cache_file().empty());
  expect_matches_reference(*g, *c_);
}

}  // namespace
}  // namespace lattice
