// --rampup-batch-size START INCREMENT SAMPLES: Megatron's RampupBatchsizeNumMicroBatches.
// The global batch starts at START and grows by INCREMENT every SAMPLES / n consumed samples
// (n = (global - START) / INCREMENT steps) until it reaches --global-batch-size:
//   batch(consumed) = global                                        if consumed > SAMPLES
//                   = START + int(consumed / (SAMPLES / n)) x INCREMENT  otherwise
// (the division in double, as Python's). Every iteration takes batch(samples consumed before
// it) samples; the number of iterations of a --train-samples run is Megatron's
// update_train_iters: ramp-up iterations while consumed <= SAMPLES and consumed <=
// --train-samples, then (train samples - consumed) / global more (a partial last batch dropped).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

class BatchSizeRampup {
 public:
  // Errors name --rampup-batch-size (a start above the global batch, a gap the increment does
  // not divide, non-positive sizes).
  BatchSizeRampup(int64_t start, int64_t increment, int64_t samples, int64_t global_batch_size);

  // The global batch size of the iteration that starts after `consumed` samples.
  int64_t batch_size(int64_t consumed) const;
  // Iterations of a run of train_samples (update_train_iters).
  int64_t train_iters(int64_t train_samples) const;
  // Samples consumed by the first `iterations` iterations.
  int64_t consumed_after(int64_t iterations) const;
  // Every batch size the ramp uses, ascending (START, START + INCREMENT, ..., global).
  std::vector<int64_t> batch_sizes() const;
  std::string describe() const;

 private:
  int64_t start_, increment_, samples_, global_;
  double samples_per_increment_;
};

}  // namespace lattice
