// `lattice preprocess`: jsonl -> Megatron .bin/.idx, as Megatron's tools/preprocess_data.py.
//   lattice preprocess --input F.jsonl[.gz] --json-keys text [KEY ...]
//                      --tokenizer-type {ByteTokenizer,GPT2BPETokenizer,HuggingFaceTokenizer,NullTokenizer}
//                      [--vocab-file F --merge-file F | --tokenizer-model PATH | --vocab-size N]
//                      --output-prefix P [--append-eod] [--workers N] [--skip-bad-lines] [--keep-newlines]
// writes P_<key>_document.bin/.idx for every key: one document per jsonl line; a string value
// is one sequence, a list of strings is one sequence per non-empty string (Megatron's
// sentences); with --append-eod the end-of-document id is appended to the last sequence of
// every non-empty document. An empty document adds no sequence but still ends a document,
// as Megatron's builder does. Blank lines are skipped.
// The input is streamed (memory does not grow with its size), tokenized by N worker threads and
// written in input order, so the output is the same for every N.
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
  std::string tokenizer_model;  // --tokenizer-model (HuggingFaceTokenizer, the SentencePiece types)
  int64_t vocab_size = 0;       // --vocab-size (NullTokenizer)
  int64_t vocab_extra_ids = 0;  // --vocab-extra-ids (SentencePieceTokenizer)
  std::string tiktoken_pattern;  // TikTokenizer's --tiktoken-pattern, -num-special-tokens, -special-tokens
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> tiktoken_special_tokens;
  std::string output_prefix;
  bool append_eod = false;
  int workers = 1;
  // A bad line (malformed JSON, invalid UTF-8, not an object, missing key, wrong value type) is
  // an error naming its line; with skip_bad_lines it is counted, reported and left out.
  bool skip_bad_lines = false;
  // Megatron's --keep-newlines matters only with --split-sentences (NLTK), which lattice does not
  // do: text is always tokenized whole, newlines included. Accepted so Megatron commands run.
  bool keep_newlines = false;
  bool progress = true;  // progress line on stderr (see preprocess_progress.h)
  size_t chunk_bytes = size_t(1) << 20;  // input bytes per unit of work
};

struct PreprocessStats {
  int64_t documents = 0;        // documents written (jsonl lines that are not blank or skipped)
  int64_t empty_documents = 0;  // documents with no tokens under any key
  int64_t tokens = 0;           // tokens written, over all keys
  int64_t input_bytes = 0;      // uncompressed
  int64_t bad_lines = 0;        // skipped with skip_bad_lines
  std::string first_bad_line;   // the first skipped line's error
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
