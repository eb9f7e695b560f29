// Megatron's SFT data (--sft, megatron/training/datasets/sft_dataset.py): a JSONL file whose every line
// holds "messages", one or more conversations ([{"role", "content"}, ...], a new one at each "system"
// message). Sample i of a split is line (split's first + i mod the split's lines): its conversations,
// each its tokens through the model's chat template with the end-of-document token appended unless it
// ends with it (and with context parallelism padded to a multiple of 2 x CP), packed one after the other
// into S + 1 tokens (cut at S, then one pad), padded to S + 1.
// The loss is on the assistant's tokens only (and on each appended end of document); each conversation
// is a segment of its own (positions from 0, attention within it), the padding part of the last one.
//
// Which tokens are the assistant's (lattice's tokenize_conversation; Megatron's prompt formats are
// Python classes of its own): for assistant message k, those after the text of messages [0, k) with the
// generation prompt (the template's opening of the assistant's turn) up to the end of the text of
// messages [0, k]: its content and what the template closes the turn with (<|eot_id|>, <|im_end|>).
// The texts of the first messages must be prefixes of the whole conversation's, in tokens. Where the
// text of messages [0, k] is not (a template that writes the last answer otherwise, as Qwen3's empty
// thinking block), the turn ends where what follows message k's content when it is last (<|im_end|>)
// first follows the generation prompt in the whole text; a template whose earlier texts are no prefix
// even so is refused naming the line.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "data/gpt_batches.h"
#include "data/tokenizer.h"

namespace lattice {

// A conversation's tokens (the template's text encoded without the tokenizer's added ids) and, per token,
// whether it is trained (1: the assistant's). Throws lattice::Error with `where` (file and line) when
// the template fails or its texts are not prefixes of each other.
struct SftConversation {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
};
SftConversation tokenize_conversation(const ChatTemplate& chat, const Tokenizer& tok,
                                      const nlohmann::ordered_json& messages, const std::string& where);

// The JSONL file's lines, checked (each an object with a non-empty "messages" list of objects with a
// text "role"); errors name the file and line.
class SftConversations {
 public:
  SftConversations(const std::string& path, std::shared_ptr<const Tokenizer> tok, ChatTemplate chat);
  int64_t size() const { return int64_t(lines_.size()); }
  const std::string& path() const { return path_; }
  // Line i's sample: tokens [S + 1], loss mask [S] of the labels tokens[1:], segments [S] (each may be null).
  // pad_multiple > 1 (context parallelism: 2 x CP, as Megatron's): each conversation padded to a multiple
  // of it within its segment, untrained.
  void pack(int64_t line, int64_t S, int64_t pad_multiple, int32_t* tokens, float* loss_mask, int32_t* segments) const;

 private:
  std::string path_;
  std::vector<std::string> lines_;
  std::shared_ptr<const Tokenizer> tok_;
  ChatTemplate chat_;
};

// One split's samples: lines [begin, end) of the file, sample i its line begin + i mod (end - begin).
// It holds num_samples samples (Megatron's SFTDataset's len: what the split or a blend asks of it; -1:
// the split's lines once).
class SftSamples : public SampleSource {
 public:
  SftSamples(std::shared_ptr<const SftConversations> data, int64_t begin, int64_t end, int64_t seq_length,
             int64_t pad_multiple = 1, int64_t num_samples = -1);
  void sample(int64_t index, int32_t* out) const override;
  bool has_extras() const override { return true; }
  void sample_with_extras(int64_t index, int32_t* tokens, float* loss_mask, int32_t* segments) const override;
  int64_t seq_length() const override { return S_; }
  int64_t size() const override { return num_samples_; }

 private:
  std::shared_ptr<const SftConversations> data_;
  int64_t begin_, end_, S_, pad_multiple_, num_samples_;
};

}  // namespace lattice
