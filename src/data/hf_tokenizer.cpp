// HuggingFaceTokenizer: loading tokenizer.json (and the eos_token beside it), encode, decode.
#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "core/error.h"
#include "data/gpt2_pretokenizer.h"

namespace lattice {

namespace {

// ICU's normalizer for the form (a process-wide instance ICU owns).
const icu::Normalizer2& icu_normalizer(HuggingFaceTokenizer::Normalization form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case HuggingFaceTokenizer::Normalization::nfc: n = icu::Normalizer2::getNFCInstance(err); break;
    case HuggingFaceTokenizer::Normalization::nfd: n = icu::Normalizer2::getNFDInstance(err); break;
    case HuggingFaceTokenizer::Normalization::nfkc: n = icu::Normalizer2::getNFKCInstance(err); break;
    case HuggingFaceTokenizer::Normalization::nfkd: n = icu::Normalizer2::getNFKDInstance(err); break;
    case HuggingFaceTokenizer::Normalization::none: break;
  }
  if (!n || U_FAILURE(err)) LATTICE_FAIL() << "HuggingFaceTokenizer: ICU's Unicode normalizer is not available: " << u_errorName(err);
  return *n;
}

// `text` in the normalization form, into *out; false (and *out untouched) when it already is.
bool normalize_utf8(const icu::Normalizer2& n, std::string_view text, std::string* out) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return false;  // ASCII is in every normalization form
  UErrorCode err = U_ZERO_ERROR;
  const icu::StringPiece piece(text.data(), int32_t(text.size()));
  if (n.isNormalizedUTF8(piece, err) && U_SUCCESS(err)) return false;
  err = U_ZERO_ERROR;
  out->clear();
  icu::StringByteSink<std::string> sink(out);
  n.normalizeUTF8(0, piece, sink, nullptr, err);
  if (U_FAILURE(err)) LATTICE_FAIL() << "HuggingFaceTokenizer: Unicode normalization failed: " << u_errorName(err);
  return true;
}

}  // namespace

namespace fs = std::filesystem;
using json = nlohmann::json;

// How a Split step treats what its pattern matches (the delimiters), as HuggingFace's
// SplitDelimiterBehavior.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct HuggingFaceTokenizer::Step {
  std::unique_ptr<Regex> regex;  // null: GPT-2's pattern (ByteLevel's use_regex), Isolated
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;

  // Cuts `piece` and appends the non-empty parts to *out.
  void split(std::string_view piece, std::vector<std::string_view>* out) const {
    if (!regex) {
      for (size_t pos = 0, end = 0; pos < piece.size(); pos = end) {
        end = gpt2_piece_end(piece, pos);
        out->push_back(piece.substr(pos, end - pos));
      }
      return;
    }
    // The piece as (range, is delimiter) covering it, as HuggingFace's find_matches.
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    struct Part {
      size_t begin, end;
      bool delim;
    };
    thread_local std::vector<Part> parts, merged;
    matches.clear();
    parts.clear();
    regex->find_all(piece, &matches);
    size_t prev = 0;
    for (auto [s, e] : matches) {
      if (s > prev) parts.push_back({prev, s, invert});
      parts.push_back({s, e, !invert});
      prev = e;
    }
    if (prev < piece.size()) parts.push_back({prev, piece.size(), invert});
    merged.clear();
    bool previous_delim = false;
    switch (behavior) {
      case SplitBehavior::kIsolated:
        merged = parts;
        break;
      case SplitBehavior::kRemoved:
        for (const Part& p : parts)
          if (!p.delim) merged.push_back(p);
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Part& p : parts) {
          if (p.delim && !previous_delim && !merged.empty()) merged.back().end = p.end;
          else merged.push_back(p);
          previous_delim = p.delim;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (size_t i = parts.size(); i-- > 0;) {
          const Part& p = parts[i];
          if (p.delim && !previous_delim && !merged.empty()) merged.back().begin = p.begin;
          else merged.push_back(p);
          previous_delim = p.delim;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case SplitBehavior::kContiguous:
        for (size_t i = 0; i < parts.size(); ++i) {
          const Part& p = parts[i];
          if (i > 0 && p.delim == previous_delim) merged.back().end = p.end;
          else merged.push_back(p);
          previous_delim = p.delim;
        }
        break;
    }
    for (const Part& p : merged)
      if (p.end > p.begin) out->push_back(piece.substr(p.begin, p.end - p.begin));
  }
};

namespace {

json parse_json_file(const std::string& path, const std::string& what) {
  try {
    return json::parse(read_tokenizer_file(path, what));
  } catch (const json::parse_error& e) {
    LATTICE_FAIL() << what << ": not valid JSON (byte " << e.byte << ")";
  }
}

// The type of a component object ({"type": ...}), or "" for null.
std::string type_of(const json& j, const std::string& where) {
  if (j.is_null()) return "";
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    LATTICE_FAIL() << where << ": expected an object with a \"type\"";
  return j["type"].get<std::string>();
}

bool flag_of(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) LATTICE_FAIL() << where << "." << key << ": expected true or false";
  return j[key].get<bool>();
}

const std::string& string_of(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    LATTICE_FAIL() << where << "." << key << ": missing or not a string";
  return j[key].get_ref<const std::string&>();
}

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  LATTICE_FAIL() << where << ".behavior: unknown '" << name
                 << "' (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous)";
}

}  // namespace

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) {
  std::error_code ec;
  const fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  const std::string where = "--tokenizer-model " + file.string();
  // A SentencePiece model beside (or instead of) tokenizer.json is read by Llama2Tokenizer.
  const bool sentencepiece_beside = fs::exists(file.parent_path() / "tokenizer.model", ec);
  const char* use_sentencepiece = "; its tokenizer.model is read by --tokenizer-type Llama2Tokenizer";
  if (!fs::exists(file, ec))
    LATTICE_FAIL() << "--tokenizer-model " << path << ": no such file"
                   << (file.string() != path ? " (no tokenizer.json in the folder)" : "")
                   << (sentencepiece_beside ? use_sentencepiece : "");
  const json j = parse_json_file(file.string(), where);
  if (!j.is_object()) LATTICE_FAIL() << where << ": expected a JSON object (HuggingFace's tokenizer.json)";

  // The model: byte-level BPE.
  const json& model = j.contains("model") ? j["model"] : json();
  if (!model.is_object()) LATTICE_FAIL() << where << ": no \"model\" object (HuggingFace's tokenizer.json)";
  const std::string model_type = model.value("type", std::string("BPE"));
  if (model_type != "BPE")
    LATTICE_FAIL() << where << ": model.type is " << model_type << "; lattice reads byte-level BPE tokenizers only";
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0))
    LATTICE_FAIL() << where << ": model.dropout is set; BPE dropout samples its merges, which a data pipeline must not";
  if (flag_of(model, "byte_fallback", false, where + ": model"))
    LATTICE_FAIL() << where << ": model.byte_fallback is true (a SentencePiece-style vocabulary"
                   << (sentencepiece_beside ? use_sentencepiece : "") << "); lattice reads "
                   << "byte-level BPE tokenizers only";
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      LATTICE_FAIL() << where << ": model." << key << " is set; lattice reads byte-level BPE tokenizers only";
  bpe_.set_whole_piece_first(flag_of(model, "ignore_merges", false, where + ": model"));

  // Added tokens (their ids may also be in the vocabulary, GPT-2's <|endoftext|> is).
  int64_t max_id = -1;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) LATTICE_FAIL() << where << ": added_tokens is not a list";
    for (const json& t : j["added_tokens"]) {
      const std::string at = where + ": added_tokens entry";
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() > INT32_MAX)
        LATTICE_FAIL() << at << " " << t.dump().substr(0, 80) << ": needs a non-negative integer id";
      const std::string& content = string_of(t, "content", at);
      if (content.empty()) LATTICE_FAIL() << at << " " << t["id"] << ": empty content";
      if (flag_of(t, "single_word", false, at))
        LATTICE_FAIL() << at << " '" << content << "': single_word is not supported";
      // HuggingFace's default: special tokens are found in the raw text, the others normalized.
      const bool special = flag_of(t, "special", false, at);
      added_.push_back({int32_t(t["id"].get<int64_t>()), content, flag_of(t, "lstrip", false, at),
                        flag_of(t, "rstrip", false, at), flag_of(t, "normalized", !special, at)});
      max_id = std::max<int64_t>(max_id, added_.back().id);
    }
  }
  // Longest first: a scan that tries them in this order finds the longest match.
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (const AddedToken& t : added_) added_text_.emplace(t.id, t.content);
  auto added_id = [&](const std::string& content) {
    for (const AddedToken& t : added_)
      if (t.content == content) return t.id;
    return -1;
  };

  const json& vocab = model.contains("vocab") ? model["vocab"] : json();
  if (!vocab.is_object() || vocab.empty()) LATTICE_FAIL() << where << ": model.vocab is missing or empty";
  const json& merges = model.contains("merges") ? model["merges"] : json();
  if (!merges.is_array()) LATTICE_FAIL() << where << ": model.merges is missing or not a list";
  bpe_.reserve(vocab.size(), merges.size());
  std::string bytes;
  {
    std::vector<bool> seen;
    for (const auto& [token, value] : vocab.items()) {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
        LATTICE_FAIL() << where << ": model.vocab: id of '" << token << "' is " << value.dump()
                       << ", expected a non-negative integer";
      const int32_t id = int32_t(value.get<int64_t>());
      if (size_t(id) >= seen.size()) seen.resize(size_t(id) + 1, false);
      if (seen[size_t(id)]) LATTICE_FAIL() << where << ": model.vocab: id " << id << " is used twice ('" << token << "')";
      seen[size_t(id)] = true;
      if (!byte_alphabet_to_bytes(token, &bytes)) {
        if (added_id(token) < 0)
          LATTICE_FAIL() << where << ": model.vocab token '" << token << "' (id " << id
                         << ") has a character outside the byte-level alphabet (not a byte-level BPE vocabulary)";
        continue;  // an added token: decoded as its text
      }
      bpe_.add_token(id, bytes);
      max_id = std::max<int64_t>(max_id, id);
    }
  }
  if (const int b = bpe_.index_bytes(); b >= 0)
    LATTICE_FAIL() << where << ": model.vocab has no token for byte " << b << " (a byte-level BPE vocabulary has all 256)";
  vocab_size_ = max_id + 1;

  // Merges by rank: "left right" strings (tokenizers < 0.20) or [left, right] pairs.
  std::string left, right;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string l, r;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        LATTICE_FAIL() << where << ": model.merges[" << i << "] is '" << s << "', expected '<left> <right>'";
      l = s.substr(0, sp);
      r = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      l = m[0].get<std::string>();
      r = m[1].get<std::string>();
    } else {
      LATTICE_FAIL() << where << ": model.merges[" << i << "] is " << m.dump().substr(0, 80)
                     << ", expected \"<left> <right>\" or [left, right]";
    }
    auto id_of = [&](const std::string& spelled, std::string* b) {
      const int32_t id = byte_alphabet_to_bytes(spelled, b) ? bpe_.find(*b) : -1;
      if (id < 0)
        LATTICE_FAIL() << where << ": model.merges[" << i << "]: '" << spelled << "' is not a token of model.vocab";
      return id;
    };
    const int32_t a = id_of(l, &left), b = id_of(r, &right);
    const int32_t merged = bpe_.find(left + right);
    if (merged < 0)
      LATTICE_FAIL() << where << ": model.merges[" << i << "]: '" << l << r << "' is not a token of model.vocab";
    bpe_.add_merge(a, b, merged);  // a repeated pair keeps its first (lowest) rank, as HuggingFace's
  }

  // Normalizer: none, or one Unicode normalization form (alone or a Sequence of one).
  if (std::string t = type_of(j.value("normalizer", json()), where + ": normalizer"); !t.empty()) {
    const json* n = &j["normalizer"];
    std::string at = where + ": normalizer";
    if (t == "Sequence") {
      if (!n->contains("normalizers") || !(*n)["normalizers"].is_array())
        LATTICE_FAIL() << at << ".normalizers: missing or not a list";
      const json& list = (*n)["normalizers"];
      if (list.size() > 1)
        LATTICE_FAIL() << at << ": a Sequence of " << list.size()
                       << " normalizers is not supported (lattice's HuggingFaceTokenizer takes one: NFC, NFD, NFKC or NFKD)";
      at += ".normalizers[0]";
      n = list.empty() ? nullptr : &list[0];
      t = n ? type_of(*n, at) : std::string();
    }
    static const std::pair<const char*, Normalization> forms[] = {
        {"NFC", Normalization::nfc}, {"NFD", Normalization::nfd}, {"NFKC", Normalization::nfkc}, {"NFKD", Normalization::nfkd}};
    for (const auto& [name, form] : forms)
      if (t == name) normalization_ = form;
    if (!t.empty() && normalization_ == Normalization::none)
      LATTICE_FAIL() << at << ": normalizer " << t
                     << " is not supported (lattice's HuggingFaceTokenizer takes NFC, NFD, NFKC or NFKD)";
  }
  // The two passes of added tokens. A normalized token is found in normalized text, so as its
  // normalized content (as HuggingFace's).
  for (AddedToken t : added_) {
    AddedSet& set = t.normalized ? added_normalized_ : added_raw_;
    std::string normalized;
    if (t.normalized && normalization_ != Normalization::none &&
        normalize_utf8(icu_normalizer(normalization_), t.content, &normalized))
      t.content = normalized;
    set.tokens.push_back(t);
    set.first_bytes[static_cast<unsigned char>(t.content[0])] = true;
  }
  for (AddedSet* set : {&added_raw_, &added_normalized_})
    std::stable_sort(set->tokens.begin(), set->tokens.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  // Pre-tokenizer, flattened into steps.
  std::vector<const json*> pre;
  std::vector<std::string> pre_where;
  std::function<void(const json&, const std::string&)> flatten = [&](const json& p, const std::string& at) {
    const std::string t = type_of(p, at);
    if (t == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
        LATTICE_FAIL() << at << ".pretokenizers: missing or not a list";
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
        flatten(p["pretokenizers"][i], at + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (!t.empty()) {
      pre.push_back(&p);
      pre_where.push_back(at);
    }
  };
  const json none;
  flatten(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none, where + ": pre_tokenizer");
  for (size_t i = 0; i < pre.size(); ++i) {
    const json& p = *pre[i];
    const std::string& at = pre_where[i];
    const std::string t = type_of(p, at);
    auto step = std::make_unique<Step>();
    if (t == "ByteLevel") {
      if (flag_of(p, "add_prefix_space", false, at)) {
        if (i > 0) LATTICE_FAIL() << at << ": add_prefix_space after another pre-tokenizer is not supported";
        add_prefix_space_ = true;
      }
      if (!flag_of(p, "use_regex", true, at)) continue;  // bytes only: nothing to cut
    } else if (t == "Split") {
      if (!p.contains("pattern") || !p["pattern"].is_object())
        LATTICE_FAIL() << at << ".pattern: expected {\"Regex\": ...} or {\"String\": ...}";
      const json& pat = p["pattern"];
      const bool literal = pat.contains("String");
      if (!literal && !pat.contains("Regex"))
        LATTICE_FAIL() << at << ".pattern: expected {\"Regex\": ...} or {\"String\": ...}";
      const std::string& text = string_of(pat, literal ? "String" : "Regex", at + ".pattern");
      step->regex = std::make_unique<Regex>(text, at + ".pattern", literal);
      step->behavior = parse_behavior(string_of(p, "behavior", at), at);
      step->invert = flag_of(p, "invert", false, at);
    } else if (t == "Digits") {
      // Each numeric character (Unicode N*), alone or in runs.
      step->regex = std::make_unique<Regex>("\\p{N}", at);
      step->behavior = flag_of(p, "individual_digits", false, at) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    } else {
      LATTICE_FAIL() << at << ": pre-tokenizer " << t
                     << " is not supported (ByteLevel, Split, Digits and Sequence are; lattice reads byte-level BPE "
                     << "tokenizers)";
    }
    steps_.push_back(std::move(step));
  }

  // Post-processor: TemplateProcessing's single sequence (ByteLevel's changes only offsets).
  std::function<void(const json&, const std::string&)> post = [&](const json& p, const std::string& at) {
    const std::string t = type_of(p, at);
    if (t.empty() || t == "ByteLevel") return;
    if (t == "Sequence") {
      if (!p.contains("processors") || !p["processors"].is_array())
        LATTICE_FAIL() << at << ".processors: missing or not a list";
      for (size_t i = 0; i < p["processors"].size(); ++i)
        post(p["processors"][i], at + ".processors[" + std::to_string(i) + "]");
      return;
    }
    if (t != "TemplateProcessing")
      LATTICE_FAIL() << at << ": post-processor " << t
                     << " is not supported (TemplateProcessing, ByteLevel and Sequence are)";
    if (!prefix_ids_.empty() || !suffix_ids_.empty())
      LATTICE_FAIL() << at << ": a second TemplateProcessing is not supported";
    if (!p.contains("single") || !p["single"].is_array()) LATTICE_FAIL() << at << ".single: missing or not a list";
    const json& specials = p.value("special_tokens", json::object());
    bool seen_text = false;
    for (const json& item : p["single"]) {
      if (item.contains("Sequence")) {
        if (seen_text) LATTICE_FAIL() << at << ".single: the text appears twice";
        seen_text = true;
      } else if (item.contains("SpecialToken")) {
        const std::string& name = string_of(item["SpecialToken"], "id", at + ".single[].SpecialToken");
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
          LATTICE_FAIL() << at << ".special_tokens: no ids for '" << name << "'";
        for (const json& id : specials[name]["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_)
            LATTICE_FAIL() << at << ".special_tokens['" << name << "']: id " << id.dump() << " is outside the vocabulary";
          (seen_text ? suffix_ids_ : prefix_ids_).push_back(int32_t(id.get<int64_t>()));
        }
      } else {
        LATTICE_FAIL() << at << ".single: unknown item " << item.dump().substr(0, 80);
      }
    }
    if (!seen_text) LATTICE_FAIL() << at << ".single: no {\"Sequence\": ...} for the text";
  };
  post(j.value("post_processor", json()), where + ": post_processor");

  // Decoder: ByteLevel.
  if (const std::string t = type_of(j.value("decoder", json()), where + ": decoder"); t != "ByteLevel")
    LATTICE_FAIL() << where << ": decoder is " << (t.empty() ? "null" : t)
                   << "; lattice reads byte-level BPE tokenizers (decoder ByteLevel) only";

  // The end-of-document id: eos_token beside tokenizer.json.
  std::string eos;
  std::string eos_from;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path cfg = file.parent_path() / name;
    if (!fs::exists(cfg, ec)) continue;
    const json c = parse_json_file(cfg.string(), "--tokenizer-model " + cfg.string());
    if (!c.is_object() || !c.contains("eos_token") || c["eos_token"].is_null()) continue;
    const json& e = c["eos_token"];
    if (e.is_string()) eos = e.get<std::string>();
    else if (e.is_object() && e.contains("content") && e["content"].is_string()) eos = e["content"].get<std::string>();
    else LATTICE_FAIL() << "--tokenizer-model " << cfg.string() << ": eos_token is " << e.dump().substr(0, 80);
    eos_from = cfg.string();
    break;
  }
  if (eos.empty())
    LATTICE_FAIL() << where << ": no eos_token in tokenizer_config.json or special_tokens_map.json beside it "
                   << "(the end-of-document id)";
  eod_ = added_id(eos);
  if (eod_ < 0 && vocab.contains(eos)) eod_ = int32_t(vocab[eos].get<int64_t>());
  if (eod_ < 0) LATTICE_FAIL() << "--tokenizer-model " << eos_from << ": eos_token '" << eos << "' is not a token";
}

void HuggingFaceTokenizer::encode_text(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  thread_local std::string prefixed;
  if (add_prefix_space_ && text[0] != ' ') {
    prefixed.assign(1, ' ');
    prefixed.append(text);
    text = prefixed;
  }
  thread_local std::vector<std::string_view> pieces, next;
  pieces.assign(1, text);
  for (const auto& step : steps_) {
    next.clear();
    for (std::string_view p : pieces) step->split(p, &next);
    std::swap(pieces, next);
  }
  for (std::string_view p : pieces) bpe_.encode_piece(p, out);
}

template <class Gap>
void HuggingFaceTokenizer::split_added(std::string_view text, const AddedSet& set, std::vector<int32_t>* out,
                                       Gap&& gap) const {
  // At each place the longest token that matches; lstrip/rstrip take the white space beside it.
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  size_t done = 0;  // text[0, done) is handled
  for (size_t pos = 0; pos < text.size() && !set.tokens.empty();) {
    if (!set.first_bytes[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : set.tokens)
      if (text.compare(pos, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip)
      while (begin > done && is_space(text[begin - 1])) --begin;
    if (hit->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    gap(text.substr(done, begin - done));
    out->push_back(hit->id);
    done = pos = end;
  }
  gap(text.substr(done));
}


void HuggingFaceTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  out->insert(out->end(), prefix_ids_.begin(), prefix_ids_.end());
  encode_body(text, out);
  out->insert(out->end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::vector<int32_t> HuggingFaceTokenizer::encode_without_specials(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  encode_body(text, &ids);
  return ids;
}

void HuggingFaceTokenizer::encode_body(std::string_view text, std::vector<int32_t>* out) const {
  // As HuggingFace's: the added tokens that are not normalized are found in the text as given;
  // each stretch between them is normalized, then the normalized added tokens are found in it,
  // and what lies between those is pre-tokenised and BPE-encoded.
  auto encode_stretch = [&](std::string_view raw) {
    if (raw.empty()) return;
    thread_local std::string normalized;
    std::string_view s = raw;
    if (normalization_ != Normalization::none && normalize_utf8(icu_normalizer(normalization_), raw, &normalized))
      s = normalized;
    split_added(s, added_normalized_, out, [&](std::string_view piece) { encode_text(piece, out); });
  };
  split_added(text, added_raw_, out, encode_stretch);
}

std::vector<int32_t> HuggingFaceTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  encode_append(text, &ids);
  return ids;
}

std::string HuggingFaceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (auto added = added_text_.find(id); added != added_text_.end()) text += added->second;
    else if (bpe_.has_id(id)) text += bpe_.bytes_of(id);
    else LATTICE_FAIL() << "HuggingFaceTokenizer: token id " << id << " is not in the vocabulary (0.." << vocab_size_ - 1 << ")";
  }
  return text;
}

}  // namespace lattice
