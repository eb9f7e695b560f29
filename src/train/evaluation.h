// Megatron's evaluation: forward only (no dropout) over global batches of a validation or
// test SampleSource (--eval-iters of them, or with --full-validation the whole split); the loss is the token-weighted mean over all of
// them (sum of masked token losses / number of loss tokens) and PPL = exp(min(20, loss)).
#pragma once
#include <cstdint>
#include <string>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"

namespace lattice {

class Comm;
class PipelineRunner;

struct EvalResult {
  double lm_loss = 0, ppl = 0;
  double tokens = 0;  // loss tokens counted
};

// Megatron's reported perplexity: exp(min(20, loss)).
double perplexity(double lm_loss);

// Samples first_sample .. first_sample + num_samples - 1, in global batches of global_batch_size
// samples, each in micro-batches of micro_batch_size x the model's seq_length. When num_samples is
// not a multiple of the global batch (--full-validation's whole split) the last global batch holds
// the rest, and its last micro-batch the rest of that (fewer rows). The caller advances
// first_sample by eval_iters * global_batch_size after each evaluation (Megatron's valid iterator
// continues). With `pipeline` the model is one stage and the runner passes the micro-batches
// through the pipeline (the result is on every stage). With a data-parallel group of d ranks each
// reads its micro-batches of every global batch as in training (micro-batch m of rank r: samples
// first + (m*d + r)*B ..), and the loss sums are reduced over the group (the result is on every
// rank); a short global batch is read by every rank and counted once.
EvalResult evaluate(GPTModel& model, const SampleSource& source, int64_t first_sample, int64_t num_samples,
                    int64_t global_batch_size, int64_t micro_batch_size, PipelineRunner* pipeline = nullptr,
                    Comm* data_parallel = nullptr);

// Megatron's prefixes: "iteration N" every --eval-interval; after training
// "iteration N on validation set" and "iteration N on test set".
std::string eval_prefix(int64_t iteration, const char* end_of_training_set = nullptr);

// Megatron's three-line block (no trailing newline):
//   ----------------...
//    validation loss at <prefix> | lm loss value: 3.456789E+00 | lm loss PPL: 3.170853E+01 |
//   ----------------...
// (the dash lines are one longer than the middle line, as Megatron prints them). name: what is
// evaluated ("validation-0" for --multiple-validation-sets' first set).
std::string format_evaluation(const std::string& prefix, const EvalResult& r, const std::string& name = "validation");

// One metrics-file line: {"iteration":N,"<key>_loss":X,"<key>_ppl":Y}, key "val", "val_<i>"
// (--multiple-validation-sets) or "test".
std::string format_eval_metrics_json(int64_t iteration, const std::string& key, const EvalResult& r);

}  // namespace lattice
