// `lattice preprocess`: jsonl -> Megatron .bin/.idx, as Megatron's tools/preprocess_data.py.
//   lattice preprocess --input F.jsonl --json-keys text [KEY ...] --tokenizer-type ByteTokenizer
//                      --output-prefix P [--append-eod] [--workers N] [--vocab-file F --merge-file F]
// writes P_<key>_document.bin/.idx for every key: one document per jsonl line; a string value
// is one sequence, a list of strings is one sequence per non-empty string (Megatron's
// sentences); with --append-eod the end-of-document id is appended to the last sequence of
// every non-empty document. An empty document adds no sequence but still ends a document,
// as Megatron's builder does. Blank lines are skipped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

struct PreprocessOptions {
  std::string input;
  std::vector<std::string> json_keys;
  std::string tokenizer_type;
  std::string vocab_file, merge_file;
  std::string output_prefix;
  bool append_eod = false;
  int workers = 1;
};

struct PreprocessStats {
  int64_t documents = 0;   // jsonl lines read (not blank)
  int64_t tokens = 0;      // tokens written, over all keys
  int64_t input_bytes = 0;
  double seconds = 0;
};

// Parses the flags after the subcommand (argv[0] is the subcommand name and is skipped).
// Throws lattice::Error naming the flag on an unknown flag, a missing value or a missing
// required flag.
PreprocessOptions parse_preprocess_args(int argc, char** argv);

// Output prefix of one key: P_<key>_document.
std::string preprocess_output_prefix(const PreprocessOptions& opt, const std::string& key);

// Runs the conversion; throws lattice::Error (naming the file and, for bad input, the line)
// and leaves no output files behind on failure.
PreprocessStats preprocess(const PreprocessOptions& opt);

// The subcommand: parse, run, print a summary line to stderr; on error prints
// "lattice preprocess: error: <message>" to stderr and returns 1. argv[0] is "preprocess".
int run_preprocess(int argc, char** argv);

}  // namespace lattice
