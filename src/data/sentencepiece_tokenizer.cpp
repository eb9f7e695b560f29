// Megatron's SentencePiece tokenizers over libsentencepiece (see sentencepiece_tokenizer.h).
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lattice {

namespace {

const char* kind_name(SentencePieceTokenizer::Kind kind) {
  switch (kind) {
    case SentencePieceTokenizer::Kind::kSentencePiece: return "SentencePieceTokenizer";
    case SentencePieceTokenizer::Kind::kGptSentencePiece: return "GPTSentencePieceTokenizer";
    case SentencePieceTokenizer::Kind::kLlama2: return "Llama2Tokenizer";
  }
  return "?";
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(Kind kind, const std::string& path, int64_t vocab_extra_ids)
    : kind_(kind), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  namespace fs = std::filesystem;
  std::error_code ec;
  file_ = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer.model").string() : path;
  const std::string what = std::string("--tokenizer-model ") + file_;
  const std::string bytes = read_tokenizer_file(file_, what);
  const auto status = sp_->LoadFromSerializedProto(bytes);
  if (!status.ok())
    LATTICE_FAIL() << what << ": not a SentencePiece model (" << status.message() << ")";
  pieces_ = sp_->GetPieceSize();
  if (pieces_ <= 0) LATTICE_FAIL() << what << ": the SentencePiece model has no pieces";
  const int eos = sp_->eos_id(), bos = sp_->bos_id();
  if (vocab_extra_ids != 0 && kind != Kind::kSentencePiece)
    LATTICE_FAIL() << "--vocab-extra-ids does not apply to --tokenizer-type " << kind_name(kind)
                   << " (it belongs to SentencePieceTokenizer)";
  if (vocab_extra_ids < 0 || vocab_extra_ids > 1000000)
    LATTICE_FAIL() << "--vocab-extra-ids must be in 0..1000000, got " << vocab_extra_ids;

  if (kind != Kind::kSentencePiece) {
    // The model's own ids: the end of document is its eos piece, Llama 2 starts with its bos.
    if (eos < 0)
      LATTICE_FAIL() << what << ": the model has no eos piece (eos_id -1), which " << kind_name(kind)
                     << " needs as its end of document";
    if (kind == Kind::kLlama2 && bos < 0)
      LATTICE_FAIL() << what << ": the model has no bos piece (bos_id -1), which Llama2Tokenizer puts before every text";
    eod_ = eos;
    bos_ = bos;
    vocab_size_ = pieces_;
    const fs::path config = fs::path(file_).parent_path() / "tokenizer_config.json";
    if (fs::exists(config, ec)) read_added_tokens(config.string());
    return;
  }

  // SentencePieceTokenizer: the special tokens, added after the pieces unless the model has them.
  int64_t next_id = pieces_;
  auto add = [&](const std::string& token) -> int32_t {
    for (const auto& [t, id] : special_)
      if (t == token) return id;  // added before (Megatron's dict keeps the first place)
    int id = sp_->PieceToId(token);
    // PieceToId answers unk for a piece the model lacks; unk's own piece maps to itself.
    if (id == sp_->unk_id() && sp_->IdToPiece(id) != token) id = -1;
    if (id < 0) {
      if (next_id >= INT32_MAX) LATTICE_FAIL() << what << ": too many special tokens";
      id = int(next_id++);
    }
    special_.emplace_back(token, int32_t(id));
    special_text_[int32_t(id)] = token;
    return int32_t(id);
  };
  auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < pieces_ ? sp_->IdToPiece(id) : std::string(fallback);
  };
  add("<CLS>");
  add("<SEP>");
  eod_ = add("<EOD>");
  add("<MASK>");
  add(piece_or(sp_->pad_id(), "<PAD>"));
  bos_ = add(piece_or(bos, "<BOS>"));
  add(piece_or(eos, "<EOS>"));
  for (int64_t i = 0; i < vocab_extra_ids; ++i) add("<extra_id_" + std::to_string(i) + ">");
  vocab_size_ = next_id;
}

void SentencePieceTokenizer::read_added_tokens(const std::string& config_file) {
  using json = nlohmann::json;
  const std::string what = "--tokenizer-model " + config_file;
  const json j = json::parse(read_tokenizer_file(config_file, what), nullptr, false);
  if (j.is_discarded() || !j.is_object()) LATTICE_FAIL() << what << ": not a JSON object";
  if (j.contains("added_tokens_decoder") && !j["added_tokens_decoder"].is_null()) {
    const json& d = j["added_tokens_decoder"];
    if (!d.is_object()) LATTICE_FAIL() << what << ": added_tokens_decoder is not an object";
    std::map<int64_t, AddedToken> by_id;
    for (auto it = d.begin(); it != d.end(); ++it) {
      char* end = nullptr;
      const long long id = std::strtoll(it.key().c_str(), &end, 10);
      const json& t = it.value();
      if (it.key().empty() || *end != '\0' || id < 0 || id > INT32_MAX)
        LATTICE_FAIL() << what << ": added_tokens_decoder key '" << it.key() << "' is not a token id";
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || t["content"].get<std::string>().empty())
        LATTICE_FAIL() << what << ": added token " << id << " has no text \"content\"";
      by_id[id] = AddedToken{t["content"].get<std::string>(), int32_t(id), t.value("lstrip", false), t.value("rstrip", false)};
    }
    int64_t next = pieces_;  // the ids past the model's pieces follow them, one after the other
    for (const auto& [id, t] : by_id) {
      if (id >= pieces_ && id != next)
        LATTICE_FAIL() << what << ": added token " << id << " ('" << t.content << "') leaves a gap after the model's "
                       << pieces_ << " pieces and the tokens added before it (the next id is " << next << ")";
      if (id >= pieces_) ++next;
      added_.push_back(t);
    }
    vocab_size_ = next;
  }
  // The end of document: eos_token when it is an added token (Phi-3's <|endoftext|>), else the model's eos.
  if (j.contains("eos_token") && !j["eos_token"].is_null()) {
    const json& e = j["eos_token"];
    const std::string eos = e.is_string() ? e.get<std::string>()
                            : e.is_object() && e.contains("content") && e["content"].is_string()
                                ? e["content"].get<std::string>()
                                : "";
    for (const AddedToken& t : added_)
      if (t.content == eos) eod_ = t.id;
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

const char* SentencePieceTokenizer::name() const { return kind_name(kind_); }

void SentencePieceTokenizer::encode_model(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) LATTICE_FAIL() << name() << " " << file_ << ": encoding failed: " << status.message();
  out->insert(out->end(), ids.begin(), ids.end());
}

void SentencePieceTokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  if (kind_ == Kind::kLlama2) out->push_back(bos_);
  if (kind_ != Kind::kSentencePiece) {
    encode_model(text, out);
    return;
  }
  // Megatron's loop: the earliest special token (the first added among equal places), the text
  // before it to the model, the token's id; then on after it. Each token's next place is kept
  // until the text passes it, so the search is linear in the text per token.
  std::vector<size_t> next(special_.size(), 0);
  std::vector<bool> stale(special_.size(), true);
  size_t idx = 0;
  for (;;) {
    size_t best = std::string_view::npos, which = 0;
    for (size_t k = 0; k < special_.size(); ++k) {
      if (stale[k] || (next[k] != std::string_view::npos && next[k] < idx)) {
        next[k] = text.find(special_[k].first, idx);
        stale[k] = false;
      }
      if (next[k] != std::string_view::npos && (best == std::string_view::npos || next[k] < best)) {
        best = next[k];
        which = k;
      }
    }
    if (best == std::string_view::npos) break;
    encode_model(text.substr(idx, best - idx), out);
    out->push_back(special_[which].second);
    idx = best + special_[which].first.size();
  }
  encode_model(text.substr(idx), out);
}

std::vector<int32_t> SentencePieceTokenizer::encode_without_specials(const std::string& text) const {
  if (kind_ == Kind::kSentencePiece) return encode(text);
  std::vector<AddedToken> marks = added_;  // the added tokens and the control pieces' texts
  for (const int id : {sp_->bos_id(), sp_->eos_id()})
    if (id >= 0 && id < pieces_) marks.push_back({sp_->IdToPiece(id), int32_t(id)});
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<int32_t> ids;
  size_t at = 0;
  for (;;) {  // the earliest mark (the longest among marks at one place)
    size_t best = std::string::npos;
    const AddedToken* which = nullptr;
    for (const AddedToken& m : marks) {
      const size_t p = text.find(m.content, at);
      if (p < best || (p == best && p != std::string::npos && m.content.size() > which->content.size()))
        best = p, which = &m;
    }
    if (!which) break;
    size_t before = best, after = best + which->content.size();
    if (which->lstrip)
      while (before > at && space(text[before - 1])) --before;
    if (which->rstrip)
      while (after < text.size() && space(text[after])) ++after;
    encode_model(std::string_view(text).substr(at, before - at), &ids);
    ids.push_back(which->id);
    at = after;
  }
  encode_model(std::string_view(text).substr(at), &ids);
  return ids;
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  encode_append(text, &ids);
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab_size_)
      LATTICE_FAIL() << name() << ": cannot decode id " << id << " (the vocabulary is 0.." << vocab_size_ - 1 << ")";
  auto model_text = [&](size_t from, size_t to) {
    std::string s;
    if (from == to) return s;
    const std::vector<int> part(ids.begin() + from, ids.begin() + to);
    const auto status = sp_->Decode(part, &s);
    if (!status.ok()) LATTICE_FAIL() << name() << " " << file_ << ": decoding failed: " << status.message();
    return s;
  };
  if (kind_ != Kind::kSentencePiece) {  // the added tokens past the pieces as their text
    std::string text;
    size_t last = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < pieces_) continue;
      text += model_text(last, i);
      for (const AddedToken& t : added_)
        if (t.id == ids[i]) text += t.content;
      last = i + 1;
    }
    return text + model_text(last, ids.size());
  }
  // Megatron's detokenize: each special token as " TOKEN ", the model's text between them.
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto it = special_text_.find(ids[i]);
    if (it == special_text_.end()) continue;
    text += model_text(last, i);
    text += ' ';
    text += it->second;
    text += ' ';
    last = i + 1;
  }
  text += model_text(last, ids.size());
  return text;
}

}  // namespace lattice
