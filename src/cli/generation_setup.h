// What `lattice generate` and `lattice serve` share: the checkpoint loaded into a one-rank model on
// the chosen device, its tokenizer (the checkpoint's, or one the flags name), and their flags.
#pragma once
#include <memory>
#include <set>
#include <string>

#include "chat/chat_template.h"
#include "checkpoint/model_checkpoint.h"
#include "cli/simple_flags.h"
#include "data/tokenizer.h"

namespace lattice {

// The flags load_generation_model reads (names without "--"): --load, --device and the tokenizer's.
const std::set<std::string>& generation_model_flags();
// Their lines of a subcommand's --help.
extern const char* const kGenerationModelFlagsHelp;

struct GenerationModel {
  LoadedModel loaded;  // loaded.model: the model
  std::unique_ptr<Tokenizer> tokenizer;
  TokenizerSpec tokenizer_spec;  // what made it (its files' paths)
};

// Sets the device (before the model is allocated), loads --load's latest checkpoint and makes the
// tokenizer: the checkpoint's flags, --tokenizer-type naming another (with its own files), and
// --vocab-file, --merge-file, --tokenizer-model ... replacing the recorded values. Throws
// lattice::Error naming the flag or checkpoint when they cannot serve.
GenerationModel load_generation_model(const SimpleFlags& f);

// The chat template: --chat-template's (a Jinja file, a tokenizer_config.json or their folder), else the
// one beside the tokenizer's files (none when there is none).
std::optional<ChatTemplate> find_chat_template(const SimpleFlags& f, const GenerationModel& g);

// An integer flag's value (fallback when absent); throws naming the flag below min or not whole.
int64_t integer_flag(const SimpleFlags& f, const std::string& name, int64_t fallback, int64_t min);

}  // namespace lattice
