// Megatron's TikTokenizer (see tiktoken_tokenizer.h).
#include "data/tiktoken_tokenizer.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace lattice {

namespace {

using json = nlohmann::json;

// Megatron's PATTERN_TIKTOKEN (v1) and PATTERN_TIKTOKEN_V2.
constexpr const char* kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr const char* kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

// Standard base64 (RFC 4648, padded); false on anything else.
bool base64_decode(const std::string& s, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out->clear();
  if (s.size() % 4 != 0) return false;
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=') : 0;
    if (pad == 1 && s[i + 2] == '=') return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = k >= 4 - pad ? 0 : value(s[i + size_t(k)]);
      if (d < 0) return false;
      v = (v << 6) | uint32_t(d);
    }
    out->push_back(char(v >> 16));
    if (pad < 2) out->push_back(char((v >> 8) & 0xFF));
    if (pad < 1) out->push_back(char(v & 0xFF));
  }
  return true;
}

}  // namespace

const char* TikTokenizer::pattern_regex(const std::string& name) {
  if (name == "v1") return kPatternV1;
  if (name == "v2") return kPatternV2;
  LATTICE_FAIL() << "--tiktoken-pattern must be v1 or v2 (Megatron's two patterns), got '" << name << "'";
}

TikTokenizer::TikTokenizer(const std::string& path, const std::string& pattern, int64_t vocab_size,
                           int64_t num_special_tokens, const std::vector<std::string>& special_tokens)
    : vocab_size_(vocab_size > 0 ? vocab_size : int64_t(1) << 17) {
  const int64_t S = num_special_tokens;
  if (S < 3 || S >= vocab_size_ || vocab_size_ > INT32_MAX)
    LATTICE_FAIL() << "--tiktoken-num-special-tokens " << S << " must be at least 3 and below --vocab-size "
                   << vocab_size_;
  regex_ = std::make_unique<Regex>(pattern_regex(pattern), "--tiktoken-pattern " + pattern);

  // Special tokens: the given ones (with <unk>, <s>, </s>), then <SPECIAL_k> fillers up to S.
  special_ = special_tokens.empty() ? std::vector<std::string>{"<unk>", "<s>", "</s>"} : special_tokens;
  const std::set<std::string> unique(special_.begin(), special_.end());
  if (unique.size() != special_.size()) LATTICE_FAIL() << "--tiktoken-special-tokens: a token is given twice";
  for (const char* needed : {"<unk>", "<s>", "</s>"})
    if (!unique.count(needed)) LATTICE_FAIL() << "--tiktoken-special-tokens must include <unk>, <s> and </s>";
  if (int64_t(special_.size()) > S)
    LATTICE_FAIL() << "--tiktoken-special-tokens: " << special_.size() << " tokens, more than --tiktoken-num-special-tokens "
                   << S;
  for (int64_t k = int64_t(special_.size()); k < S; ++k) special_.push_back("<SPECIAL_" + std::to_string(k) + ">");
  for (int64_t k = 0; k < S; ++k)
    if (special_[size_t(k)] == "</s>") eod_ = int32_t(k);

  // The vocabulary: the first V - S ranks of the file.
  const std::string where = "--tokenizer-model " + path;
  json j;
  try {
    j = json::parse(read_tokenizer_file(path, where));
  } catch (const json::parse_error& e) {
    LATTICE_FAIL() << where << ": not valid JSON (byte " << e.byte << ")";
  }
  if (!j.is_array())
    LATTICE_FAIL() << where << ": expected a JSON list of {\"rank\", \"token_bytes\", \"token_str\"} (Megatron's "
                   << "TikTokenizer vocabulary)";
  const int64_t inner = vocab_size_ - S;
  if (int64_t(j.size()) < inner)
    LATTICE_FAIL() << where << ": " << j.size() << " tokens, fewer than --vocab-size " << vocab_size_
                   << " minus --tiktoken-num-special-tokens " << S << " (" << inner << ")";
  bpe_.reserve(size_t(inner), size_t(inner) * 4);
  std::vector<std::string> tokens(static_cast<size_t>(inner));
  std::string bytes;
  for (int64_t i = 0; i < inner; ++i) {
    const json& e = j[size_t(i)];
    const std::string at = where + ": entry " + std::to_string(i);
    if (!e.is_object() || e.size() != 3 || !e.contains("rank") || !e.contains("token_bytes") || !e.contains("token_str"))
      LATTICE_FAIL() << at << ": expected exactly the keys rank, token_bytes and token_str";
    if (!e["rank"].is_number_integer() || e["rank"].get<int64_t>() != i)
      LATTICE_FAIL() << at << ": rank is " << e["rank"].dump() << ", expected " << i << " (the entries in rank order)";
    if (!e["token_bytes"].is_string() || !base64_decode(e["token_bytes"].get<std::string>(), &bytes) || bytes.empty())
      LATTICE_FAIL() << at << ": token_bytes is not non-empty base64";
    if (i < 256 && bytes != std::string(1, char(i)))
      LATTICE_FAIL() << at << ": the first 256 tokens must be the single bytes 0..255 in order";
    if (bpe_.find(bytes) >= 0) LATTICE_FAIL() << at << ": token_bytes repeats an earlier token's";
    bpe_.add_token(int32_t(S + i), bytes);
    tokens[size_t(i)] = bytes;
  }
  if (const int missing = bpe_.index_bytes(); missing >= 0)
    LATTICE_FAIL() << where << ": no token for byte " << missing;
  // tiktoken's merge: adjacent parts whose concatenation is a token, lowest rank first. Every
  // split of a token into two tokens is a merge with the token's rank.
  for (int64_t r = 256; r < inner; ++r) {
    const std::string& t = tokens[size_t(r)];
    for (size_t k = 1; k < t.size(); ++k) {
      const int32_t a = bpe_.find(std::string_view(t).substr(0, k)), b = bpe_.find(std::string_view(t).substr(k));
      if (a >= 0 && b >= 0) bpe_.add_merge_ranked(a, b, int32_t(S + r), uint32_t(r));
    }
  }
  bpe_.set_whole_piece_first(true);
}

TikTokenizer::~TikTokenizer() = default;

void TikTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  regex_->find_all(text, &matches);
  size_t done = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > done) bpe_.encode_piece(text.substr(done, begin - done), out);  // bytes no pattern matches
    bpe_.encode_piece(text.substr(begin, end - begin), out);
    done = end;
  }
  if (done < text.size()) bpe_.encode_piece(text.substr(done), out);
}

std::vector<int32_t> TikTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, &ids);
  return ids;
}

std::string TikTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && id < int32_t(special_.size()))
      text += special_[size_t(id)];
    else if (bpe_.has_id(id))
      text += bpe_.bytes_of(id);
    else
      LATTICE_FAIL() << "TikTokenizer: cannot decode id " << id << " (the vocabulary is 0.." << vocab_size_ - 1 << ")";
  }
  return text;
}

}  // namespace lattice
