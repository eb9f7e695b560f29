// `lattice preprocess`: jsonl -> .bin/.idx. The input is streamed in chunks of lines; each
// chunk is parsed and tokenized by --workers threads, then written in input order, so the
// output does not depend on the worker count and memory stays bounded by the chunk size.
#include "data/preprocess.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace lattice {

namespace {

constexpr size_t kChunkLines = 4096;
constexpr size_t kChunkBytes = size_t(64) << 20;

int parse_positive_int(const std::string& flag, const std::string& v) {
  size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < 1 || x > 4096)
    LATTICE_FAIL() << flag << ": expected a positive integer, got '" << v << "'";
  return int(x);
}

// One document: per key, its sequences (Megatron's sentences).
using EncodedDoc = std::vector<std::vector<std::vector<int32_t>>>;

struct EncodedLine {
  EncodedDoc doc;
  std::optional<std::string> error;
};

EncodedLine encode_line(const std::string& line, int64_t line_no, const PreprocessOptions& opt,
                        const Tokenizer& tok) {
  EncodedLine r;
  const std::string where = opt.input + " line " + std::to_string(line_no) + ": ";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    r.error = where + "malformed JSON at column " + std::to_string(e.byte);
    return r;
  }
  if (!j.is_object()) {
    r.error = where + "expected a JSON object, got " + j.type_name();
    return r;
  }
  r.doc.resize(opt.json_keys.size());
  for (size_t k = 0; k < opt.json_keys.size(); ++k) {
    const std::string& key = opt.json_keys[k];
    auto it = j.find(key);
    if (it == j.end()) {
      r.error = where + "missing key '" + key + "' (from --json-keys)";
      return r;
    }
    std::vector<const std::string*> sentences;
    if (it->is_string()) {
      sentences.push_back(it->get_ptr<const std::string*>());
    } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& e) { return e.is_string(); })) {
      for (const auto& e : *it) sentences.push_back(e.template get_ptr<const std::string*>());
    } else {
      r.error = where + "key '" + key + "' is " + it->type_name() + ", expected a string or a list of strings";
      return r;
    }
    auto& seqs = r.doc[k];
    for (const std::string* s : sentences) {
      std::vector<int32_t> ids = tok.encode(*s);
      if (!ids.empty()) seqs.push_back(std::move(ids));
    }
    if (opt.append_eod && !seqs.empty()) seqs.back().push_back(tok.eod());
  }
  return r;
}

}  // namespace

PreprocessOptions parse_preprocess_args(int argc, char** argv) {
  PreprocessOptions opt;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> inline_value;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc || std::strncmp(argv[i + 1], "--", 2) == 0) LATTICE_FAIL() << flag << ": missing value";
      return argv[++i];
    };
    if (flag == "--input") {
      opt.input = value();
    } else if (flag == "--json-keys") {
      opt.json_keys.clear();
      if (inline_value) {
        opt.json_keys.push_back(*inline_value);
      } else {
        while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) opt.json_keys.push_back(argv[++i]);
      }
      if (opt.json_keys.empty()) LATTICE_FAIL() << "--json-keys: missing value";
    } else if (flag == "--tokenizer-type") {
      opt.tokenizer_type = value();
    } else if (flag == "--vocab-file") {
      opt.vocab_file = value();
    } else if (flag == "--merge-file") {
      opt.merge_file = value();
    } else if (flag == "--output-prefix") {
      opt.output_prefix = value();
    } else if (flag == "--workers") {
      opt.workers = parse_positive_int("--workers", value());
    } else if (flag == "--append-eod") {
      if (inline_value) LATTICE_FAIL() << "--append-eod takes no value";
      opt.append_eod = true;
    } else {
      LATTICE_FAIL() << "unknown flag '" << argv[i] << "' (see lattice preprocess --help)";
    }
  }
  if (opt.input.empty()) LATTICE_FAIL() << "--input is required";
  if (opt.json_keys.empty()) opt.json_keys = {"text"};  // Megatron's default
  if (opt.tokenizer_type.empty()) LATTICE_FAIL() << "--tokenizer-type is required";
  if (opt.output_prefix.empty()) LATTICE_FAIL() << "--output-prefix is required";
  return opt;
}

std::string preprocess_output_prefix(const PreprocessOptions& opt, const std::string& key) {
  return opt.output_prefix + "_" + key + "_document";
}

PreprocessStats preprocess(const PreprocessOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(opt.tokenizer_type, opt.vocab_file, opt.merge_file);

  struct stat st {};
  if (::stat(opt.input.c_str(), &st) != 0) LATTICE_FAIL() << opt.input << ": cannot open: " << std::strerror(errno);
  if (S_ISDIR(st.st_mode)) LATTICE_FAIL() << opt.input << ": is a directory, expected a .jsonl file";
  std::ifstream in(opt.input, std::ios::binary);
  if (!in) LATTICE_FAIL() << opt.input << ": cannot open: " << std::strerror(errno);

  // Builders remove their temporary files if anything below throws.
  const IndexDTypeCode dtype = index_dtype_for_vocab(tok->vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : opt.json_keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(preprocess_output_prefix(opt, key), dtype));

  PreprocessStats stats;
  std::vector<std::string> lines;
  std::vector<int64_t> line_nos;
  std::vector<EncodedLine> encoded;
  int64_t line_no = 0;
  std::string line;
  bool eof = false;
  while (!eof) {
    lines.clear();
    line_nos.clear();
    size_t chunk_bytes = 0;
    while (lines.size() < kChunkLines && chunk_bytes < kChunkBytes) {
      if (!std::getline(in, line)) {
        eof = true;
        break;
      }
      ++line_no;
      stats.input_bytes += int64_t(line.size()) + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      chunk_bytes += line.size();
      lines.push_back(std::move(line));
      line_nos.push_back(line_no);
    }
    if (in.bad()) LATTICE_FAIL() << opt.input << ": read failed at line " << line_no + 1;

    const int64_t n = int64_t(lines.size());
    encoded.assign(size_t(n), EncodedLine{});
#pragma omp parallel for num_threads(opt.workers) schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) {
      try {
        encoded[i] = encode_line(lines[i], line_nos[i], opt, *tok);
      } catch (const std::exception& e) {
        encoded[i].error = opt.input + " line " + std::to_string(line_nos[i]) + ": " + e.what();
      }
    }

    for (int64_t i = 0; i < n; ++i) {
      if (encoded[i].error) LATTICE_FAIL() << *encoded[i].error;
      for (size_t k = 0; k < builders.size(); ++k) {
        for (const auto& seq : encoded[i].doc[k]) {
          builders[k]->add_item(seq.data(), int64_t(seq.size()));
          stats.tokens += int64_t(seq.size());
        }
        builders[k]->end_document();
      }
      ++stats.documents;
    }
  }
  for (auto& b : builders) b->finalize();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

namespace {
const char* kUsage =
    "usage: lattice preprocess --input F.jsonl [--json-keys KEY ...] --tokenizer-type ByteTokenizer\n"
    "                          --output-prefix P [--append-eod] [--workers N] [--vocab-file F] [--merge-file F]\n"
    "writes P_<KEY>_document.bin/.idx (Megatron's indexed dataset) for every key (default: text)\n";
}  // namespace

int run_preprocess(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  try {
    const PreprocessOptions opt = parse_preprocess_args(argc, argv);
    const PreprocessStats s = preprocess(opt);
    const double mb = double(s.input_bytes) / 1e6;
    std::string outputs;
    for (const std::string& key : opt.json_keys)
      outputs += (outputs.empty() ? "" : ", ") + preprocess_output_prefix(opt, key) + ".{bin,idx}";
    std::fprintf(stderr, "lattice preprocess: %lld documents, %lld tokens, %.2f MB in %.2f s (%.2f MB/s) -> %s\n",
                 (long long)s.documents, (long long)s.tokens, mb, s.seconds, s.seconds > 0 ? mb / s.seconds : 0.0,
                 outputs.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lattice preprocess: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace lattice
