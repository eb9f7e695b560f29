// lattice: GPT training in one native binary.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/data_cmd.h"
#include "cli/simple_flags.h"
#include "cli/subcommands.h"
#include "cli/tokenize.h"
#include "core/crash_report.h"
#include "core/error.h"
#include "data/merge_datasets.h"
#include "data/preprocess.h"
#include "train/arguments.h"
#include "train/loss_plot.h"
#include "train/trainer.h"

namespace lattice {

int cmd_train(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(train_help().c_str(), stdout);
      return 0;
    }
  return run_training(parse_train_args(argc, argv, 2));
}

int cmd_plot(int argc, char** argv) {
  if (help_requested(argc, argv, 2)) {
    std::fputs("usage: lattice plot --metrics-file F.jsonl --output F.svg\n"
               "The loss curve (training, and validation where evaluated) of a lattice train --metrics-file.\n",
               stdout);
    return 0;
  }
  SimpleFlags f = parse_simple_flags(argc, argv, 2, {"metrics-file", "output"}, {});
  write_loss_plot_svg(f.required("metrics-file"), f.required("output"));
  std::fprintf(stderr, "wrote %s\n", f.required("output").c_str());
  return 0;
}

}  // namespace lattice

namespace {

const char* kUsage =
    "usage: lattice <command> [flags]\n"
    "commands:\n"
    "  train       train a GPT model (lattice train --help lists the flags)\n"
    "  preprocess  jsonl -> Megatron .bin/.idx dataset\n"
    "  merge-datasets  concatenate .bin/.idx datasets into one\n"
    "  generate    sample text from a checkpoint\n"
    "  serve       serve text generation over HTTP (Megatron's PUT /api, OpenAI's /v1/completions and\n"
    "              /v1/chat/completions)\n"
    "  chat-template  a model's chat template applied to a conversation (apply_chat_template's text)\n"
    "  convert     HuggingFace model (GPT-2, Llama, Qwen, Mistral, Mixtral, DeepSeek, GLM-4.5, Nemotron-H,\n"
    "              GPT-OSS, ...) <-> lattice checkpoint\n"
    "  data        inspect a dataset: 'data samples' (the training sample order), 'data info'\n"
    "  plot        loss curve (SVG) from a --metrics-file\n"
    "  schedule    the learning-rate/weight-decay schedule of a train command line (CSV, --plot SVG)\n"
    "'lattice <command> --help' lists a command's flags; 'lattice --version' prints the version.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("lattice %s\n", LATTICE_VERSION);
    return 0;
  }
  const std::string cmd = argv[1];
  std::string program = "lattice ";
  program += cmd;
  lattice::install_crash_report(program.c_str());
  try {
    if (cmd == "train") return lattice::cmd_train(argc, argv);
    if (cmd == "preprocess") return lattice::run_preprocess(argc - 1, argv + 1);
    if (cmd == "merge-datasets") return lattice::run_merge_datasets(argc - 1, argv + 1);
    if (cmd == "tokenize") return lattice::cmd_tokenize(argc - 1, argv + 1);
    if (cmd == "generate") return lattice::cmd_generate(argc, argv);
    if (cmd == "serve") return lattice::cmd_serve(argc, argv);
    if (cmd == "convert") return lattice::cmd_convert(argc, argv);
    if (cmd == "data") return lattice::cmd_data(argc, argv);
    if (cmd == "plot") return lattice::cmd_plot(argc, argv);
    if (cmd == "schedule") return lattice::cmd_schedule(argc, argv);
    if (cmd == "chat-template") return lattice::cmd_chat_template(argc, argv);
    std::fprintf(stderr, "lattice: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const lattice::OutOfMemory& e) {
    // What a user can change: the activations scale with the micro-batch and shrink with
    // recomputation; the model state splits across tensor, pipeline and data-parallel ranks.
    const char* advice = cmd == "train"
                             ? "; lower --micro-batch-size, recompute activations (--recompute-granularity selective, "
                               "or full with --recompute-method uniform --recompute-num-layers 1), or split the model "
                               "(--tensor-model-parallel-size, --pipeline-model-parallel-size, "
                               "--use-distributed-optimizer); --dry-run prints each rank's estimate"
                             : "";
    std::fprintf(stderr, "lattice %s: error: %s%s\n", cmd.c_str(), e.what(), advice);
    return 1;
  } catch (const lattice::Error& e) {
    std::fprintf(stderr, "lattice %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lattice %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
