// `lattice generate --load CKPT (--prompt TEXT | --prompt-file F) [--max-new-tokens N]
//  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer-type NAME]
//  [--vocab-file F --merge-file F | --tokenizer-model PATH] [--no-kv-cache] [--bf16] [--batch-size B]
//  [--chat [--system TEXT] [--chat-template PATH]] [--device cpu|cuda]`: samples text from a trained model,
// streaming each token to stdout as it is produced (--batch-size B > 1: B prompts decoded together, each
// printed when complete). --chat makes each prompt a user's message through the model's chat template
// (chat/chat_template.h), encoded without the tokenizer's added ids, as serve's chat completions do.
// --device cuda keeps the model on the GPU (docs/cuda.md); tokens and logits cross to
// the host once per step; the KV cache and its attention stay on the GPU.
//
// Decoding uses a KV cache (GPTInference): the prompt is prefilled once, then each new token
// runs the layers on that token alone. --no-kv-cache recomputes a full forward over the
// context for every token instead (the reference the cache is checked against, and the
// benchmark baseline); both give the same text. --bf16 decodes with every linear layer's weight and
// input rounded to bf16 (model/bf16_decode_policy.h): half the bytes a step reads, a bf16 model's numbers.
//
// Context: positions are absolute (learned), so the context holds at most
// max_position_embeddings tokens. A longer prompt keeps its last max_position_embeddings
// tokens; when generation fills the context, it restarts from the last half of it (one new
// prefill), so long generations cost a prefill every max_position_embeddings/2 tokens.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/generation_setup.h"
#include "data/generation_config.h"
#include "cli/subcommands.h"
#include "core/device.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "model/gpt_inference.h"
#include "model/sampling.h"
#include "model/text_generation.h"

namespace lattice {

namespace {


// Logits of the next token after ids[start:], by the KV cache or by a full forward.
class NextTokenLogits {
 public:
  NextTokenLogits(GPTModel& model, bool kv_cache, bool bf16) : model_(model) {
    if (kv_cache) cache_ = std::make_unique<GPTInference>(model, 0, bf16);
  }

  // Appends to the cache what it lacks of ids[start:] (everything, after the context moved).
  // Returns the number of tokens run through the model (its prefill size).
  int64_t compute(const std::vector<int32_t>& ids, int64_t start, float* logits) {
    const int64_t T = int64_t(ids.size()) - start;
    if (!cache_) {
      model_.forward_last_logits(ids.data() + start, T, logits);
      return T;
    }
    if (start != cached_start_) {
      cache_->reset();
      cached_start_ = start;
    }
    const int64_t n = T - cache_->length();
    cache_->append(ids.data() + start + cache_->length(), n, logits);
    return n;
  }

  void restart() { cached_start_ = -1; }

 private:
  GPTModel& model_;
  std::unique_ptr<GPTInference> cache_;
  int64_t cached_start_ = -1;
};

// A prompt's text as its tokens come: each new token adds what it adds to the decoded text, so that
// tokenizers whose decode joins tokens (NullTokenizer's spaces) stream as they decode.
class TextSoFar {
 public:
  TextSoFar(const Tokenizer& tok, const std::vector<int32_t>& ids) : tok_(tok), shown_(tok.decode(ids)) {}
  // The text `next` adds after ids (which end with it).
  std::string piece(const std::vector<int32_t>& ids, int32_t next) {
    std::string all = tok_.decode(ids);
    std::string p = all.compare(0, shown_.size(), shown_) == 0 ? all.substr(shown_.size()) : tok_.decode({next});
    shown_ = std::move(all);
    return p;
  }

 private:
  const Tokenizer& tok_;
  std::string shown_;
};

// The first token of the context kept for a prompt of ids.size() tokens (a longer one keeps its
// last max_position_embeddings), and where it moves when the context is full: to keep its last half.
int64_t context_start(const std::vector<int32_t>& ids, int64_t P) { return std::max<int64_t>(0, int64_t(ids.size()) - P); }
int64_t moved_start(const std::vector<int32_t>& ids, int64_t start, int64_t P) {
  return int64_t(ids.size()) - start > P ? int64_t(ids.size()) - std::max<int64_t>(1, P / 2) : start;
}

// A prompt's ids: its encoding, or with --chat (the chat template's text, which writes the special
// tokens) its encoding without the tokenizer's added ids; the end of document when empty.
std::vector<int32_t> prompt_ids(const Tokenizer& tok, const std::string& prompt, bool chat) {
  std::vector<int32_t> ids = chat ? tok.encode_without_specials(prompt) : tok.encode(prompt);
  if (ids.empty()) ids.push_back(tok.eod());
  return ids;
}

void generate_one(GPTModel& model, NextTokenLogits& next_logits, const Tokenizer& tok,
                  const std::string& prompt, bool chat, int64_t max_new_tokens, const SamplingConfig& sc,
                  const std::vector<int32_t>& stops, const PhiloxStream& stream, GenerationTiming& timing) {
  const TransformerConfig& c = model.config();
  const int64_t P = c.max_position_embeddings;
  std::vector<int32_t> ids = prompt_ids(tok, prompt, chat);
  const int64_t prompt_length = int64_t(ids.size());
  std::vector<float> logits(static_cast<size_t>(c.padded_vocab_size));
  std::fputs(prompt.c_str(), stdout);
  std::fflush(stdout);
  next_logits.restart();
  int64_t start = context_start(ids, P);
  Timer timer;
  timing.prefill_tokens += next_logits.compute(ids, start, logits.data());
  timing.prefill_s += timer.seconds();
  timer.reset();
  TextSoFar text(tok, ids);
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    if (sc.adjusts()) adjust_logits(logits.data(), c.vocab_size, sc, ids, prompt_length);
    const int32_t next = sample_token(logits.data(), c.vocab_size, sc, stream, uint64_t(n));
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    ids.push_back(next);
    const std::string piece = text.piece(ids, next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    ++timing.new_tokens;
    if (n + 1 == max_new_tokens) break;  // no logits needed after the last token
    start = moved_start(ids, start, P);
    next_logits.compute(ids, start, logits.data());
  }
  timing.decode_s += timer.seconds();
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// The prompts decoded `batch` at a time (--batch-size; model/text_generation.h): each prompt samples
// as it would alone (its own stream, its own logits); its text is printed when complete, in prompt order.
void generate_batched(GPTModel& model, const Tokenizer& tok, const std::vector<std::string>& prompts, bool chat,
                      int64_t max_new_tokens, const SamplingConfig& sc, const std::vector<int32_t>& stops,
                      uint64_t seed, int64_t batch, bool bf16, GenerationTiming& timing) {
  std::vector<GenerationRequest> requests(prompts.size());
  std::vector<std::unique_ptr<TextSoFar>> texts(prompts.size());
  std::vector<std::string> outputs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest& r = requests[i];
    r.prompt = prompt_ids(tok, prompts[i], chat);
    r.max_new_tokens = max_new_tokens;
    r.sampling = sc;
    r.stream = PhiloxStream{seed, fnv1a32("generate"), uint32_t(i), 0};
    r.stop_tokens = stops;
    texts[i] = std::make_unique<TextSoFar>(tok, r.prompt);
    outputs[i] = prompts[i];
  }
  std::vector<bool> complete(prompts.size(), false);
  size_t printed = 0;
  TextGenerator generator(model, std::min<int64_t>(batch, int64_t(prompts.size())), bf16);
  generator.run(
      requests,
      [&](size_t i, const GenerationResult& r) {
        outputs[i] += texts[i]->piece(r.tokens, r.tokens.back());
        return true;
      },
      [&](size_t i, const GenerationResult&) {
        complete[i] = true;
        for (; printed < prompts.size() && complete[printed]; ++printed) {
          std::fwrite(outputs[printed].data(), 1, outputs[printed].size(), stdout);  // (it may hold NUL bytes)
          std::fputc('\n', stdout);
          std::fflush(stdout);
        }
      });
  timing = generator.timing();
}

std::vector<std::string> read_prompts(const SimpleFlags& f) {
  std::vector<std::string> prompts;
  if (f.has("prompt")) prompts.push_back(f.get("prompt", ""));
  if (f.has("prompt-file")) {
    const std::string path = f.get("prompt-file", "");
    std::ifstream in(path);
    if (!in) LATTICE_FAIL() << "--prompt-file " << path << ": cannot open";
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) prompts.push_back(line);
    if (in.bad()) LATTICE_FAIL() << "--prompt-file " << path << ": read failed";
  }
  if (prompts.empty()) LATTICE_FAIL() << "give --prompt TEXT or --prompt-file FILE (one prompt per non-empty line)";
  return prompts;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  if (help_requested(argc, argv, 2)) {
    std::fputs(
        "usage: lattice generate --load CKPT (--prompt TEXT | --prompt-file F) [flags]\n"
        "Samples text from a checkpoint (any parallel layout), streaming it to stdout.\n"
        "  --prompt TEXT              the prompt\n"
        "  --prompt-file F            one prompt per non-empty line\n"
        "  --max-new-tokens N         tokens to generate per prompt [100]\n"
        "  --temperature T            softmax temperature; 0: greedy [1]\n"
        "  --top-k K                  sample among the K likeliest tokens (0: all) [0]\n"
        "  --top-p P                  nucleus sampling: the likeliest tokens up to mass P [1]\n"
        "  --repetition-penalty R     a token of the prompt or the text so far: its logit / R when positive, x R\n"
        "                             when negative (HuggingFace's) [1: none]\n"
        "  --frequency-penalty F      logit - F x the times the token was generated (OpenAI's; -2 to 2) [0]\n"
        "  --presence-penalty P       logit - P for a token already generated (OpenAI's; -2 to 2) [0]\n"
        "  --seed S                   sampling seed [1234]\n"
        "  --batch-size B             prompts decoded together, their new tokens one GEMM per layer; each\n"
        "                             prompt's text printed when complete (B > 1) [1: streamed]\n"
        "  --no-kv-cache              recompute the whole context for every token\n"
        "  --bf16                     decode with the linear layers' weights and inputs in bf16 (half the\n"
        "                             bytes per token; with the KV cache)\n"
        "  --chat                     each prompt is a user's message through the chat template (its text is\n"
        "                             printed, then the answer, which ends at the end of the turn)\n"
        "  --system TEXT              with --chat: a system message first\n"
        "  --chat-template PATH       with --chat: a Jinja file, a tokenizer_config.json or their folder\n"
        "                             [the tokenizer's folder's]\n",
        stdout);
    std::fputs(kGenerationModelFlagsHelp, stdout);
    return 0;
  }
  std::set<std::string> value_flags = {"prompt", "prompt-file", "max-new-tokens", "temperature", "top-k", "top-p",
                                        "repetition-penalty", "frequency-penalty", "presence-penalty",
                                        "seed", "batch-size", "system", "chat-template"};
  value_flags.insert(generation_model_flags().begin(), generation_model_flags().end());
  SimpleFlags f = parse_simple_flags(argc, argv, 2, value_flags, {"no-kv-cache", "bf16", "chat"});
  std::vector<std::string> prompts = read_prompts(f);
  const bool chat = f.has("chat");
  for (const char* needs_chat : {"system", "chat-template"})
    if (f.has(needs_chat) && !chat) LATTICE_FAIL() << "--" << needs_chat << " goes with --chat";
  SamplingConfig sc;
  sc.temperature = float(f.number("temperature", 1.0));
  sc.top_k = integer_flag(f, "top-k", 0, 0);
  sc.top_p = float(f.number("top-p", 1.0));
  if (!(sc.temperature >= 0)) LATTICE_FAIL() << "--temperature must be >= 0";
  if (!(sc.top_p > 0 && sc.top_p <= 1)) LATTICE_FAIL() << "--top-p must be in (0, 1]";
  sc.repetition_penalty = float(f.number("repetition-penalty", 1.0));
  sc.frequency_penalty = float(f.number("frequency-penalty", 0.0));
  sc.presence_penalty = float(f.number("presence-penalty", 0.0));
  if (!(sc.repetition_penalty > 0 && std::isfinite(sc.repetition_penalty)))
    LATTICE_FAIL() << "--repetition-penalty must be a number > 0, got " << f.get("repetition-penalty", "");
  for (const char* p : {"frequency-penalty", "presence-penalty"})
    if (!(std::fabs(f.number(p, 0.0)) <= 2.0)) LATTICE_FAIL() << "--" << p << " must be in [-2, 2], got " << f.get(p, "");
  const int64_t max_new = integer_flag(f, "max-new-tokens", 100, 0);
  const int64_t batch = integer_flag(f, "batch-size", 1, 1);
  const uint64_t seed = uint64_t(integer_flag(f, "seed", 1234, 0));
  GenerationModel g = load_generation_model(f);
  LoadedModel& lm = g.loaded;
  const Tokenizer* tok = g.tokenizer.get();
  const Device device = current_device();
  const bool kv_cache = !f.has("no-kv-cache"), bf16 = f.has("bf16");
  // The end of document and generation_config.json's eos ids beside the tokenizer (a chat model's end of turn).
  const std::vector<int32_t> stops = generation_stop_tokens(*tok, g.tokenizer_spec.model);
  if (chat) {  // each prompt: [system,] user -> the template's text, opening the assistant's turn
    const std::optional<ChatTemplate> templ = find_chat_template(f, g);
    if (!templ)
      LATTICE_FAIL() << "--chat: the tokenizer's folder holds no chat template (chat_template.jinja or a "
                        "tokenizer_config.json chat_template); give --chat-template PATH";
    for (std::string& p : prompts) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (f.has("system")) messages.push_back({{"role", "system"}, {"content", f.get("system", "")}});
      messages.push_back({{"role", "user"}, {"content", p}});
      p = templ->render(messages, true);
    }
  }
  if (bf16 && !kv_cache) LATTICE_FAIL() << "--bf16 decodes with the KV cache: drop --no-kv-cache";
  if (batch > 1 && !kv_cache) LATTICE_FAIL() << "--batch-size " << batch << " decodes with the KV cache: drop --no-kv-cache";
  GenerationTiming timing;
  if (batch > 1) {
    generate_batched(*lm.model, *tok, prompts, chat, max_new, sc, stops, seed, batch, bf16, timing);
  } else {
    NextTokenLogits next_logits(*lm.model, kv_cache, bf16);
    for (size_t i = 0; i < prompts.size(); ++i) {
      PhiloxStream stream{seed, fnv1a32("generate"), uint32_t(i), 0};
      generate_one(*lm.model, next_logits, *tok, prompts[i], chat, max_new, sc, stops, stream, timing);
    }
  }
  std::fprintf(stderr,
               "generate: %zu prompt(s), prefill %lld tokens in %.1f ms, %lld new tokens in %.1f ms "
               "(%.2f tokens/s, %s%s%s%s)\n",
               prompts.size(), (long long)timing.prefill_tokens, timing.prefill_s * 1e3,
               (long long)timing.new_tokens, timing.decode_s * 1e3,
               timing.decode_s > 0 ? double(timing.new_tokens) / timing.decode_s : 0.0,
               kv_cache ? "KV cache" : "full forward per token", bf16 ? ", bf16 weights" : "",
               batch > 1 ? (", batch " + std::to_string(batch)).c_str() : "",
               device == Device::cpu ? "" : cuda_emulated() ? ", cuda emulated" : ", cuda");
  return 0;
}

}  // namespace lattice
