#include "data/gpt_dataset.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_index_cache.h"
#include "data/numpy_random.h"

namespace lattice {

const char* split_name(Split s) {
  switch (s) {
    case Split::train: return "train";
    case Split::valid: return "valid";
    case Split::test: return "test";
  }
  return "?";
}

Split parse_split_name(const std::string& name, const char* flag) {
  if (name == "train") return Split::train;
  if (name == "valid") return Split::valid;
  if (name == "test") return Split::test;
  LATTICE_FAIL() << "--" << flag << " must be train, valid or test, got '" << name << "'";
}

std::array<SplitRange, 3> split_ranges(const std::string& split, int64_t num_sequences) {
  // Megatron reads the numbers with the regex [.0-9]+; lattice takes them separated by
  // ',' (or '/', as old Megatron scripts write) and rejects anything else.
  std::vector<double> w;
  std::string tok;
  auto finish = [&] {
    char* end = nullptr;
    const double v = tok.empty() ? -1.0 : std::strtod(tok.c_str(), &end);
    if (tok.empty() || tok.find_first_not_of("0123456789.") != std::string::npos || *end != '\0' ||
        !std::isfinite(v))
      LATTICE_FAIL() << "--split '" << split << "': expected up to 3 non-negative numbers separated by commas, e.g. 969,30,1";
    w.push_back(v);
    tok.clear();
  };
  for (char c : split) {
    if (c == ',' || c == '/') finish();
    else tok += c;
  }
  finish();
  if (w.size() > 3) LATTICE_FAIL() << "--split '" << split << "': more than 3 numbers (train,valid,test)";
  w.resize(3, 0.0);
  // Python's sum() and the cumulative bookends, in Megatron's order of additions.
  const double total = (w[0] + w[1]) + w[2];
  if (!(total > 0)) LATTICE_FAIL() << "--split '" << split << "': the weights sum to 0";
  double bookend[4] = {0.0, 0.0, 0.0, 0.0};
  for (int i = 0; i < 3; ++i) bookend[i + 1] = bookend[i] + w[i] / total;
  std::array<SplitRange, 3> r{};
  for (int i = 0; i < 3; ++i) {
    if (bookend[i + 1] <= bookend[i]) continue;  // weight 0: no dataset for this split
    r[i].present = true;
    // std::nearbyint in the default rounding mode is Python's round(): half to even.
    r[i].begin = int64_t(std::nearbyint(bookend[i] * double(num_sequences)));
    r[i].end = int64_t(std::nearbyint(bookend[i + 1] * double(num_sequences)));
  }
  return r;
}

namespace {

// sample_index: walk S+1 tokens per sample through document_index; each row is where
// the next sample starts, which is the last token of the previous one (one token of
// overlap). Empty sequences are stepped over.
std::vector<int64_t> build_sample_index(const std::vector<int32_t>& lengths,
                                        const std::vector<int32_t>& document_index,
                                        int64_t num_samples, int64_t S) {
  std::vector<int64_t> rows(size_t(2 * (num_samples + 1)));
  const int64_t last = int64_t(document_index.size()) - 1;
  int64_t pos = 0, off = 0;
  rows[0] = rows[1] = 0;
  for (int64_t k = 1; k <= num_samples; ++k) {
    int64_t remaining = S + 1;
    for (;;) {
      const int64_t avail = lengths[size_t(document_index[size_t(pos)])] - off;
      if (remaining <= avail) {
        off += remaining - 1;
        break;
      }
      remaining -= avail;
      // num_samples = (E*T - 1) / S guarantees the walk ends inside the data.
      LATTICE_CHECK(pos < last) << "GPTDataset: sample index walk ran past the documents";
      ++pos;
      off = 0;
    }
    rows[size_t(2 * k)] = pos;
    rows[size_t(2 * k + 1)] = off;
  }
  return rows;
}

// E copies of the split's sequence ids, shuffled (Megatron's _build_document_index).
void append_document_index(std::vector<int32_t>& out, const SplitRange& range, int64_t epochs,
                           NumpyRandomState& rng) {
  const size_t start = out.size();
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t s = range.begin; s < range.end; ++s) out.push_back(int32_t(s));
  rng.shuffle(out.data() + start, int64_t(out.size() - start));
}

void append_shuffle_index(std::vector<int64_t>& out, int64_t begin, int64_t end, NumpyRandomState& rng) {
  const size_t start = out.size();
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  rng.shuffle(out.data() + start, int64_t(out.size() - start));
}

}  // namespace

namespace {

// "N samples", or "one epoch" for kOneEpoch (in errors).
std::string samples_text(int64_t num_samples) {
  return num_samples == kOneEpoch ? std::string("one epoch") : std::to_string(num_samples) + " samples";
}

}  // namespace

GPTDatasetIndices build_gpt_dataset_indices(const std::vector<int32_t>& lengths,
                                            const SplitRange& range, int64_t num_samples,
                                            int64_t S, uint64_t seed, const std::string& what) {
  LATTICE_CHECK(S > 0 && (num_samples >= 0 || num_samples == kOneEpoch)) << what << ": seq_length " << S << ", num_samples " << num_samples;
  if (seed > 0xffffffffULL)
    LATTICE_FAIL() << "--seed " << seed << " is too large for the dataset shuffle (numpy's RandomState takes seeds below 2^32)";
  LATTICE_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= int64_t(lengths.size()))
      << what << ": split range [" << range.begin << ", " << range.end << ")";
  if (range.end - range.begin > int64_t(INT32_MAX))
    LATTICE_FAIL() << what << ": more than 2^31 sequences in one split";
  int64_t T = 0;  // tokens per epoch
  for (int64_t s = range.begin; s < range.end; ++s) T += lengths[size_t(s)];
  if (T == 0)
    LATTICE_FAIL() << what << ": the split has no tokens (" << (range.end - range.begin) << " sequences) but "
                   << samples_text(num_samples)
                   << " are needed (change --split, or --eval-iters 0 to skip evaluation)";
  if (num_samples == kOneEpoch && T <= S)
    LATTICE_FAIL() << what << ": one epoch of the split is " << T << " tokens, too few for one sample of "
                   << S << " + 1 (--seq-length " << S << ")";

  GPTDatasetIndices x;
  x.num_epochs = 1;
  while (num_samples != kOneEpoch && x.num_epochs * T < num_samples * S + 1) ++x.num_epochs;
  const int64_t E = x.num_epochs;
  int64_t sans_final = 0;
  if (E > 1) {
    // Megatron shuffles the last epoch on its own when only a small part of it is used,
    // so that part is not drawn from the first epochs' samples.
    sans_final = ((E - 1) * T - 1) / S;
    const int64_t from_final = num_samples - sans_final;
    const int64_t per_epoch = (T - 1) / S;
    LATTICE_CHECK(from_final >= 0 && from_final <= per_epoch + 1) << what << ": epoch arithmetic";
    x.separate_final_epoch = from_final < int64_t(0.80 * double(per_epoch));
  }

  NumpyRandomState rng{uint32_t(seed)};
  x.document_index.reserve(size_t(E * (range.end - range.begin)));
  if (x.separate_final_epoch) {
    append_document_index(x.document_index, range, E - 1, rng);
    append_document_index(x.document_index, range, 1, rng);
  } else {
    append_document_index(x.document_index, range, E, rng);
  }
  const int64_t n = (E * T - 1) / S;
  x.sample_index = build_sample_index(lengths, x.document_index, n, S);
  x.shuffle_index.reserve(size_t(n));
  if (x.separate_final_epoch) {
    append_shuffle_index(x.shuffle_index, 0, sans_final, rng);
    append_shuffle_index(x.shuffle_index, sans_final, n, rng);
  } else {
    append_shuffle_index(x.shuffle_index, 0, n, rng);
  }
  return x;
}

namespace {

std::string default_cache_dir(const std::string& prefix) {
  std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  return (dir / "cache" / "GPTDataset_indices").string();
}

// Everything the indices depend on; its hash names the cache file.
std::string describe(const IndexedDataset& ds, Split split, const SplitRange& range,
                     int64_t num_samples, const GPTDatasetConfig& c) {
  const auto& lengths = ds.sequence_lengths();
  const uint64_t lengths_hash = fnv1a64(lengths.data() + range.begin,
                                        size_t(range.end - range.begin) * sizeof(int32_t));
  std::error_code ec;
  const auto abs = std::filesystem::absolute(ds.prefix(), ec);
  nlohmann::ordered_json j = {{"class", "GPTDataset"},
                              {"dataset_path", ec ? ds.prefix() : abs.lexically_normal().string()},
                              {"index_split", split_name(split)},
                              {"split_range", {range.begin, range.end}},
                              {"sequence_lengths_fnv1a64", lengths_hash},
                              {"num_samples", num_samples == kOneEpoch ? nlohmann::ordered_json(nullptr)
                                                                       : nlohmann::ordered_json(num_samples)},
                              {"sequence_length", c.seq_length},
                              {"random_seed", c.random_seed},
                              {"add_extra_token_to_sequence", true}};
  return j.dump();
}

// A cache file with a valid checksum was still written by someone: check that every
// index points inside the data before sample() trusts it.
bool indices_in_range(const GPTDatasetIndices& x, const SplitRange& range) {
  for (int32_t s : x.document_index)
    if (s < range.begin || s >= range.end) return false;
  const int64_t nd = int64_t(x.document_index.size()), n = x.num_samples();
  for (size_t i = 0; i < x.sample_index.size(); i += 2)
    if (x.sample_index[i] < 0 || x.sample_index[i] >= nd || x.sample_index[i + 1] < 0) return false;
  for (int64_t k : x.shuffle_index)
    if (k < 0 || k >= n) return false;
  return true;
}

}  // namespace

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split,
                       const SplitRange& range, int64_t num_samples, const GPTDatasetConfig& config)
    : ds_(std::move(dataset)), split_(split), S_(config.seq_length) {
  LATTICE_CHECK(ds_) << "GPTDataset: no dataset";
  const std::string what = ds_->prefix() + " (" + split_name(split) + " split)";
  if (!range.present)
    LATTICE_FAIL() << what << ": the split has weight 0 but "
                   << samples_text(num_samples)
                   << " are needed";
  description_ = describe(*ds_, split, range, num_samples, config);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                (unsigned long long)fnv1a64(description_.data(), description_.size()));
  const std::string dir = config.path_to_cache.empty() ? default_cache_dir(ds_->prefix()) : config.path_to_cache;
  cache_file_ = (std::filesystem::path(dir) /
                 (std::string(hash) + "-GPTDataset-" + split_name(split) + "-indices.bin")).string();

  IndexCacheRead cached = read_gpt_index_cache(cache_file_, description_);
  if (cached.status == IndexCacheRead::ok && !indices_in_range(cached.indices, range)) {
    cached.status = IndexCacheRead::invalid;
    cached.reason = "index values out of range";
  }
  if (cached.status == IndexCacheRead::ok) {
    indices_ = std::move(cached.indices);
    loaded_from_cache_ = true;
    return;
  }
  if (cached.status == IndexCacheRead::invalid)
    log_warn("index cache " + cache_file_ + " is invalid: " + cached.reason + "; rebuilding it");
  indices_ = build_gpt_dataset_indices(ds_->sequence_lengths(), range, num_samples, S_,
                                       config.random_seed, what);
  try {
    write_gpt_index_cache(cache_file_, description_, indices_);
  } catch (const Error& e) {
    // A read-only data directory should not stop training: the indices are in memory.
    log_warn(std::string("not caching the dataset indices: ") + e.what() +
             " (set --data-cache-path to a writable directory)");
    cache_file_.clear();
  }
}

void GPTDataset::sample(int64_t index, int32_t* out) const {
  if (index < 0 || index >= size())
    LATTICE_FAIL() << ds_->prefix() << " (" << split_name(split_) << " split): sample " << index
                   << " is out of range: the index holds " << size() << " samples";
  const int64_t k = indices_.shuffle_index[size_t(index)];
  const int64_t* row = indices_.sample_index.data() + 2 * k;
  const int64_t p0 = row[0], o0 = row[1], p1 = row[2], o1 = row[3];
  const auto& lengths = ds_->sequence_lengths();
  int64_t written = 0;
  for (int64_t p = p0; p <= p1; ++p) {
    const int32_t seq = indices_.document_index[size_t(p)];
    const int64_t begin = p == p0 ? o0 : 0;
    const int64_t end = p == p1 ? o1 + 1 : lengths[size_t(seq)];
    if (end <= begin) continue;
    LATTICE_CHECK(written + (end - begin) <= S_ + 1) << "GPTDataset: sample " << index << " too long";
    ds_->get(seq, begin, end - begin, out + written);
    written += end - begin;
  }
  LATTICE_CHECK(written == S_ + 1) << "GPTDataset: sample " << index << " has " << written
                                   << " tokens, expected " << S_ + 1;
}

}  // namespace lattice
