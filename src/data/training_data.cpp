#include "data/training_data.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/gpt_index_cache.h"
#include "data/sft_dataset.h"

namespace lattice {

SampleCounts megatron_sample_counts(int64_t train_iters, int64_t train_samples, int64_t eval_interval,
                                    int64_t eval_iters, int64_t gbs) {
  LATTICE_CHECK(gbs > 0 && eval_interval > 0 && eval_iters >= 0) << "sample counts: GBS " << gbs
      << ", eval interval " << eval_interval << ", eval iters " << eval_iters;
  SampleCounts c;
  c.train = train_samples > 0 ? train_samples : train_iters * gbs;
  const int64_t iters = train_samples > 0 ? train_samples / gbs : train_iters;
  c.valid = (iters / eval_interval + 1) * eval_iters * gbs;
  c.test = eval_iters * gbs;
  return c;
}

BlendSpec parse_blend(const std::vector<std::string>& list, const char* flag) {
  BlendSpec b;
  auto number = [](const std::string& s) {
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    return !s.empty() && *end == '\0';
  };
  // One prefix, or prefixes without weights (none of the words a number: Megatron's list whose
  // weights do not parse), blended by their sizes.
  if (list.size() == 1 || (!list.empty() && std::none_of(list.begin(), list.end(), number))) {
    b.prefixes = list;
    return b;
  }
  if (list.empty() || list.size() % 2 != 0)
    LATTICE_FAIL() << "--" << flag << ": expected one prefix or weight/prefix pairs (w1 p1 w2 p2 ...), got "
                   << list.size() << " values";
  for (size_t i = 0; i < list.size(); i += 2) {
    char* end = nullptr;
    const double w = std::strtod(list[i].c_str(), &end);
    if (list[i].empty() || *end != '\0')
      LATTICE_FAIL() << "--" << flag << ": '" << list[i] << "' is not a weight (expected w1 p1 w2 p2 ...)";
    b.weights.push_back(w);
    b.prefixes.push_back(list[i + 1]);
  }
  normalize_blend_weights(b.weights, flag);  // rejects weights <= 0 with the flag's name
  return b;
}

std::vector<std::string> validation_set_prefixes(const std::vector<std::string>& list) {
  if (list.empty()) LATTICE_FAIL() << "--multiple-validation-sets needs --valid-data-path (its datasets are the sets)";
  for (const std::string& p : list) {
    char* end = nullptr;
    std::strtod(p.c_str(), &end);
    if (!p.empty() && *end == '\0')
      LATTICE_FAIL() << "--multiple-validation-sets: --valid-data-path takes no weights (each dataset is a set of its "
                        "own, evaluated alone), got " << p;
  }
  return list;
}

namespace {

struct Builder {
  const TrainArgs& args;
  int64_t vocab_size;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> open;
  std::map<std::string, std::shared_ptr<const SftConversations>> conversations = {};  // --sft's files
  std::optional<ChatTemplate> chat = {};                 // --sft's template and tokenizer, made once
  std::shared_ptr<const Tokenizer> tokenizer = {};

  // --sft: a JSONL file of conversations, read once for the three splits.
  std::shared_ptr<const SftConversations> sft_file(const std::string& path) {
    auto it = conversations.find(path);
    if (it != conversations.end()) return it->second;
    if (!chat) {
      tokenizer = args.get_tokenizer();
      chat = args.chat_template.empty() ? ChatTemplate::find_beside(args.tokenizer_model, "--tokenizer-model")
                                        : ChatTemplate::load(args.chat_template, "--chat-template");
      if (!chat)
        LATTICE_FAIL() << "--sft: the tokenizer's folder holds no chat template (chat_template.jinja or a "
                          "tokenizer_config.json chat_template); give --chat-template PATH";
    }
    return conversations[path] = std::make_shared<SftConversations>(path, tokenizer, *chat);
  }

  // Dataset `path` of a blend for one split: the split's part of it by --split (all of it when `whole`),
  // built for `samples` samples (kOneEpoch: the part once); nullptr when --split gives the split nothing.
  // With --sft, lines of a JSONL file packed as Megatron's SFTDataset packs them; else a GPTDataset.
  std::shared_ptr<const SampleSource> part(const std::string& path, Split split, bool whole, int64_t samples,
                                           std::string& desc) {
    const std::shared_ptr<const SftConversations> sft = args.sft ? sft_file(path) : nullptr;
    const std::shared_ptr<const IndexedDataset> ds = args.sft ? nullptr : dataset(path);
    const int64_t units = sft ? sft->size() : ds->num_sequences();
    const SplitRange range = whole ? SplitRange{true, 0, units} : split_ranges(args.split, units)[size_t(split)];
    // Megatron builds no dataset for a split of weight 0 (its evaluation is skipped).
    if (!range.present || (sft && range.end <= range.begin)) {
      if (split == Split::train)
        LATTICE_FAIL() << "--split " << args.split << " gives the train split weight 0: none of the " << units
                       << (sft ? " conversation lines of " : " sequences of ") << path;
      return nullptr;
    }
    if (sft) {
      const int64_t cp = args.context_parallel_size;
      auto s = std::make_shared<SftSamples>(sft, range.begin, range.end, args.seq_length, cp > 1 ? 2 * cp : 1, samples);
      desc = "SFT conversations of " + path + ", lines [" + std::to_string(range.begin + 1) + ", " +
             std::to_string(range.end) + "] of " + std::to_string(units) + ", " + std::to_string(s->size()) + " samples";
      return s;
    }
    auto g = std::make_shared<GPTDataset>(ds, split, range, samples, config());
    desc = path + " sequences [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + "), " +
           std::to_string(g->size()) + " samples" + (g->loaded_from_cache() ? " (index cache hit)" : "");
    return g;
  }

  std::shared_ptr<const IndexedDataset> dataset(const std::string& prefix) {
    auto it = open.find(prefix);
    if (it != open.end()) return it->second;
    auto ds = std::make_shared<IndexedDataset>(prefix);
    if (vocab_size > 0) ds->validate_token_ids(vocab_size);
    return open[prefix] = ds;
  }

  GPTDatasetConfig config() const {
    GPTDatasetConfig c;
    c.seq_length = args.seq_length;
    c.random_seed = args.seed;
    c.path_to_cache = args.data_cache_path;
    return c;
  }

  // One split of a blend; `whole` uses every sequence (per-split data paths).
  std::shared_ptr<const SampleSource> build(const BlendSpec& blend, Split split, int64_t n, bool whole,
                                            const char* flag, std::string& summary) {
    if (n == 0) return nullptr;
    // --full-validation: one epoch of the split (a blend's weights say how to mix samples, not what
    // "all of them" would be; Megatron refuses the same). Datasets without weights are one epoch each.
    const bool listed = blend.weights.empty() && blend.prefixes.size() > 1;
    if (n == kOneEpoch && blend.prefixes.size() > 1 && !listed)
      LATTICE_FAIL() << "--full-validation: the " << split_name(split) << " split blends "
                     << blend.prefixes.size() << " datasets with weights (--" << flag
                     << "); it evaluates datasets whole: give them without weights, or --valid-data-path with "
                        "--multiple-validation-sets to evaluate each";
    std::vector<std::shared_ptr<const SampleSource>> parts;
    // A split's own paths (whole) holding one prefix are that dataset, its weight aside (Megatron's
    // "blend consists of a single prefix"); --data-path's "w p" stays a blend of one, as Megatron's.
    const bool one = whole && blend.prefixes.size() == 1;
    const std::vector<double> w =
        blend.weights.empty() || one ? std::vector<double>{} : normalize_blend_weights(blend.weights, flag);
    // Samples each dataset is built for: its share of a weighted blend; one epoch of each listed
    // dataset (Megatron's sizes None when no weights are given); n for one dataset.
    const std::vector<int64_t> per = listed ? std::vector<int64_t>(blend.prefixes.size(), kOneEpoch)
                                     : w.empty() ? std::vector<int64_t>{n}
                                                 : blend_samples_per_dataset(w, n, args.mid_level_dataset_surplus);
    for (size_t d = 0; d < blend.prefixes.size(); ++d) {
      std::string desc;
      parts.push_back(part(blend.prefixes[d], split, whole, per[d], desc));
      if (!parts.back()) return nullptr;
      summary += std::string(" > ") + split_name(split) + ": " + desc + (listed ? " (one epoch)" : "") +
                 (w.empty() ? "" : ", weight " + std::to_string(w[d])) + "\n";
    }
    if (listed) {
      // Megatron's blend of datasets given without weights: each weighs its one epoch's samples, and
      // the blend holds min(n, all of them) (all for --full-validation).
      int64_t total = 0;
      for (const auto& part : parts) total += part->size();
      if (n != kOneEpoch && n > total)
        LATTICE_FAIL() << "--" << flag << ": the " << parts.size() << " datasets given without weights hold " << total
                       << " samples in one epoch of the " << split_name(split) << " split, fewer than the " << n
                       << " the run reads (Megatron takes each once when no weights are given); give weights "
                          "(w1 p1 w2 p2 ...) to draw more, or "
                       << (split == Split::train ? "train for fewer samples (--train-iters, --train-samples)"
                           : split == Split::valid
                               ? "evaluate fewer samples (--eval-iters, --eval-interval, or --full-validation)"
                               : "evaluate fewer samples (--eval-iters)");
      std::vector<double> sizes;
      for (const auto& part : parts) sizes.push_back(double(part->size()));
      summary += std::string(" > ") + split_name(split) + ": the " + std::to_string(parts.size()) +
                 " datasets blended by their sizes, " + std::to_string(n == kOneEpoch ? total : n) + " samples\n";
      return std::make_shared<BlendedDataset>(parts, normalize_blend_weights(sizes, flag), n == kOneEpoch ? total : n);
    }
    if (w.empty() || n == kOneEpoch) return parts[0];
    return std::make_shared<BlendedDataset>(parts, w, n);
  }
};

}  // namespace

namespace {

// One split; b keeps the datasets open (and their token ids checked once) across splits.
std::shared_ptr<const SampleSource> build_split(Builder& b, Split split, int64_t n, std::string& out) {
  const TrainArgs& args = b.args;
  const int64_t vocab_size = b.vocab_size;
  if (n == 0) return nullptr;
  if (args.mock_data) {
    LATTICE_CHECK(n != kOneEpoch) << "--full-validation: --mock-data has no whole split";
    // Each split its own synthetic stream, so evaluation never sees training samples.
    static const char* names[3] = {"train", "valid", "test"};
    const uint64_t seed = split == Split::train ? args.seed : args.seed ^ fnv1a64(names[int(split)], 5);
    out += std::string(" > ") + split_name(split) + ": mock data\n";
    return std::make_shared<MockSamples>(vocab_size, args.seq_length, seed);
  }
  const bool per_split = !args.train_data_path.empty() || !args.valid_data_path.empty() ||
                         !args.test_data_path.empty();
  if (per_split) {
    if (!args.data_path.empty())
      LATTICE_FAIL() << "--data-path and --train-data-path/--valid-data-path/--test-data-path are exclusive";
    if (args.train_data_path.empty())
      LATTICE_FAIL() << "--train-data-path is required with --valid-data-path/--test-data-path";
    const std::vector<std::string>* lists[3] = {&args.train_data_path, &args.valid_data_path,
                                                &args.test_data_path};
    static const char* flags[3] = {"train-data-path", "valid-data-path", "test-data-path"};
    const auto& list = *lists[int(split)];
    if (list.empty()) return nullptr;  // Megatron: no --valid-data-path, no validation
    return b.build(parse_blend(list, flags[int(split)]), split, n, true, flags[int(split)], out);
  }
  if (args.data_path.empty()) LATTICE_FAIL() << "no training data: give --data-path PREFIX or --mock-data";
  const BlendSpec blend = parse_blend(args.data_path, "data-path");
  split_ranges(args.split, 0);  // a malformed --split fails before any file is opened
  return b.build(blend, split, n, false, "data-path", out);
}

}  // namespace

std::shared_ptr<const SampleSource> make_split_data(const TrainArgs& args, int64_t vocab_size,
                                                    Split split, int64_t n, std::string* summary) {
  Builder b{args, vocab_size, {}};
  std::string ignored;
  return build_split(b, split, n, summary ? *summary : ignored);
}

TrainingData make_training_data(const TrainArgs& args, int64_t vocab_size) {
  TrainingData t;
  t.counts = megatron_sample_counts(args.train_iters, args.train_samples, args.eval_interval,
                                    args.eval_iters, args.global_batch_size);
  if (args.rampup()) {  // the ramp's iterations (update_train_iters); its last batch may pass --train-samples
    t.counts.train = std::max(t.counts.train, args.consumed_after(args.train_iters));
    t.counts.valid = (args.train_iters / args.eval_interval + 1) * args.eval_iters * args.global_batch_size;
  }
  Builder b{args, vocab_size, {}};
  t.train = build_split(b, Split::train, t.counts.train, t.summary);
  // --full-validation: each validation set one epoch, evaluated whole (whatever --eval-iters says).
  const int64_t valid_n = args.full_validation ? kOneEpoch : t.counts.valid;
  if (args.multiple_validation_sets && valid_n != 0) {
    for (const std::string& prefix : validation_set_prefixes(args.valid_data_path))
      t.valid_sets.push_back(b.build(BlendSpec{{prefix}, {}}, Split::valid, valid_n, true, "valid-data-path", t.summary));
  } else {
    t.valid = build_split(b, Split::valid, valid_n, t.summary);
  }
  t.test = build_split(b, Split::test, t.counts.test, t.summary);
  return t;
}

int32_t resolve_eod_token(const TrainArgs& args, const Tokenizer* tokenizer, int64_t vocab_size) {
  int32_t eod = -1;
  if (tokenizer) eod = tokenizer->eod();
  else if (args.mock_data) eod = int32_t(vocab_size - 1);
  if (eod < 0 && (args.eod_mask_loss || args.reset_position_ids || args.reset_attention_mask))
    LATTICE_FAIL() << "--eod-mask-loss, --reset-position-ids and --reset-attention-mask need an "
                      "end-of-document token: give --tokenizer-type";
  return eod;
}

}  // namespace lattice
