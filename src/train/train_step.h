// One training iteration (no pipelining, one process): zero grads, forward-backward
// over the micro-batches of the global batch (gradient accumulation), clip, optimizer
// step. The building block of the trainer and of library users' own loops.
#pragma once
#include <cstdint>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace lattice {

struct StepConfig {
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 1;
  int64_t seq_length = 0;
  double clip_grad = 1.0;
  uint64_t seed = 1234;
};

struct StepResult {
  double lm_loss = 0;    // mean over micro-batches of each micro-batch's mean token loss
  double grad_norm = 0;  // before clipping
};

// Runs iteration `iteration` (0-based) on samples [iteration*GBS, (iteration+1)*GBS).
StepResult train_step(GPTModel& model, Optimizer& optimizer, const SampleSource& data,
                      const StepConfig& cfg, int64_t iteration, double lr, double weight_decay);

}  // namespace lattice
