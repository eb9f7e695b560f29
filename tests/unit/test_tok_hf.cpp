// HuggingFaceTokenizer on small tokenizer.json files written here: each pre-tokenizer and split
// behaviour against HuggingFace's documented examples, added tokens (longest match, lstrip and
// rstrip), the template, ignore_merges against merging, both merge formats, decoding, the eos
// lookup, and every refused or malformed component naming its key. The comparison with
// HuggingFace's own implementation on real vocabularies is tests/e2e/test_hf_tokenizer.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace lattice;
using Ids = std::vector<int32_t>;

namespace {

using test_util::byte_char;
using test_util::spell;

// Ids 0..255: the bytes; then the words, from 256 on.
const std::vector<std::string> kWords = {"the", "-", "final", "countdown", "the-", "final-", "-final", "-countdown",
                                         "--", "ab", "abc", " x", "12", "123", "b "};
int32_t word(const std::string& w) {
  for (size_t i = 0; i < kWords.size(); ++i)
    if (kWords[i] == w) return int32_t(256 + i);
  ADD_FAILURE() << "no word " << w;
  return -1;
}
Ids bytes_of(const std::string& s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}
Ids cat(std::initializer_list<Ids> parts) {
  Ids all;
  for (const Ids& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// A byte-level BPE tokenizer.json: every byte, the words, merges a+b -> ab and ab+c -> abc,
// ignore_merges, no pre-tokenizer, ByteLevel decoder, two added tokens.
json base_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < kWords.size(); ++i) vocab[spell(kWords[i])] = 256 + i;
  json added = json::array();
  added.push_back({{"id", 300}, {"content", "<eos>"}, {"special", true}, {"lstrip", false}, {"rstrip", false},
                   {"single_word", false}, {"normalized", false}});
  added.push_back({{"id", 301}, {"content", "<eos><eos>"}, {"special", true}, {"lstrip", false}, {"rstrip", false},
                   {"single_word", false}, {"normalized", false}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"byte_fallback", false},
            {"ignore_merges", true},
            {"vocab", vocab},
            {"merges", json::array({"a b", json::array({"ab", "c"})})}}}};
}

json split(const std::string& regex, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", invert}};
}

// Writes the folder (tokenizer.json, tokenizer_config.json naming eos) and loads it.
std::unique_ptr<HuggingFaceTokenizer> load(const json& tok, const json& config = {{"eos_token", "<eos>"}}) {
  const std::string dir = test_util::temp_dir();
  std::ofstream(fs::path(dir) / "tokenizer.json") << tok.dump();
  if (!config.is_null()) std::ofstream(fs::path(dir) / "tokenizer_config.json") << config.dump();
  return std::make_unique<HuggingFaceTokenizer>(dir);
}

// The error message of loading `tok`, or "" when it loads.
std::string load_error(const json& tok, const json& config = {{"eos_token", "<eos>"}}) {
  try {
    load(tok, config);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokHf, SplitBehavioursAsHuggingFaceDocuments) {
  // HuggingFace's documentation of SplitDelimiterBehavior, "the-final--countdown" on "-".
  const std::string text = "the-final--countdown";
  auto ids = [&](const std::string& behavior) {
    json t = base_tokenizer();
    t["pre_tokenizer"] = split("-", behavior);
    return load(t)->encode(text);
  };
  const int32_t dash = word("-");
  EXPECT_EQ(ids("Removed"), (Ids{word("the"), word("final"), word("countdown")}));
  EXPECT_EQ(ids("Isolated"), (Ids{word("the"), dash, word("final"), dash, dash, word("countdown")}));
  EXPECT_EQ(ids("MergedWithPrevious"), (Ids{word("the-"), word("final-"), dash, word("countdown")}));
  EXPECT_EQ(ids("MergedWithNext"), (Ids{word("the"), word("-final"), dash, word("-countdown")}));
  EXPECT_EQ(ids("Contiguous"), (Ids{word("the"), dash, word("final"), word("--"), word("countdown")}));
  // invert: the pattern matches the pieces, the rest is the delimiter.
  json t = base_tokenizer();
  t["pre_tokenizer"] = split("[a-z]+", "Removed", true);
  EXPECT_EQ(load(t)->encode(text), (Ids{word("the"), word("final"), word("countdown")}));
  // A String pattern is literal: "." is a dot, not any character.
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_EQ(load(t)->encode("the.final"), (Ids{word("the"), word("final")}));
}

TEST(TokHf, SequenceDigitsAndByteLevel) {
  json t = base_tokenizer();
  // Digits individually, then GPT-2's regex: "abc123 x" -> abc, 1, 2, 3, " x".
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  EXPECT_EQ(load(t)->encode("abc123 x"), (Ids{word("abc"), '1', '2', '3', word(" x")}));
  t["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = false;  // runs of digits
  EXPECT_EQ(load(t)->encode("abc123 x"), (Ids{word("abc"), word("123"), word(" x")}));
  // add_prefix_space: a space before a text that does not start with one.
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(load(t)->encode("x"), (Ids{word(" x")}));
  EXPECT_EQ(load(t)->encode(" x"), (Ids{word(" x")}));
  // Without the regex, ByteLevel does not cut: the whole text is one piece, merged across the space.
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(load(t)->encode("b abc"), (Ids{'b', ' ', word("abc")}));
  t["model"]["merges"].push_back(json::array({"b", byte_char(' ')}));
  EXPECT_EQ(load(t)->encode("b abc"), (Ids{word("b "), word("abc")}));
}

TEST(TokHf, IgnoreMergesAgainstMerging) {
  json t = base_tokenizer();
  // "abc" merges a+b -> ab, then ab+c -> abc; "the" has no merges: bytes, unless ignore_merges.
  EXPECT_EQ(load(t)->encode("the"), (Ids{word("the")}));
  t["model"]["ignore_merges"] = false;
  EXPECT_EQ(load(t)->encode("the"), bytes_of("the"));
  EXPECT_EQ(load(t)->encode("abc"), (Ids{word("abc")}));
  EXPECT_EQ(load(t)->encode("cab"), (Ids{'c', word("ab")}));
  // Without the second merge, abc stays ab + c.
  t["model"]["merges"] = json::array({"a b"});
  EXPECT_EQ(load(t)->encode("abc"), (Ids{word("ab"), 'c'}));
}

TEST(TokHf, AddedTokensLongestFirstWithStrip) {
  json t = base_tokenizer();
  auto tok = load(t);
  // The longest added token at the leftmost place; the text around is encoded on its own.
  EXPECT_EQ(tok->encode("ab<eos><eos><eos>the"), (Ids{word("ab"), 301, 300, word("the")}));
  EXPECT_EQ(tok->encode("<eos"), bytes_of("<eos"));
  // rstrip/lstrip: the white space beside the token is taken with it.
  t["added_tokens"][0]["rstrip"] = true;
  EXPECT_EQ(load(t)->encode("ab <eos>  the"), cat({{word("ab"), ' ', 300}, {word("the")}}));
  t["added_tokens"][0]["lstrip"] = true;
  EXPECT_EQ(load(t)->encode("ab <eos>  the"), (Ids{word("ab"), 300, word("the")}));
  EXPECT_EQ(tok->eod(), 300);
  EXPECT_EQ(tok->vocab_size(), 302);
}

TEST(TokHf, TemplateAroundEveryText) {
  json t = base_tokenizer();
  t["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"trim_offsets", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<eos><eos>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                             {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}})},
                     {"special_tokens",
                      {{"<eos><eos>", {{"id", "<eos><eos>"}, {"ids", {301}}, {"tokens", {"<eos><eos>"}}}},
                       {"<eos>", {{"id", "<eos>"}, {"ids", {300}}, {"tokens", {"<eos>"}}}}}}}})}};
  auto tok = load(t);
  EXPECT_EQ(tok->encode("ab"), (Ids{301, word("ab"), 300}));
  EXPECT_EQ(tok->encode(""), (Ids{301, 300}));
  std::vector<int32_t> out = {7};
  tok->encode_append("the", &out);
  EXPECT_EQ(out, (Ids{7, 301, word("the"), 300}));
  // add_special_tokens=False (a chat template's text, which writes them): no template ids; added
  // tokens in the text are still found.
  EXPECT_EQ(tok->encode_without_specials("ab"), (Ids{word("ab")}));
  EXPECT_EQ(tok->encode_without_specials("<eos>ab"), (Ids{300, word("ab")}));
  EXPECT_EQ(tok->encode_without_specials(""), (Ids{}));
}

TEST(TokHf, DecodeBytesAndAddedTokens) {
  json t = base_tokenizer();
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto tok = load(t);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(char(b));
  const std::string text = "the <eos>" + all_bytes + "abc  x\n";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_EQ(tok->decode({word("countdown"), 301}), "countdown<eos><eos>");
  EXPECT_THROW(tok->decode({302}), Error);
  EXPECT_THROW(tok->decode({-1}), Error);
}

TEST(TokHf, FileOrFolderAndTheEosLookup) {
  const std::string dir = test_util::temp_dir();
  std::ofstream(fs::path(dir) / "tokenizer.json") << base_tokenizer().dump();
  // No tokenizer_config.json: special_tokens_map.json's eos_token (an object form).
  std::ofstream(fs::path(dir) / "special_tokens_map.json") << R"({"eos_token": {"content": "<eos><eos>"}})";
  EXPECT_EQ(HuggingFaceTokenizer(dir).eod(), 301);
  EXPECT_EQ(HuggingFaceTokenizer(dir + "/tokenizer.json").eod(), 301);
  EXPECT_EQ(make_tokenizer({"HuggingFaceTokenizer", "", "", dir})->eod(), 301);
  // tokenizer_config.json comes first; its eos may be an ordinary token of the vocabulary.
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << R"({"eos_token": "countdown"})";
  EXPECT_EQ(HuggingFaceTokenizer(dir).eod(), word("countdown"));
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << R"({"eos_token": "<nothing>"})";
  try {
    HuggingFaceTokenizer tok(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token '<nothing>' is not a token"), std::string::npos)
        << e.what();
  }
}

TEST(TokHf, RefusedComponentsNameTheirKey) {
  struct Case {
    const char* what;
    std::function<void(json&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"normalizer", [](json& t) { t["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer Lowercase is not supported"},
      {"normalizer in a sequence",
       [](json& t) { t["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Strip"}}}}}; },
       "normalizer.normalizers[0]: normalizer Strip is not supported"},
      {"Llama 2's normalizers",
       [](json& t) {
         t["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}}, {{"type", "Replace"}}}}};
       },
       "a Sequence of 2 normalizers is not supported"},
      {"model type", [](json& t) { t["model"]["type"] = "WordPiece"; }, "model.type is WordPiece"},
      {"dropout", [](json& t) { t["model"]["dropout"] = 0.1; }, "model.dropout is set"},
      {"byte fallback", [](json& t) { t["model"]["byte_fallback"] = true; }, "model.byte_fallback is true"},
      {"subword prefix", [](json& t) { t["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix is set"},
      {"pre-tokenizer", [](json& t) { t["pre_tokenizer"] = {{"type", "Metaspace"}}; },
       "pre_tokenizer: pre-tokenizer Metaspace is not supported"},
      {"nested pre-tokenizer",
       [](json& t) {
         t["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split("-", "Isolated"), {{"type", "Whitespace"}}})}};
       },
       "pre_tokenizer.pretokenizers[1]: pre-tokenizer Whitespace"},
      {"split behaviour", [](json& t) { t["pre_tokenizer"] = split("-", "Sideways"); },
       "pre_tokenizer.behavior: unknown 'Sideways'"},
      {"bad regex", [](json& t) { t["pre_tokenizer"] = split("(a", "Isolated"); }, "pre_tokenizer.pattern: regex '(a' does not compile"},
      {"prefix space after a split",
       [](json& t) {
         t["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({split("-", "Isolated"), {{"type", "ByteLevel"}, {"add_prefix_space", true}}})}};
       },
       "add_prefix_space after another pre-tokenizer"},
      {"post-processor", [](json& t) { t["post_processor"] = {{"type", "RobertaProcessing"}}; },
       "post-processor RobertaProcessing is not supported"},
      {"template id", [](json& t) {
         t["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
                                {"special_tokens", json::object()}};
       },
       "special_tokens: no ids for '<s>'"},
      {"decoder", [](json& t) { t["decoder"] = {{"type", "Metaspace"}}; }, "decoder is Metaspace"},
      {"single word", [](json& t) { t["added_tokens"][0]["single_word"] = true; }, "'<eos>': single_word is not supported"},
      {"vocab token outside the alphabet", [](json& t) { t["model"]["vocab"]["a b"] = 400; }, "token 'a b' (id 400)"},
      {"missing byte", [](json& t) { t["model"]["vocab"].erase(byte_char(7)); }, "no token for byte 7"},
      {"id used twice", [](json& t) { t["model"]["vocab"]["the"] = 5; }, "id 5 is used twice"},
      {"merge not in the vocab", [](json& t) { t["model"]["merges"].push_back("x y"); }, "model.merges[2]: 'xy' is not a token"},
      {"malformed merge", [](json& t) { t["model"]["merges"].push_back("abc"); }, "model.merges[2] is 'abc'"},
      {"no vocab", [](json& t) { t["model"].erase("vocab"); }, "model.vocab is missing"},
  };
  for (const Case& c : cases) {
    json t = base_tokenizer();
    c.change(t);
    const std::string msg = load_error(t);
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << (msg.empty() ? "(loaded)" : msg);
    EXPECT_NE(msg.find("--tokenizer-model"), std::string::npos) << c.what << ": " << msg;
  }
  // No eos_token anywhere.
  EXPECT_NE(load_error(base_tokenizer(), nullptr).find("no eos_token"), std::string::npos);
}

namespace {
const std::string kComposed = "caf\xC3\xA9", kDecomposed = "cafe\xCC\x81";  // café as NFC and as NFD
}  // namespace

TEST(TokHf, UnicodeNormalizersAsHuggingFace) {
  const std::string ligature = "\xEF\xAC\x81";  // U+FB01, the fi ligature
  auto with = [&](const json& normalizer) {
    json t = base_tokenizer();
    t["normalizer"] = normalizer;
    return load(t);
  };
  EXPECT_EQ(with({{"type", "NFC"}})->encode(kDecomposed), bytes_of(kComposed));
  EXPECT_EQ(with({{"type", "NFC"}})->encode(ligature), bytes_of(ligature));  // NFC keeps compatibility characters
  EXPECT_EQ(with({{"type", "NFD"}})->encode(kComposed), bytes_of(kDecomposed));
  EXPECT_EQ(with({{"type", "NFKC"}})->encode(ligature + kDecomposed), bytes_of("fi" + kComposed));
  EXPECT_EQ(with({{"type", "NFKD"}})->encode(kComposed + ligature), bytes_of(kDecomposed + "fi"));
  // A Sequence of one normalizer is that normalizer; without one the text is taken as given.
  EXPECT_EQ(with({{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}})->encode(kDecomposed), bytes_of(kComposed));
  EXPECT_EQ(with(nullptr)->encode(kDecomposed), bytes_of(kDecomposed));
  // Text that is already normalized, ASCII or not, encodes as without a normalizer.
  const std::string text = "the-final " + kComposed + " \xE6\x97\xA5\xE6\x9C\xAC";
  EXPECT_EQ(with({{"type", "NFC"}})->encode(text), with(nullptr)->encode(text));
}

TEST(TokHf, NormalizedAddedTokensAreFoundInTheNormalizedText) {
  json t = base_tokenizer();
  t["normalizer"] = {{"type", "NFC"}};
  // 302: not special and so normalized (HuggingFace's default), written decomposed: it is found as
  // its NFC form in the normalized text. 303: "normalized": false, written decomposed: found in the
  // text as given, before the normalization.
  t["added_tokens"].push_back({{"id", 302}, {"content", kDecomposed}, {"special", false}});
  t["added_tokens"].push_back({{"id", 303}, {"content", "x" + kDecomposed}, {"special", true}, {"normalized", false}});
  const auto tok = load(t);
  EXPECT_EQ(tok->encode(kComposed), Ids{302});
  EXPECT_EQ(tok->encode(kDecomposed), Ids{302});
  EXPECT_EQ(tok->encode("x" + kDecomposed), Ids{303});
  EXPECT_EQ(tok->encode("x" + kComposed), cat({bytes_of("x"), {302}}));
  EXPECT_EQ(tok->encode("<eos>x" + kDecomposed + kComposed), (Ids{300, 303, 302}));
  EXPECT_EQ(tok->decode({302, 303}), kDecomposed + "x" + kDecomposed);  // added tokens decode as written
}
