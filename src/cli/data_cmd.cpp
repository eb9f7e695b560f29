// `lattice data samples --data-path ... --seq-length S --num-samples N [--seed X]
//   [--split a,b,c] [--split-name train|valid|test] [--data-cache-path DIR]
//   [--train-iters I --global-batch-size G [--eval-interval E --eval-iters K]]`
// prints the first N samples of a split in the order training consumes them, one JSON
// list of S+1 token ids per line. The split is built by the trainer's own code
// (make_split_data) for N samples, or, given the training flags, for the count
// training builds it for (the count changes the epochs and so the order).
//
// `lattice data info --data-path P [--split a,b,c] [--seq-length S]` prints a summary.
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cli/data_cmd.h"
#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/training_data.h"

namespace lattice {

namespace {

const char* kDataUsage =
    "usage: lattice data samples --data-path [w1] P1 [w2 P2 ...] --seq-length S --num-samples N\n"
    "                            [--seed X] [--split a,b,c] [--split-name train|valid|test]\n"
    "                            [--data-cache-path DIR] [--train-data-path ...] [--valid-data-path ...]\n"
    "                            [--test-data-path ...] [--train-iters I --global-batch-size G\n"
    "                            [--eval-interval E] [--eval-iters K]]\n"
    "       lattice data info --data-path P [--split a,b,c] [--seq-length S]\n";

// --flag value, with the *-data-path flags taking every value up to the next --flag.
struct DataFlags {
  std::map<std::string, std::vector<std::string>> v;
  bool has(const std::string& k) const { return v.count(k) != 0; }
  std::string str(const std::string& k, const std::string& fallback) const {
    return has(k) ? v.at(k)[0] : fallback;
  }
  int64_t num(const std::string& k, int64_t fallback) const {
    if (!has(k)) return fallback;
    const std::string& s = v.at(k)[0];
    char* end = nullptr;
    const long long x = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') LATTICE_FAIL() << "--" << k << ": '" << s << "' is not an integer";
    return x;
  }
};

DataFlags parse(int argc, char** argv, int first, const std::vector<std::string>& known) {
  DataFlags f;
  for (int i = first; i < argc;) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) LATTICE_FAIL() << "unexpected argument '" << a << "'";
    const std::string name = a.substr(2);
    bool ok = false;
    for (const auto& k : known) ok = ok || k == name;
    if (!ok) LATTICE_FAIL() << "unknown flag --" << name << " (lattice data --help lists the flags)";
    const bool list = name.size() >= 9 && name.compare(name.size() - 9, 9, "data-path") == 0;
    std::vector<std::string>& vals = f.v[name];
    for (++i; i < argc && std::strncmp(argv[i], "--", 2) != 0; ++i) {
      vals.push_back(argv[i]);
      if (!list) {
        ++i;
        break;
      }
    }
    if (vals.empty()) LATTICE_FAIL() << "--" << name << " needs a value";
  }
  return f;
}

int64_t positive(const DataFlags& f, const char* flag) {
  if (!f.has(flag)) LATTICE_FAIL() << "--" << flag << " is required";
  const int64_t v = f.num(flag, 0);
  if (v <= 0) LATTICE_FAIL() << "--" << flag << " must be positive, got " << v;
  return v;
}

int cmd_samples(int argc, char** argv) {
  const DataFlags f = parse(argc, argv, 3,
                            {"data-path", "train-data-path", "valid-data-path", "test-data-path", "seq-length",
                             "num-samples", "seed", "split", "split-name", "data-cache-path", "train-iters",
                             "global-batch-size", "eval-interval", "eval-iters"});
  TrainArgs a;
  if (f.has("data-path")) a.data_path = f.v.at("data-path");
  if (f.has("train-data-path")) a.train_data_path = f.v.at("train-data-path");
  if (f.has("valid-data-path")) a.valid_data_path = f.v.at("valid-data-path");
  if (f.has("test-data-path")) a.test_data_path = f.v.at("test-data-path");
  a.seq_length = positive(f, "seq-length");
  const int64_t n = positive(f, "num-samples");
  const int64_t seed = f.num("seed", 1234);
  if (seed < 0) LATTICE_FAIL() << "--seed must be >= 0, got " << seed;
  a.seed = uint64_t(seed);
  a.split = f.str("split", a.split);
  a.data_cache_path = f.str("data-cache-path", "");
  const Split split = parse_split_name(f.str("split-name", "train"), "split-name");
  int64_t built_for = n;
  if (f.has("train-iters")) {
    const SampleCounts c = megatron_sample_counts(positive(f, "train-iters"), 0, f.num("eval-interval", 1000),
                                                  f.num("eval-iters", 100), positive(f, "global-batch-size"));
    built_for = split == Split::train ? c.train : split == Split::valid ? c.valid : c.test;
    if (n > built_for)
      LATTICE_FAIL() << "--num-samples " << n << " exceeds the " << built_for << " samples training builds the "
                     << split_name(split) << " split for";
  }
  // Token ids are not checked against a vocabulary here (0): any id is printed as it is.
  auto src = make_split_data(a, 0, split, built_for);
  if (!src)
    LATTICE_FAIL() << "the " << split_name(split) << " split is not built (weight 0 in --split "
                   << a.split << ", or no --" << split_name(split) << "-data-path)";
  std::vector<int32_t> buf(size_t(a.seq_length + 1));
  std::string line;
  for (int64_t i = 0; i < n; ++i) {
    src->sample(i, buf.data());
    line.assign(1, '[');
    for (size_t k = 0; k < buf.size(); ++k) {
      if (k) line += ',';
      line += std::to_string(buf[k]);
    }
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
  return 0;
}

int cmd_info(int argc, char** argv) {
  const DataFlags f = parse(argc, argv, 3, {"data-path", "split", "seq-length"});
  if (!f.has("data-path") || f.v.at("data-path").size() != 1)
    LATTICE_FAIL() << "--data-path: give one dataset prefix";
  const std::string prefix = f.v.at("data-path")[0];
  const IndexedDataset ds(prefix);
  const auto& lengths = ds.sequence_lengths();
  int64_t empty = 0, longest = 0;
  for (int32_t l : lengths) {
    empty += l == 0;
    longest = std::max<int64_t>(longest, l);
  }
  static const char* dtypes[9] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  const int code = int(ds.dtype_code());
  std::printf("prefix: %s\n", prefix.c_str());
  std::printf("dtype: %s\n", code >= 1 && code <= 8 ? dtypes[code] : "?");
  std::printf("documents: %lld\n", (long long)ds.num_documents());
  std::printf("sequences: %lld\n", (long long)ds.num_sequences());
  std::printf("tokens: %lld\n", (long long)ds.num_tokens());
  std::printf("empty sequences: %lld\n", (long long)empty);
  std::printf("longest sequence: %lld\n", (long long)longest);
  const std::string split = f.str("split", "969,30,1");
  const int64_t S = f.num("seq-length", 0);
  const auto ranges = split_ranges(split, ds.num_sequences());
  for (int i = 0; i < 3; ++i) {
    if (!ranges[i].present) {
      std::printf("split %s (--split %s): none\n", split_name(Split(i)), split.c_str());
      continue;
    }
    int64_t tokens = 0;
    for (int64_t s = ranges[i].begin; s < ranges[i].end; ++s) tokens += lengths[size_t(s)];
    std::printf("split %s (--split %s): sequences [%lld, %lld), %lld tokens", split_name(Split(i)),
                split.c_str(), (long long)ranges[i].begin, (long long)ranges[i].end, (long long)tokens);
    if (S > 0) std::printf(", %lld samples of %lld tokens per epoch", (long long)(tokens > 0 ? (tokens - 1) / S : 0), (long long)S);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int cmd_data(int argc, char** argv) {
  const std::string sub = argc > 2 ? argv[2] : "";
  if (sub == "samples") return cmd_samples(argc, argv);
  if (sub == "info") return cmd_info(argc, argv);
  if (sub == "--help" || sub == "-h") {
    std::fputs(kDataUsage, stdout);
    return 0;
  }
  LATTICE_FAIL() << (sub.empty() ? std::string("missing subcommand") : "unknown subcommand '" + sub + "'")
                 << ": use 'lattice data samples' or 'lattice data info' (lattice data --help)";
}

}  // namespace lattice
