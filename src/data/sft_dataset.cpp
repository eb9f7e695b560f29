#include "data/sft_dataset.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace lattice {
namespace {
using ojson = nlohmann::ordered_json;

// The first k messages, as a list.
ojson first_messages(const ojson& messages, size_t k) {
  ojson head = ojson::array();
  for (size_t i = 0; i < k; ++i) head.push_back(messages[i]);
  return head;
}

bool is_prefix(const std::vector<int32_t>& head, const std::vector<int32_t>& whole) {
  return head.size() <= whole.size() && std::equal(head.begin(), head.end(), whole.begin());
}

// A line's conversations: its messages cut before each "system" message (Megatron's _split_conversations).
std::vector<ojson> split_conversations(const ojson& messages) {
  std::vector<ojson> conversations;
  for (const ojson& m : messages) {
    if (m["role"] == "system" || conversations.empty()) conversations.push_back(ojson::array());
    conversations.back().push_back(m);
  }
  return conversations;
}

}  // namespace

SftConversation tokenize_conversation(const ChatTemplate& chat, const Tokenizer& tok, const ojson& messages,
                                      const std::string& where) {
  auto render = [&](const ojson& msgs, bool generation_prompt) {
    try {
      return chat.render(msgs, generation_prompt);
    } catch (const Error& e) {
      LATTICE_FAIL() << where << ": " << e.what();
    }
  };
  auto encode = [&](const std::string& text) { return tok.encode_without_specials(text); };
  const std::string whole = render(messages, false);
  SftConversation c;
  c.tokens = encode(whole);
  c.trained.assign(c.tokens.size(), 0);
  for (size_t k = 0; k < messages.size(); ++k) {
    if (messages[k]["role"] != "assistant") continue;
    const std::string before_text = render(first_messages(messages, k), true);
    const std::vector<int32_t> before = encode(before_text);
    // (messages[0:k+1] of the last message is the whole conversation, already encoded)
    std::vector<int32_t> through =
        k + 1 == messages.size() ? c.tokens : encode(render(first_messages(messages, k + 1), false));
    if (!is_prefix(before, through) || !is_prefix(through, c.tokens)) {
      // A template that writes the last answer otherwise than an earlier one (Qwen3's empty thinking block): the
      // turn ends where the text that follows its content when it is the last message (its content a marker)
      // first follows the generation prompt's text in the whole conversation's.
      size_t end = 0;
      if (messages[k].contains("content") && messages[k]["content"].is_string() &&
          whole.compare(0, before_text.size(), before_text) == 0) {
        static const std::string kMarker = "\x01lattice-sft-answer\x01";
        ojson marked = first_messages(messages, k + 1);
        marked[k]["content"] = kMarker;
        const std::string text = render(marked, false);
        const size_t at = text.find(kMarker);
        const std::string close = at == std::string::npos ? "" : text.substr(at + kMarker.size());
        const size_t found = close.empty() || text.find(kMarker, at + 1) != std::string::npos
                                 ? std::string::npos
                                 : whole.find(close, before_text.size());
        if (found != std::string::npos) end = found + close.size();
      }
      through = end > 0 ? encode(whole.substr(0, end)) : std::vector<int32_t>{};
      if (end == 0 || !is_prefix(before, c.tokens) || !is_prefix(through, c.tokens) || through.size() <= before.size())
        LATTICE_FAIL() << where << ": the chat template's text of messages[0:" << k << "] (with the generation prompt) "
                       << "is not a token prefix of the whole conversation's, or the end of the assistant's turn "
                       << "cannot be found in it; the template rewrites earlier turns, so the assistant's tokens "
                          "cannot be told apart";
    }
    std::fill(c.trained.begin() + int64_t(before.size()), c.trained.begin() + int64_t(through.size()), uint8_t(1));
  }
  return c;
}

SftConversations::SftConversations(const std::string& path, std::shared_ptr<const Tokenizer> tok, ChatTemplate chat)
    : path_(path), tok_(std::move(tok)), chat_(std::move(chat)) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LATTICE_FAIL() << "--sft: " << path << ": cannot open (--sft reads a JSONL file of conversations)";
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "--sft: " + path + " line " + std::to_string(n);
    const ojson j = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) LATTICE_FAIL() << where << ": not JSON";
    if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
      LATTICE_FAIL() << where << ": expected an object with a non-empty \"messages\" list";
    for (const ojson& m : j["messages"])
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        LATTICE_FAIL() << where << ": every message needs a text \"role\"";
    lines_.push_back(line);
  }
  if (in.bad()) LATTICE_FAIL() << "--sft: " << path << ": read failed";
  if (lines_.empty()) LATTICE_FAIL() << "--sft: " << path << ": no conversations";
}

void SftConversations::pack(int64_t line, int64_t S, int64_t pad_multiple, int32_t* tokens, float* loss_mask,
                            int32_t* segments) const {
  const std::string where = path_ + " conversation line " + std::to_string(line + 1);
  const ojson messages = ojson::parse(lines_[size_t(line)])["messages"];
  const int32_t eod = tok_->eod(), pad = eod;  // (pads are never trained)
  std::vector<int32_t> ids, seg;
  std::vector<uint8_t> trained;
  int32_t s = 0;
  for (const ojson& conversation : split_conversations(messages)) {
    SftConversation c = tokenize_conversation(chat_, *tok_, conversation, where);
    if (c.tokens.empty() || c.tokens.back() != eod) {  // Megatron's: the end of document after each
      c.tokens.push_back(eod);
      c.trained.push_back(1);
    }
    ids.insert(ids.end(), c.tokens.begin(), c.tokens.end());
    trained.insert(trained.end(), c.trained.begin(), c.trained.end());
    seg.insert(seg.end(), c.tokens.size(), s);
    if (const size_t rest = ids.size() % size_t(pad_multiple); rest != 0) {  // Megatron's padding for CP
      ids.insert(ids.end(), size_t(pad_multiple) - rest, pad);
      trained.insert(trained.end(), size_t(pad_multiple) - rest, 0);
      seg.insert(seg.end(), size_t(pad_multiple) - rest, s);
    }
    ++s;
    if (int64_t(ids.size()) >= S + 1) {  // cut at S, then one pad
      ids.resize(size_t(S));
      trained.resize(size_t(S));
      seg.resize(size_t(S));
      break;
    }
  }
  const int32_t last = seg.empty() ? 0 : seg.back();  // the padding is the last conversation's
  ids.resize(size_t(S + 1), pad);
  trained.resize(size_t(S + 1), 0);
  seg.resize(size_t(S + 1), last);
  if (tokens) std::copy(ids.begin(), ids.end(), tokens);
  for (int64_t t = 0; t < S; ++t) {
    if (loss_mask) loss_mask[t] = trained[size_t(t + 1)] ? 1.0f : 0.0f;
    if (segments) segments[t] = seg[size_t(t)];
  }
}

SftSamples::SftSamples(std::shared_ptr<const SftConversations> data, int64_t begin, int64_t end, int64_t seq_length,
                       int64_t pad_multiple, int64_t num_samples)
    : data_(std::move(data)),
      begin_(begin),
      end_(end),
      S_(seq_length),
      pad_multiple_(pad_multiple),
      num_samples_(num_samples < 0 ? end - begin : num_samples) {
  LATTICE_CHECK(begin_ < end_ && S_ > 0 && pad_multiple_ > 0) << "an SFT split needs lines and a sequence length";
}

void SftSamples::sample(int64_t index, int32_t* out) const {
  data_->pack(begin_ + index % (end_ - begin_), S_, pad_multiple_, out, nullptr, nullptr);
}

void SftSamples::sample_with_extras(int64_t index, int32_t* tokens, float* loss_mask, int32_t* segments) const {
  data_->pack(begin_ + index % (end_ - begin_), S_, pad_multiple_, tokens, loss_mask, segments);
}

}  // namespace lattice
