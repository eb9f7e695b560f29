// encode_chunk: jsonl lines -> per-key token sequences (Megatron's Encoder.encode).
#include "data/preprocess_encode.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

namespace lattice {

namespace {

// Why nlohmann rejected a line, in the user's words.
std::string describe_parse_error(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  if (what.find("UTF-8") != std::string::npos) return "invalid UTF-8 at byte " + std::to_string(e.byte);
  if (what.find("surrogate") != std::string::npos)
    return "invalid \\u escape (unpaired UTF-16 surrogate) at byte " + std::to_string(e.byte);
  return "malformed JSON at byte " + std::to_string(e.byte);
}

// Appends the line's document to every key of *out; returns an error message instead (leaving
// *out as it was) for a bad line.
std::string encode_line(std::string_view line, const PreprocessOptions& opt, const Tokenizer& tok, EncodedChunk* out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    return describe_parse_error(e);
  }
  if (!j.is_object()) return std::string("expected a JSON object, got ") + j.type_name();
  // Check every key before tokenizing any, so a bad line leaves nothing behind.
  std::vector<const nlohmann::json*> values;
  for (const std::string& key : opt.json_keys) {
    auto it = j.find(key);
    if (it == j.end()) return "missing key '" + key + "' (from --json-keys)";
    const bool ok = it->is_string() ||
                    (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& e) { return e.is_string(); }));
    if (!ok) return "key '" + key + "' is " + it->type_name() + ", expected a string or a list of strings";
    values.push_back(&*it);
  }
  bool empty = true;
  for (size_t k = 0; k < values.size(); ++k) {
    EncodedChunk::Key& dst = out->keys[k];
    int32_t seqs = 0;
    auto add_sentence = [&](const std::string& s) {
      const size_t before = dst.tokens.size();
      tok.encode_append(s, &dst.tokens);
      if (dst.tokens.size() == before) return;  // Megatron drops empty sentences
      dst.seq_lengths.push_back(int32_t(dst.tokens.size() - before));
      ++seqs;
    };
    if (values[k]->is_string()) {
      add_sentence(values[k]->get_ref<const std::string&>());
    } else {
      for (const auto& e : *values[k]) add_sentence(e.get_ref<const std::string&>());
    }
    if (seqs > 0) {
      empty = false;
      if (opt.append_eod) {
        dst.tokens.push_back(tok.eod());
        ++dst.seq_lengths.back();
      }
    }
    dst.doc_seqs.push_back(seqs);
  }
  ++out->documents;
  if (empty) ++out->empty_documents;
  return "";
}

}  // namespace

EncodedChunk encode_chunk(const LineChunk& chunk, const PreprocessOptions& opt, const Tokenizer& tok) {
  EncodedChunk out;
  out.index = chunk.index;
  out.input_bytes = int64_t(chunk.text.size());
  out.keys.resize(opt.json_keys.size());
  for (auto& k : out.keys) k.tokens.reserve(chunk.text.size() / 3);
  const std::string_view text = chunk.text;
  int64_t line_no = chunk.first_line_no;
  for (size_t pos = 0; pos < text.size(); ++line_no) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    std::string err;
    try {
      err = encode_line(line, opt, tok, &out);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (err.empty()) continue;
    err = opt.input + " line " + std::to_string(line_no) + ": " + err;
    if (!opt.skip_bad_lines) {
      out.error = std::move(err);
      return out;
    }
    if (out.bad_lines++ == 0) out.first_bad_line = std::move(err);
  }
  return out;
}

}  // namespace lattice
