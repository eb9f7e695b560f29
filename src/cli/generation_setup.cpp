#include "cli/generation_setup.h"

#include <cmath>

#include "core/device.h"
#include "core/error.h"

namespace lattice {

const std::set<std::string>& generation_model_flags() {
  static const std::set<std::string> flags = {
      "load", "device", "tokenizer-type", "vocab-file", "merge-file", "tokenizer-model", "vocab-size",
      "vocab-extra-ids", "tiktoken-pattern", "tiktoken-num-special-tokens", "tiktoken-special-tokens"};
  return flags;
}

const char* const kGenerationModelFlagsHelp =
    "  --load DIR                 checkpoint directory (its latest iteration)\n"
    "  --tokenizer-type NAME      ByteTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer,\n"
    "                             GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, NullTokenizer\n"
    "                             [the checkpoint's]\n"
    "  --vocab-file F             GPT-2 BPE vocabulary (vocab.json) [the checkpoint's]\n"
    "  --merge-file F             GPT-2 BPE merges (merges.txt) [the checkpoint's]\n"
    "  --tokenizer-model PATH     HuggingFace tokenizer.json, a SentencePiece model (or their folder), or\n"
    "                             TikTokenizer's vocabulary [the checkpoint's]\n"
    "  --vocab-extra-ids N        SentencePieceTokenizer's <extra_id_*> tokens [the checkpoint's]\n"
    "  --tiktoken-pattern, --tiktoken-num-special-tokens, --tiktoken-special-tokens \"T ...\"\n"
    "                             TikTokenizer's settings [the checkpoint's]\n"
    "  --vocab-size N             NullTokenizer's ids (N: the end of document) [the checkpoint's]\n"
    "  --device cpu|cuda          where the model runs [cpu]\n";

std::optional<ChatTemplate> find_chat_template(const SimpleFlags& f, const GenerationModel& g) {
  if (f.has("chat-template")) return ChatTemplate::load(f.required("chat-template"), "--chat-template");
  return ChatTemplate::find_beside(g.tokenizer_spec.model, "--tokenizer-model");
}

int64_t integer_flag(const SimpleFlags& f, const std::string& name, int64_t fallback, int64_t min) {
  const double v = f.number(name, double(fallback));
  if (v != std::floor(v) || v < double(min))
    LATTICE_FAIL() << "--" << name << " must be an integer >= " << min << ", got " << f.get(name, "");
  return int64_t(v);
}

GenerationModel load_generation_model(const SimpleFlags& f) {
  const std::string load = f.required("load");
  set_device(parse_device(f.get("device", "cpu").c_str()));  // before the model is allocated
  GenerationModel g;
  g.loaded = load_model_checkpoint(load, 1);
  TokenizerSpec spec = g.loaded.tokenizer;
  if (f.has("tokenizer-type")) spec = TokenizerSpec{f.get("tokenizer-type", "")};
  spec.vocab_file = f.get("vocab-file", spec.vocab_file);
  spec.merge_file = f.get("merge-file", spec.merge_file);
  spec.model = f.get("tokenizer-model", spec.model);
  spec.vocab_size = integer_flag(f, "vocab-size", spec.vocab_size, 0);
  spec.vocab_extra_ids = integer_flag(f, "vocab-extra-ids", spec.vocab_extra_ids, 0);
  spec.tiktoken_pattern = f.get("tiktoken-pattern", spec.tiktoken_pattern);
  spec.tiktoken_num_special_tokens = integer_flag(f, "tiktoken-num-special-tokens", spec.tiktoken_num_special_tokens, 0);
  if (f.has("tiktoken-special-tokens")) spec.tiktoken_special_tokens = f.words("tiktoken-special-tokens");
  if (spec.type.empty())
    LATTICE_FAIL() << "--load " << load
                   << ": the checkpoint names no tokenizer (trained on pre-tokenised data); give --tokenizer-type";
  g.tokenizer = make_tokenizer(spec);
  g.tokenizer_spec = spec;
  if (g.tokenizer->vocab_size() > g.loaded.model->config().vocab_size)
    LATTICE_FAIL() << "--tokenizer-type " << spec.type << " has " << g.tokenizer->vocab_size()
                   << " tokens, more than the model's vocabulary of " << g.loaded.model->config().vocab_size;
  return g;
}

}  // namespace lattice
