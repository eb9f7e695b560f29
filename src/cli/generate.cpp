// `lattice generate --load CKPT --prompt TEXT [--prompt-file F] [--max-new-tokens N]
//  [--temperature T] [--top-k K] [--top-p P] [--seed S]`: samples text from a trained
// model, streaming tokens to stdout as they are produced.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/model_checkpoint.h"
#include "cli/simple_flags.h"
#include "cli/subcommands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "model/sampling.h"

namespace lattice {

namespace {

void generate_one(GPTModel& model, const Tokenizer& tok, const std::string& prompt,
                  int64_t max_new_tokens, const SamplingConfig& sc, const PhiloxStream& stream) {
  const TransformerConfig& c = model.config();
  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) ids.push_back(tok.eod());
  std::vector<float> logits(static_cast<size_t>(c.padded_vocab_size));
  std::fputs(prompt.c_str(), stdout);
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    // Context: the last max_position_embeddings tokens.
    const int64_t T = std::min<int64_t>(int64_t(ids.size()), c.max_position_embeddings);
    model.forward_last_logits(ids.data() + ids.size() - T, T, logits.data());
    int32_t next = sample_token(logits.data(), c.vocab_size, sc, stream, uint64_t(n));
    if (next == tok.eod()) break;
    ids.push_back(next);
    std::string piece = tok.decode({next});
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  SimpleFlags f = parse_simple_flags(
      argc, argv, 2, {"load", "prompt", "prompt-file", "max-new-tokens", "temperature", "top-k", "top-p", "seed"},
      {});
  const std::string load = f.required("load");
  std::vector<std::string> prompts;
  if (f.has("prompt")) prompts.push_back(f.get("prompt", ""));
  if (f.has("prompt-file")) {
    std::ifstream in(f.get("prompt-file", ""));
    if (!in) LATTICE_FAIL() << "--prompt-file " << f.get("prompt-file", "") << ": cannot open";
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) prompts.push_back(line);
  }
  if (prompts.empty()) LATTICE_FAIL() << "give --prompt TEXT or --prompt-file FILE";
  SamplingConfig sc;
  sc.temperature = float(f.number("temperature", 1.0));
  sc.top_k = int64_t(f.number("top-k", 0));
  sc.top_p = float(f.number("top-p", 1.0));
  if (sc.temperature < 0) LATTICE_FAIL() << "--temperature must be >= 0";
  if (sc.top_k < 0) LATTICE_FAIL() << "--top-k must be >= 0";
  if (!(sc.top_p > 0 && sc.top_p <= 1)) LATTICE_FAIL() << "--top-p must be in (0, 1]";
  const int64_t max_new = int64_t(f.number("max-new-tokens", 100));
  if (max_new < 0) LATTICE_FAIL() << "--max-new-tokens must be >= 0";
  const uint64_t seed = uint64_t(f.number("seed", 1234));

  LoadedModel lm = load_model_checkpoint(load, 1);
  if (lm.tokenizer_type.empty())
    LATTICE_FAIL() << "--load " << load << ": the checkpoint names no tokenizer (trained on pre-tokenised data)";
  auto tok = make_tokenizer(lm.tokenizer_type, "", "");
  for (size_t i = 0; i < prompts.size(); ++i) {
    PhiloxStream stream{seed, fnv1a32("generate"), uint32_t(i), 0};
    generate_one(*lm.model, *tok, prompts[i], max_new, sc, stream);
  }
  return 0;
}

}  // namespace lattice
