// TikTokenizer (Megatron's): the special-token layout, the vocabulary cut to --vocab-size, and
// the merge against a literal transcription of tiktoken's _byte_pair_merge on random vocabularies
// and words, decoding, and the one-line errors.
// tests/e2e/test_tiktoken_tokenizer.sh compares with tiktoken itself on cl100k's ranks.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "test_util.h"

using namespace lattice;
using lattice::test_util::error_of;

namespace {

std::string base64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    const uint32_t n = s.size() - i;
    uint32_t v = uint32_t(uint8_t(s[i])) << 16;
    if (n > 1) v |= uint32_t(uint8_t(s[i + 1])) << 8;
    if (n > 2) v |= uint32_t(uint8_t(s[i + 2]));
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += n > 1 ? k[(v >> 6) & 63] : '=';
    out += n > 2 ? k[v & 63] : '=';
  }
  return out;
}

// Writes Megatron's vocabulary file: the 256 bytes, then `longer` in rank order.
std::string write_vocab(const std::vector<std::string>& longer, const std::string& name = "vocab.json") {
  const std::string path = test_util::temp_dir() + "/" + name;
  std::ofstream f(path);
  f << "[";
  for (int i = 0; i < 256 + int(longer.size()); ++i) {
    const std::string t = i < 256 ? std::string(1, char(i)) : longer[size_t(i - 256)];
    f << (i ? "," : "") << "{\"rank\":" << i << ",\"token_bytes\":\"" << base64(t) << "\",\"token_str\":\"x\"}";
  }
  f << "]";
  return path;
}

TokenizerSpec spec(const std::string& vocab, int64_t S, int64_t V, std::vector<std::string> special = {},
                   const std::string& pattern = "v1") {
  TokenizerSpec s{"TikTokenizer", "", "", vocab, V};
  s.tiktoken_pattern = pattern;
  s.tiktoken_num_special_tokens = S;
  s.tiktoken_special_tokens = std::move(special);
  return s;
}

// tiktoken's _byte_pair_merge, written out: parts start at each byte; repeatedly merge the
// leftmost adjacent pair whose concatenation has the lowest rank.
std::vector<int32_t> reference_piece(const std::map<std::string, int32_t>& ranks, const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.push_back(std::string(1, c));
  for (;;) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (auto it = ranks.find(parts[i] + parts[i + 1]); it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    if (best == std::numeric_limits<int32_t>::max()) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  std::vector<int32_t> ids;
  for (const std::string& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

}  // namespace

TEST(TokTiktoken, SpecialTokensComeFirstAndTheRanksAfter) {
  const std::string vocab = write_vocab({"ab", "abc", "bc"});
  const auto tok = make_tokenizer(spec(vocab, 10, 10 + 259, {"<unk>", "<s>", "</s>", "<mask>"}));
  EXPECT_STREQ(tok->name(), "TikTokenizer");
  EXPECT_EQ(tok->vocab_size(), 269);
  EXPECT_EQ(tok->eod(), 2);
  EXPECT_EQ(tok->encode("abc"), std::vector<int32_t>{10 + 257});  // a piece that is a token
  EXPECT_EQ(tok->encode("a"), std::vector<int32_t>{10 + 'a'});
  EXPECT_EQ(tok->decode({0, 1, 2, 3, 4, 9, 10 + 'x', 10 + 256}), "<unk><s></s><mask><SPECIAL_4><SPECIAL_9>xab");
  EXPECT_EQ(tok->encode("</s>"), tok->encode(std::string("</") + "s>"));  // text, not the special id
  EXPECT_NE(error_of([&] { tok->decode({269}); }).find("id 269"), std::string::npos);
  // --vocab-size cuts the ranks: with 257 of them, "abc" (rank 257) is gone and "ab" + "c" remain.
  const auto cut = make_tokenizer(spec(vocab, 10, 10 + 257));
  EXPECT_EQ(cut->encode("abc"), (std::vector<int32_t>{10 + 256, 10 + 'c'}));
  // Megatron's defaults: 1000 special ids (<unk> <s> </s> first), 131072 in all.
  const std::string big = write_vocab(std::vector<std::string>(0), "big.json");
  EXPECT_NE(error_of([&] { make_tokenizer(spec(big, 0, 0)); }).find("fewer than --vocab-size 131072"), std::string::npos);
}

TEST(TokTiktoken, MergesAsTiktokenOnRandomVocabularies) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 20; ++trial) {
    // Random tokens over a, b, c (lengths 2..5), in random rank order.
    std::vector<std::string> longer;
    std::map<std::string, int32_t> ranks;
    for (int b = 0; b < 256; ++b) ranks[std::string(1, char(b))] = b;
    for (int k = 0; k < 60; ++k) {
      std::string t;
      const int len = 2 + int(gen() % 4);
      for (int i = 0; i < len; ++i) t += char('a' + gen() % 3);
      if (ranks.emplace(t, 256 + int32_t(longer.size())).second) longer.push_back(t);
    }
    const std::string vocab = write_vocab(longer);
    const auto tok = make_tokenizer(spec(vocab, 3, 3 + 256 + int64_t(longer.size())));
    for (int w = 0; w < 200; ++w) {
      std::string word;
      const int len = 1 + int(gen() % 12);
      for (int i = 0; i < len; ++i) word += char('a' + gen() % 3);
      std::vector<int32_t> want = reference_piece(ranks, word);
      for (int32_t& id : want) id += 3;
      ASSERT_EQ(tok->encode(word), want) << "trial " << trial << " word " << word;
    }
  }
}

TEST(TokTiktoken, TokensWithSeveralSplitsMergeAsTiktoken) {
  // "aba" is both ab + a and a + ba; "abab" is ab + ab and aba + b.
  const std::string vocab = write_vocab({"ab", "ba", "aba", "abab"});
  const auto tok = make_tokenizer(spec(vocab, 3, 3 + 260));
  std::map<std::string, int32_t> ranks;
  for (int b = 0; b < 256; ++b) ranks[std::string(1, char(b))] = b;
  ranks["ab"] = 256, ranks["ba"] = 257, ranks["aba"] = 258, ranks["abab"] = 259;
  for (const char* word : {"ababa", "abaaba", "baaba", "abbaab"}) {
    std::vector<int32_t> want = reference_piece(ranks, word);
    for (int32_t& id : want) id += 3;
    EXPECT_EQ(tok->encode(word), want) << word;
  }
}

TEST(TokTiktoken, ErrorsNameTheFlagOrTheFile) {
  const std::string vocab = write_vocab({"ab"});
  auto expect = [](const std::string& msg, std::initializer_list<const char*> parts) {
    EXPECT_FALSE(msg.empty());
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  expect(error_of([&] { make_tokenizer(spec(vocab, 3, 260, {}, "v3")); }), {"--tiktoken-pattern", "v3"});
  expect(error_of([&] { make_tokenizer(spec(vocab, 3, 260, {"<unk>", "<s>"})); }), {"--tiktoken-special-tokens", "</s>"});
  expect(error_of([&] { make_tokenizer(spec(vocab, 3, 260, {"<unk>", "<s>", "</s>", "<s>"})); }), {"twice"});
  expect(error_of([&] { make_tokenizer(spec(vocab, 3, 260, {"<unk>", "<s>", "</s>", "<x>"})); }),
         {"4 tokens, more than --tiktoken-num-special-tokens 3"});
  expect(error_of([&] { make_tokenizer(spec(vocab, 2, 260)); }), {"--tiktoken-num-special-tokens 2"});
  expect(error_of([&] { make_tokenizer(spec(vocab, 3, 3 + 258)); }), {"vocab.json", "257 tokens, fewer than"});
  TokenizerSpec no_pattern = spec(vocab, 3, 260);
  no_pattern.tiktoken_pattern.clear();
  expect(error_of([&] { make_tokenizer(no_pattern); }), {"--tiktoken-pattern v1|v2 is required"});
  TokenizerSpec other = spec("", 0, 0, {"<unk>"}, "");
  other.type = "ByteTokenizer";
  expect(error_of([&] { make_tokenizer(other); }), {"--tiktoken-special-tokens", "does not apply"});
}
