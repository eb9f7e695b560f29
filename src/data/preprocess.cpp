// `lattice preprocess`: jsonl -> .bin/.idx. Three stages run at once:
//   reader (1 thread)   the input, in line-aligned chunks of ~1 MB (plain or gzip)
//   workers (--workers) parse + tokenize whole chunks (encode_chunk)
//   writer (this thread) appends the encoded chunks to the datasets in input order
// At most 2*workers+2 chunks are in flight (read and not yet written), which bounds memory
// whatever the input size, and the output does not depend on the worker count.
#include "data/preprocess.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <climits>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess_encode.h"
#include "data/preprocess_progress.h"
#include "data/preprocess_reader.h"
#include "data/tokenizer.h"

namespace lattice {

namespace {

// A value in 1..max (--workers: 4096; the tokenizers' sizes: up to int32).
int parse_positive_int(const std::string& flag, const std::string& v, long max = 4096) {
  size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < 1 || x > max)
    LATTICE_FAIL() << flag << ": expected a positive integer, got '" << v << "'";
  return int(x);
}

// The queues between the stages, under one lock (a chunk is ~1 MB of work: contention is nil).
struct Pipeline {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<LineChunk> todo;             // read, waiting for a worker
  std::map<int64_t, EncodedChunk> done;   // encoded, waiting for the writer
  int64_t in_flight = 0;                  // read and not yet written
  int64_t max_in_flight = 0;
  int64_t chunks_read = 0;
  bool reader_done = false;
  bool stop = false;                      // the writer failed: everyone leaves
  std::exception_ptr reader_error;
};

void reader_loop(Pipeline& p, JsonlChunkReader& in, size_t chunk_bytes) {
  try {
    while (true) {
      {
        std::unique_lock lk(p.mu);
        p.cv.wait(lk, [&] { return p.stop || p.in_flight < p.max_in_flight; });
        if (p.stop) return;
      }
      LineChunk chunk;
      if (!in.next(&chunk, chunk_bytes)) break;
      std::lock_guard lk(p.mu);
      p.todo.push_back(std::move(chunk));
      ++p.in_flight;
      ++p.chunks_read;
      p.cv.notify_all();
    }
  } catch (...) {
    std::lock_guard lk(p.mu);
    p.reader_error = std::current_exception();
  }
  std::lock_guard lk(p.mu);
  p.reader_done = true;
  p.cv.notify_all();
}

void worker_loop(Pipeline& p, const PreprocessOptions& opt, const Tokenizer& tok) {
  while (true) {
    LineChunk chunk;
    {
      std::unique_lock lk(p.mu);
      p.cv.wait(lk, [&] { return p.stop || !p.todo.empty() || p.reader_done; });
      if (p.stop || p.todo.empty()) return;
      chunk = std::move(p.todo.front());
      p.todo.pop_front();
    }
    EncodedChunk enc;
    try {
      enc = encode_chunk(chunk, opt, tok);
    } catch (const std::exception& e) {
      enc.index = chunk.index;
      enc.error = opt.input + " line " + std::to_string(chunk.first_line_no) + " onwards: " + e.what();
    }
    std::lock_guard lk(p.mu);
    p.done.emplace(enc.index, std::move(enc));
    p.cv.notify_all();
  }
}

// Joins the threads on every way out of preprocess(), telling them to stop first.
struct ThreadGroup {
  Pipeline& p;
  std::vector<std::thread> threads;
  ~ThreadGroup() {
    {
      std::lock_guard lk(p.mu);
      p.stop = true;
    }
    p.cv.notify_all();
    for (auto& t : threads) t.join();
  }
};

void write_chunk(const EncodedChunk& c, std::vector<std::unique_ptr<IndexedDatasetBuilder>>& builders,
                 PreprocessStats& stats) {
  for (size_t k = 0; k < builders.size(); ++k) {
    const EncodedChunk::Key& key = c.keys[k];
    const int32_t* tokens = key.tokens.data();
    size_t seq = 0;
    for (int32_t n_seqs : key.doc_seqs) {
      for (int32_t s = 0; s < n_seqs; ++s, ++seq) {
        builders[k]->add_item(tokens, key.seq_lengths[seq]);
        tokens += key.seq_lengths[seq];
      }
      builders[k]->end_document();
    }
    stats.tokens += int64_t(key.tokens.size());
  }
  stats.documents += c.documents;
  stats.empty_documents += c.empty_documents;
  stats.input_bytes += c.input_bytes;
  if (c.bad_lines && stats.bad_lines == 0) stats.first_bad_line = c.first_bad_line;
  stats.bad_lines += c.bad_lines;
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
    // A list flag: its inline value, else the words up to the next flag; at least one.
    auto values = [&]() -> std::vector<std::string> {
      std::vector<std::string> v;
      if (inline_value) {
        v.push_back(*inline_value);
      } else {
        while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) v.push_back(argv[++i]);
      }
      if (v.empty()) LATTICE_FAIL() << flag << ": missing value";
      return v;
    };
    auto a_switch = [&](bool* target) {
      if (inline_value) LATTICE_FAIL() << flag << " takes no value";
      *target = true;
    };
    if (flag == "--input") {
      opt.input = value();
    } else if (flag == "--json-keys") {
      opt.json_keys = values();
    } else if (flag == "--tokenizer-type") {
      opt.tokenizer_type = value();
    } else if (flag == "--vocab-file") {
      opt.vocab_file = value();
    } else if (flag == "--merge-file") {
      opt.merge_file = value();
    } else if (flag == "--tokenizer-model") {
      opt.tokenizer_model = value();
    } else if (flag == "--vocab-size") {
      opt.vocab_size = parse_positive_int("--vocab-size", value(), INT32_MAX - 1);
    } else if (flag == "--vocab-extra-ids") {
      const std::string v = value();
      opt.vocab_extra_ids = v == "0" ? 0 : parse_positive_int("--vocab-extra-ids", v, 1000000);
    } else if (flag == "--tiktoken-pattern") {
      opt.tiktoken_pattern = value();
    } else if (flag == "--tiktoken-num-special-tokens") {
      opt.tiktoken_num_special_tokens = parse_positive_int("--tiktoken-num-special-tokens", value(), INT32_MAX - 1);
    } else if (flag == "--tiktoken-special-tokens") {
      opt.tiktoken_special_tokens = values();
    } else if (flag == "--output-prefix") {
      opt.output_prefix = value();
    } else if (flag == "--workers") {
      opt.workers = parse_positive_int("--workers", value());
    } else if (flag == "--append-eod") {
      a_switch(&opt.append_eod);
    } else if (flag == "--skip-bad-lines") {
      a_switch(&opt.skip_bad_lines);
    } else if (flag == "--keep-newlines") {
      a_switch(&opt.keep_newlines);
    } else if (flag == "--no-progress") {
      bool off = false;
      a_switch(&off);
      opt.progress = false;
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
  LATTICE_CHECK(opt.workers >= 1 && opt.chunk_bytes >= 1) << "preprocess: workers " << opt.workers << ", chunk bytes "
                                                           << opt.chunk_bytes;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(
      {opt.tokenizer_type, opt.vocab_file, opt.merge_file, opt.tokenizer_model, opt.vocab_size, opt.vocab_extra_ids,
       opt.tiktoken_pattern, opt.tiktoken_num_special_tokens, opt.tiktoken_special_tokens});
  JsonlChunkReader in(opt.input);

  // Builders remove their temporary files if anything below throws.
  const IndexDTypeCode dtype = index_dtype_for_vocab(tok->vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : opt.json_keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(preprocess_output_prefix(opt, key), dtype));

  PreprocessStats stats;
  PreprocessProgress progress(in.file_bytes(), opt.progress);
  Pipeline p;
  p.max_in_flight = 2 * int64_t(opt.workers) + 2;
  {
    ThreadGroup threads{p, {}};
    threads.threads.emplace_back(reader_loop, std::ref(p), std::ref(in), opt.chunk_bytes);
    for (int w = 0; w < opt.workers; ++w)
      threads.threads.emplace_back(worker_loop, std::ref(p), std::cref(opt), std::cref(*tok));
    for (int64_t next = 0;; ++next) {
      EncodedChunk chunk;
      {
        std::unique_lock lk(p.mu);
        p.cv.wait(lk, [&] { return p.done.count(next) || p.reader_error || (p.reader_done && next == p.chunks_read); });
        auto it = p.done.find(next);
        if (it == p.done.end()) {
          if (p.reader_error) std::rethrow_exception(p.reader_error);
          break;  // every chunk written
        }
        chunk = std::move(it->second);
        p.done.erase(it);
      }
      if (!chunk.error.empty()) LATTICE_FAIL() << chunk.error;
      write_chunk(chunk, builders, stats);
      {
        std::lock_guard lk(p.mu);
        --p.in_flight;
      }
      p.cv.notify_all();
      progress.update(stats.documents, stats.input_bytes, in.bytes_read(), in.file_bytes_read());
    }
  }
  progress.finish();
  for (auto& b : builders) b->finalize();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

namespace {
const char* kUsage =
    "usage: lattice preprocess --input F.jsonl[.gz] [--json-keys KEY ...]\n"
    "                          --tokenizer-type {ByteTokenizer,GPT2BPETokenizer,HuggingFaceTokenizer,\n"
    "                                            SentencePieceTokenizer,GPTSentencePieceTokenizer,Llama2Tokenizer,\n"
    "                                            TikTokenizer,NullTokenizer}\n"
    "                          [--vocab-file F --merge-file F | --tokenizer-model PATH [--vocab-extra-ids N]\n"
    "                           | --vocab-size N]\n"
    "                          [TikTokenizer: --tiktoken-pattern v1|v2 [--tiktoken-num-special-tokens N]\n"
    "                           [--tiktoken-special-tokens T ...] [--vocab-size N]]\n"
    "                          --output-prefix P [--append-eod] [--workers N] [--skip-bad-lines]\n"
    "                          [--keep-newlines] [--no-progress]\n"
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
    std::string notes;
    if (s.empty_documents) notes += ", " + PreprocessProgress::group_thousands(s.empty_documents) + " empty";
    if (s.bad_lines)
      notes += ", " + PreprocessProgress::group_thousands(s.bad_lines) + " bad lines skipped (first: " +
               s.first_bad_line + ")";
    std::fprintf(stderr,
                 "lattice preprocess: %s documents%s, %s tokens, %.2f MB in %.2f s (%.2f MB/s, %d workers, "
                 "peak RSS %.0f MB) -> %s\n",
                 PreprocessProgress::group_thousands(s.documents).c_str(), notes.c_str(),
                 PreprocessProgress::group_thousands(s.tokens).c_str(), mb, s.seconds,
                 s.seconds > 0 ? mb / s.seconds : 0.0, opt.workers, peak_rss_mb(), outputs.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lattice preprocess: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace lattice
