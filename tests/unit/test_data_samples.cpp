// ByteTokenizer, SequentialSamples (document order, wrap-around), MockSamples, fill_micro_batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt_batches.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

std::string temp_prefix(const std::string& name) { return (fs::path(test_util::temp_dir()) / name).string(); }

// Sequences [0..4], [], [5..6], [7..11]: the concatenation is 0..11.
std::shared_ptr<IndexedDataset> counting_dataset() {
  const std::string p = temp_prefix("count");
  IndexedDatasetBuilder b(p, IndexDTypeCode::u16);
  std::vector<int32_t> all(12);
  std::iota(all.begin(), all.end(), 0);
  b.add_item(all.data(), 5);
  b.end_document();
  b.add_item(all.data(), 0);
  b.add_item(all.data() + 5, 2);
  b.end_document();
  b.add_item(all.data() + 7, 5);
  b.end_document();
  b.finalize();
  return std::make_shared<IndexedDataset>(p);
}

}  // namespace

TEST(DataTokenizer, ByteTokenizerRoundTrip) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eod(), 256);
  const std::string text = "h\xc3\xa9llo\n\x01\xff";
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{104, 0xc3, 0xa9, 108, 108, 111, 10, 1, 255}));
  EXPECT_EQ(tok.decode(ids), text);
  ids.push_back(256);
  ids.insert(ids.begin(), 256);
  ids.push_back(1000);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(DataTokenizer, Factory) {
  auto tok = make_tokenizer({"ByteTokenizer", "", ""});
  ASSERT_TRUE(tok);
  EXPECT_STREQ(tok->name(), "ByteTokenizer");
  try {
    make_tokenizer({"NoSuchTokenizer", "", ""});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer-type"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NoSuchTokenizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer({"GPT2BPETokenizer", "v.json", "m.txt"}), Error);
  // A file flag of another tokenizer is refused, naming it.
  EXPECT_THROW(make_tokenizer({"ByteTokenizer", "v.json", "", ""}), Error);
  EXPECT_THROW(make_tokenizer({"GPT2BPETokenizer", "v.json", "m.txt", "tok.json"}), Error);
  EXPECT_THROW(make_tokenizer({"HuggingFaceTokenizer", "", "", ""}), Error);
}

TEST(DataSamples, SequentialDocumentOrder) {
  SequentialSamples src(counting_dataset(), 3);
  EXPECT_EQ(src.seq_length(), 3);
  std::vector<int32_t> out(4);
  src.sample(0, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
  src.sample(1, out.data());  // crosses the empty sequence and a document boundary
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 5, 6}));
  src.sample(2, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{6, 7, 8, 9}));
}

TEST(DataSamples, SequentialWrapsAround) {
  SequentialSamples src(counting_dataset(), 5);
  std::vector<int32_t> out(6);
  src.sample(2, out.data());  // tokens 10, 11, then back to 0 ...
  EXPECT_EQ(out, (std::vector<int32_t>{10, 11, 0, 1, 2, 3}));
  src.sample(3, out.data());  // starts at 15 mod 12 = 3
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  // A sample longer than the whole dataset wraps more than once.
  SequentialSamples longer(counting_dataset(), 25);
  std::vector<int32_t> big(26);
  longer.sample(1, big.data());  // starts at 25 mod 12 = 1
  for (int i = 0; i < 26; ++i) EXPECT_EQ(big[i], (1 + i) % 12) << i;
  // Huge indices do not overflow.
  src.sample(int64_t(1) << 62, out.data());
  const int64_t start = int64_t(((unsigned __int128)(int64_t(1) << 62) * 5) % 12);
  EXPECT_EQ(out[0], start);
}

TEST(DataSamples, FillMicroBatch) {
  SequentialSamples src(counting_dataset(), 2);
  std::vector<int32_t> tokens(3 * 3);
  fill_micro_batch(src, 4, 3, tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{8, 9, 10, 10, 11, 0, 0, 1, 2}));
}

TEST(DataSamples, MockIsDeterministicAndInRange) {
  const int64_t V = 50, S = 16;
  MockSamples a(V, S, 1234), b(V, S, 1234), c(V, S, 99);
  std::vector<int32_t> x(S + 1), y(S + 1), z(S + 1), next(S + 1);
  bool any_diff = false;
  std::set<int32_t> seen;
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(7), int64_t(1) << 40}) {
    a.sample(i, x.data());
    b.sample(i, y.data());
    c.sample(i, z.data());
    EXPECT_EQ(x, y) << "sample " << i;
    any_diff |= x != z;
    for (int32_t t : x) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, V);
      seen.insert(t);
    }
    // Consecutive samples overlap by one token, as real ones do.
    a.sample(i + 1, next.data());
    EXPECT_EQ(x[S], next[0]);
  }
  EXPECT_TRUE(any_diff);
  EXPECT_GT(seen.size(), 5u);
  EXPECT_TRUE(seen.count(int32_t(V - 1)));  // documents end with eod = V-1
}

TEST(DataSamples, MockDocumentsAreArithmetic) {
  const int64_t V = 1000, S = 64;
  MockSamples m(V, S, 7);
  std::vector<int32_t> x(S + 1);
  m.sample(3, x.data());
  // Inside a document (no eod among three consecutive tokens) the step is constant.
  int checked = 0;
  for (int64_t t = 2; t < S; ++t) {
    if (x[t] == V - 1 || x[t - 1] == V - 1 || x[t - 2] == V - 1) continue;
    const int64_t d1 = (x[t - 1] - x[t - 2] + (V - 1)) % (V - 1), d2 = (x[t] - x[t - 1] + (V - 1)) % (V - 1);
    EXPECT_EQ(d1, d2) << "position " << t;
    EXPECT_GE(d1, 1);
    EXPECT_LE(d1, 4);
    ++checked;
  }
  EXPECT_GT(checked, 0);
}
