// SequentialSamples (document order over an indexed dataset) and MockSamples (--mock-data).
#include "data/gpt_batches.h"

#include <algorithm>

#include "core/error.h"
#include "core/philox.h"

namespace lattice {

SequentialSamples::SequentialSamples(std::shared_ptr<IndexedDataset> ds, int64_t seq_length)
    : ds_(std::move(ds)), S_(seq_length) {
  LATTICE_CHECK(ds_) << "SequentialSamples: no dataset";
  LATTICE_CHECK(S_ > 0) << "SequentialSamples: seq_length " << S_;
  const auto& lengths = ds_->sequence_lengths();
  seq_start_token_.resize(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    seq_start_token_[i] = total_tokens_;
    total_tokens_ += lengths[i];
  }
  if (total_tokens_ == 0) LATTICE_FAIL() << ds_->prefix() << ".bin: the dataset holds no tokens";
}

void SequentialSamples::sample(int64_t index, int32_t* out) const {
  LATTICE_CHECK(index >= 0) << "SequentialSamples: sample index " << index;
  const auto& lengths = ds_->sequence_lengths();
  // 128-bit: index * S may pass 2^63 for long runs over tiny datasets.
  int64_t pos = int64_t(((unsigned __int128)index * uint64_t(S_)) % uint64_t(total_tokens_));
  // The sequence holding token `pos` (the last one whose start is <= pos; skips empty ones).
  int64_t seq = int64_t(std::upper_bound(seq_start_token_.begin(), seq_start_token_.end(), pos) -
                        seq_start_token_.begin()) - 1;
  int64_t off = pos - seq_start_token_[seq];
  int64_t need = S_ + 1;
  while (need > 0) {
    const int64_t n = std::min<int64_t>(need, lengths[seq] - off);
    if (n > 0) {
      ds_->get(seq, off, n, out);
      out += n;
      need -= n;
    }
    off = 0;
    if (++seq == int64_t(lengths.size())) seq = 0;  // wrap around to the first token
  }
}

// The mock token stream is cut into blocks of S tokens; sample i is block i followed by
// the first token of block i+1 (so consecutive samples overlap by one token, as real ones
// do). Block b is a deterministic function of (seed, b) alone: documents back to back,
// each with a Philox-drawn length L in [1, S], start id a in [0, V-2] and step d in [1, 4]:
// tokens (a + k*d) mod (V-1) for k < L-1, then the end-of-document id V-1. A document
// still open at the end of a block is cut there. Given two tokens of a document the next
// is determined, so a model can learn the data.
namespace {

void mock_block(uint64_t seed, int64_t V, int64_t S, int64_t block, int64_t n, int32_t* out) {
  const PhiloxStream rng{seed, fnv1a32("mock-data"), uint32_t(uint64_t(block)), uint32_t(uint64_t(block) >> 32)};
  const int64_t eod = V - 1;
  uint64_t draw = 0;
  int64_t pos = 0;
  while (pos < n) {
    const int64_t len = 1 + int64_t(rng.u32(draw++) % uint64_t(S));
    const int64_t a = eod > 0 ? int64_t(rng.u32(draw++) % uint64_t(eod)) : 0;
    const int64_t d = 1 + int64_t(rng.u32(draw++) % 4);
    for (int64_t k = 0; k < len && pos < n; ++k, ++pos)
      out[pos] = int32_t(k == len - 1 || eod == 0 ? eod : (a + k * d) % eod);
  }
}

}  // namespace

MockSamples::MockSamples(int64_t vocab_size, int64_t seq_length, uint64_t seed)
    : V_(vocab_size), S_(seq_length), seed_(seed) {
  LATTICE_CHECK(V_ >= 1 && V_ <= (int64_t(1) << 31)) << "MockSamples: vocab size " << V_;
  LATTICE_CHECK(S_ > 0) << "MockSamples: seq_length " << S_;
}

void MockSamples::sample(int64_t index, int32_t* out) const {
  LATTICE_CHECK(index >= 0) << "MockSamples: sample index " << index;
  mock_block(seed_, V_, S_, index, S_, out);
  mock_block(seed_, V_, S_, index + 1, 1, out + S_);
}

void fill_micro_batch(const SampleSource& src, int64_t first_sample, int64_t B, int32_t* tokens) {
  const int64_t row = src.seq_length() + 1;
  for (int64_t b = 0; b < B; ++b) src.sample(first_sample + b, tokens + b * row);
}

void fill_micro_batch(const SampleSource& src, int64_t first_sample, int64_t B, MicroBatch* out) {
  const int64_t S = src.seq_length();
  out->tokens.resize(size_t(B * (S + 1)));
  if (!src.has_extras()) {
    fill_micro_batch(src, first_sample, B, out->tokens.data());
    out->loss_mask.clear();
    out->segments.clear();
    return;
  }
  out->loss_mask.resize(size_t(B * S));
  out->segments.resize(size_t(B * S));
  for (int64_t b = 0; b < B; ++b)
    src.sample_with_extras(first_sample + b, out->tokens.data() + b * (S + 1), out->loss_mask.data() + b * S,
                           out->segments.data() + b * S);
}

}  // namespace lattice
