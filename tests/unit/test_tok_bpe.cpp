// GPT2BPETokenizer on a small hand-made vocab/merges pair: merge order against a literal
// transcription of OpenAI's encoder.py bpe(), round trips, and every bad-file error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt2_bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lattice;

namespace {

using test_util::byte_char;
using test_util::spell;

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o.push_back('\\');
    o.push_back(c);
  }
  return o;
}

struct Fixture {
  std::string dir, vocab, merges;
};

// Merges in rank order (raw bytes of the two parts); the vocab holds the 256 bytes (ids = byte
// values), the merge results in order, then <|endoftext|>.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"a", "b"}, {"b", "c"}, {"ab", "c"}, {"a", "a"}, {" ", "t"}, {"c", "a"}, {"aa", "a"}, {"ca", "b"}, {" t", "ab"}};

using test_util::temp_dir;

using test_util::write_text;

std::string vocab_json(const std::vector<std::string>& tokens_bytes, bool with_eod = true) {
  std::string j = "{";
  for (size_t i = 0; i < tokens_bytes.size(); ++i)
    j += (i ? ", \"" : "\"") + json_escape(spell(tokens_bytes[i])) + "\": " + std::to_string(i);
  if (with_eod) j += ", \"<|endoftext|>\": " + std::to_string(tokens_bytes.size());
  return j + "}";
}

std::vector<std::string> fixture_tokens() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
  for (const auto& [l, r] : kMerges) t.push_back(l + r);
  return t;
}

std::string merges_txt(const std::vector<std::pair<std::string, std::string>>& merges) {
  std::string m = "#version: 0.2\n";
  for (const auto& [l, r] : merges) m += spell(l) + " " + spell(r) + "\n";
  return m;
}

Fixture make_fixture() {
  Fixture f{temp_dir(), "", ""};
  f.vocab = f.dir + "/vocab.json";
  f.merges = f.dir + "/merges.txt";
  write_text(f.vocab, vocab_json(fixture_tokens()));
  write_text(f.merges, merges_txt(kMerges));
  return f;
}

// encoder.py's bpe(), transcribed: repeatedly take the lowest-ranked adjacent pair and merge
// every occurrence of it, left to right.
std::vector<std::string> reference_bpe(const std::string& piece) {
  std::map<std::pair<std::string, std::string>, size_t> ranks;
  for (size_t i = 0; i < kMerges.size(); ++i) ranks[kMerges[i]] = i;
  std::vector<std::string> word;
  for (char c : piece) word.push_back(std::string(1, c));
  while (word.size() > 1) {
    size_t best = SIZE_MAX;
    std::pair<std::string, std::string> bigram;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && it->second < best) best = it->second, bigram = it->first;
    }
    if (best == SIZE_MAX) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == bigram.first && word[i + 1] == bigram.second) {
        merged.push_back(bigram.first + bigram.second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = merged;
  }
  return word;
}

std::string error_of(const std::string& vocab, const std::string& merges) {
  try {
    GPT2BPETokenizer tok(vocab, merges);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error";
  return "";
}

#define EXPECT_HAS(msg, piece) EXPECT_NE((msg).find(piece), std::string::npos) << "'" << (piece) << "' not in: " << (msg)

}  // namespace

TEST(TokBpe, MergesLowestRankFirstLeftmostOnTies) {
  const Fixture f = make_fixture();
  GPT2BPETokenizer tok(f.vocab, f.merges);
  EXPECT_EQ(tok.vocab_size(), 256 + int64_t(kMerges.size()) + 1);
  EXPECT_EQ(tok.eod(), 256 + int32_t(kMerges.size()));
  EXPECT_EQ(tok.num_merges(), int64_t(kMerges.size()));
  const auto id = [&](const std::string& bytes) {
    const auto t = fixture_tokens();
    return int32_t(std::find(t.begin(), t.end(), bytes) - t.begin());
  };
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{id("abc")}));
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{id("aaa")}));            // aa a -> aaa
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{id("aa"), id("aa")}));  // left to right
  EXPECT_EQ(tok.encode("cab"), (std::vector<int32_t>{id("c"), id("ab")}));    // (a,b) outranks (c,a)
  EXPECT_EQ(tok.encode(" tab"), (std::vector<int32_t>{id(" tab")}));
}

TEST(TokBpe, HeapMergeMatchesEncoderPyOnRandomWords) {
  const Fixture f = make_fixture();
  GPT2BPETokenizer tok(f.vocab, f.merges);
  const auto tokens = fixture_tokens();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string w;
    const int n = 1 + int(rng() % 24);
    for (int i = 0; i < n; ++i) w.push_back("abct "[rng() % 5]);
    std::vector<int32_t> got;
    tok.bpe(w, &got);
    std::vector<int32_t> want;
    for (const std::string& s : reference_bpe(w))
      want.push_back(int32_t(std::find(tokens.begin(), tokens.end(), s) - tokens.begin()));
    ASSERT_EQ(got, want) << "word '" << w << "'";
  }
}

TEST(TokBpe, DecodeInvertsEncodeOnArbitraryBytes) {
  const Fixture f = make_fixture();
  GPT2BPETokenizer tok(f.vocab, f.merges);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = int(rng() % 300);
    for (int i = 0; i < n; ++i) s.push_back(char(rng() % 4 == 0 ? rng() % 256 : "abc t'\n\xc3\xa9"[rng() % 10]));
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  EXPECT_EQ(tok.decode({tok.eod()}), "<|endoftext|>");
  EXPECT_TRUE(tok.encode("").empty());
  try {
    tok.decode({int32_t(tok.vocab_size())});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "outside the vocabulary");
  }
}

TEST(TokBpe, CacheBelongsToOneTokenizer) {
  // Two tokenizers with different merges on one thread: the piece cache must not leak between them.
  const Fixture f = make_fixture();
  GPT2BPETokenizer a(f.vocab, f.merges);
  write_text(f.dir + "/few.txt", merges_txt({{"a", "b"}}));
  GPT2BPETokenizer b(f.vocab, f.dir + "/few.txt");
  EXPECT_EQ(a.encode("abc").size(), 1u);
  EXPECT_EQ(b.encode("abc").size(), 2u);
  EXPECT_EQ(a.encode("abc").size(), 1u);
}

TEST(TokBpe, MissingFilesNameTheFlag) {
  const Fixture f = make_fixture();
  std::string msg = error_of(f.dir + "/nope.json", f.merges);
  EXPECT_HAS(msg, "--vocab-file " + f.dir + "/nope.json: cannot open");
  msg = error_of(f.vocab, f.dir + "/nope.txt");
  EXPECT_HAS(msg, "--merge-file " + f.dir + "/nope.txt: cannot open");
  try {
    make_tokenizer({"GPT2BPETokenizer", "", f.merges});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "--vocab-file is required");
  }
  try {
    make_tokenizer({"GPT2BPETokenizer", f.vocab, ""});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "--merge-file is required");
  }
}

TEST(TokBpe, BadVocabFiles) {
  const Fixture f = make_fixture();
  const std::string v = f.dir + "/bad.json";
  write_text(v, "{\"a\": 0,");
  EXPECT_HAS(error_of(v, f.merges), "--vocab-file " + v + ": not valid JSON");
  write_text(v, "[1, 2]");
  EXPECT_HAS(error_of(v, f.merges), "expected a JSON object");
  write_text(v, vocab_json(fixture_tokens(), false));
  EXPECT_HAS(error_of(v, f.merges), "no '<|endoftext|>' token");
  auto tokens = fixture_tokens();
  tokens[200] = "ab" + std::string(1, char(200));  // byte 200 has no token any more
  write_text(v, vocab_json(tokens));
  EXPECT_HAS(error_of(v, f.merges), "no token for byte 200");
  write_text(v, "{\"a\": 0, \"b\": 0}");
  EXPECT_HAS(error_of(v, f.merges), "id 0 is used twice");
  write_text(v, "{\"a\": 5}");
  EXPECT_HAS(error_of(v, f.merges), "outside 0..0");
  write_text(v, "{\"a\": \"x\"}");
  EXPECT_HAS(error_of(v, f.merges), "expected an integer");
  write_text(v, "{\"\xe4\xb8\x80\": 0}");  // U+4E00 is not in the byte alphabet
  EXPECT_HAS(error_of(v, f.merges), "outside GPT-2's byte-to-unicode alphabet");
}

TEST(TokBpe, VocabAndMergesThatDoNotMatch) {
  const Fixture f = make_fixture();
  const std::string m = f.dir + "/other.txt";
  write_text(m, merges_txt({{"a", "b"}, {"x", "y"}}));  // "xy" is not in the vocab
  std::string msg = error_of(f.vocab, m);
  EXPECT_HAS(msg, "--merge-file " + m + " line 3");
  EXPECT_HAS(msg, "'xy' is not a token of --vocab-file");
  EXPECT_HAS(msg, "do not belong together");
  write_text(m, "#version: 0.2\nab\n");
  EXPECT_HAS(error_of(f.vocab, m), "line 2: expected '<left> <right>'");
  write_text(m, "#version: 0.2\na b\na b\n");
  EXPECT_HAS(error_of(f.vocab, m), "line 3: merge 'a b' appears twice");
  write_text(m, "#version: 0.2\n");
  EXPECT_HAS(error_of(f.vocab, m), "no merges");
  // The vocab of another tokenizer: a merge result it lacks.
  const std::string v = f.dir + "/small.json";
  auto tokens = fixture_tokens();
  tokens.resize(256);
  write_text(v, vocab_json(tokens));
  EXPECT_HAS(error_of(v, f.merges), "'ab' is not a token of --vocab-file");
}
