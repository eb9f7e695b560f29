// lattice tokenize --tokenizer-type T [--vocab-file F --merge-file F | --tokenizer-model PATH [--vocab-extra-ids N]
//                  | --vocab-size N] [--tiktoken-pattern v1|v2 --tiktoken-num-special-tokens N
//                  --tiktoken-special-tokens "T ..."] [--jsonl]
//                  [--append-eod] [--decode]
//   default   all of stdin is one text; prints its ids on one line, separated by spaces
//   --jsonl   every stdin line is a JSON string; prints one line of ids per input line
//   --decode  stdin holds ids (any white space between them); writes the decoded bytes
#include "cli/tokenize.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/simple_flags.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace lattice {

namespace {

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  line.reserve(ids.size() * 6 + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  const SimpleFlags f =
      parse_simple_flags(argc, argv, 1, {"tokenizer-type", "vocab-file", "merge-file", "tokenizer-model", "vocab-size", "vocab-extra-ids",
                          "tiktoken-pattern", "tiktoken-num-special-tokens", "tiktoken-special-tokens"}, {"jsonl", "append-eod", "decode"});
  const double vocab_size = f.number("vocab-size", 0);
  if (vocab_size < 0 || vocab_size != double(int64_t(vocab_size)))
    LATTICE_FAIL() << "--vocab-size must be a positive integer, got " << f.get("vocab-size", "");
  const double extra_ids = f.number("vocab-extra-ids", 0);
  if (extra_ids < 0 || extra_ids != double(int64_t(extra_ids)))
    LATTICE_FAIL() << "--vocab-extra-ids must be a non-negative integer, got " << f.get("vocab-extra-ids", "");
  const auto tok = make_tokenizer({f.required("tokenizer-type"), f.get("vocab-file", ""), f.get("merge-file", ""),
                                   f.get("tokenizer-model", ""), int64_t(vocab_size), int64_t(extra_ids),
                                   f.get("tiktoken-pattern", ""), int64_t(f.number("tiktoken-num-special-tokens", 0)),
                                   f.words("tiktoken-special-tokens")});
  std::ios::sync_with_stdio(false);
  if (f.has("decode")) {
    std::vector<int32_t> ids;
    for (int64_t id; std::cin >> id;) {
      if (id < INT32_MIN || id > INT32_MAX) LATTICE_FAIL() << "stdin: token id " << id << " is out of range";
      ids.push_back(int32_t(id));
    }
    if (!std::cin.eof()) LATTICE_FAIL() << "stdin: expected token ids separated by white space";
    const std::string text = tok->decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (f.has("jsonl")) {
    std::string line;
    for (int64_t line_no = 1; std::getline(std::cin, line); ++line_no) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        LATTICE_FAIL() << "stdin line " << line_no << ": not a JSON string (byte " << e.byte << ")";
      }
      if (!j.is_string()) LATTICE_FAIL() << "stdin line " << line_no << ": expected a JSON string, got " << j.type_name();
      std::vector<int32_t> ids = tok->encode(j.get<std::string>());
      if (f.has("append-eod")) ids.push_back(tok->eod());
      print_ids(ids);
    }
    return 0;
  }
  const std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::vector<int32_t> ids = tok->encode(text);
  if (f.has("append-eod")) ids.push_back(tok->eod());
  print_ids(ids);
  return 0;
}

}  // namespace lattice
