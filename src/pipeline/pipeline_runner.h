// Runs one stage's pipeline schedule (pipeline/schedule.h) for a global batch: receives
// activations and gradients from the neighbouring stages through the pipeline group's
// Comm (non-blocking sends, receives that wait with the job's timeout and say which
// stage, micro-batch and transfer they wait for), runs the model chunk's forward and
// backward steps in the activation slot of each micro-batch, and sends the results on.
// With one stage it is the plain gradient-accumulation loop.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "data/gpt_batches.h"
#include "model/gpt_model.h"
#include "pipeline/schedule.h"

namespace lattice {

class Comm;
class CommRequest;

class PipelineRunner {
 public:
  // pp: the pipeline group (null or size 1: one stage); embedding: the group of the
  // first and last stage sharing a tied word embedding (null elsewhere).
  PipelineRunner(GPTModel& model, const PipelineLayout& layout, Comm* pp = nullptr, Comm* embedding = nullptr);
  ~PipelineRunner();

  // Fills this rank's micro-batch m: tokens [B, T+1], and where the data has them its loss mask and segments.
  using Fetch = std::function<void(int64_t m, MicroBatch* batch)>;

  // What train() returns: on the last stage the sum over the micro-batches of each one's mean
  // token loss, the sums of their masked token losses and mask, and each micro-batch's masked
  // token loss sum [M] (zeros on the others).
  struct Losses {
    double sum_of_means = 0;
    LossSum tokens;
    std::vector<double> micro_batch_sums;
  };

  // Forward and backward of M micro-batches (gradients accumulated, scaled by
  // grad_scale); before_backward(last) runs before each backward, last marking this
  // stage's final one.
  Losses train(const Fetch& fetch, const std::function<MicroBatchKey(int64_t m)>& key_of, int64_t M, int64_t B,
               int64_t T, float grad_scale, const std::function<void(bool last)>& before_backward);

  // Forward only (no dropout) over M micro-batches; the masked loss sums on the last
  // stage (zeros on the others).
  LossSum evaluate(const Fetch& fetch, int64_t M, int64_t B, int64_t T);

  // After train(): sums the shared word embedding's gradients over the embedding group
  // (first and last stage) and reports them ready to the gradient hook.
  void finish_shared_embedding_grads();

  // Losses live on the last stage: the value there, on every stage.
  double from_last_stage(double value);
  // The same for n values at once (one collective).
  void from_last_stage(double* values, int n);

  // The most micro-batches whose activations one chunk held at once in the last train().
  int peak_activations() const { return peak_; }
  // The last train()'s wall time and the part of it spent computing (forward and
  // backward steps): 1 - compute/total is this stage's measured bubble.
  double last_seconds() const { return total_seconds_; }
  double last_compute_seconds() const { return compute_seconds_; }
  int stage() const { return stage_; }
  // The pipeline group (null with one stage).
  Comm* pipeline_group() const { return pp_; }

 private:
  struct SendBuffer;
  float* grad_send_buffer(size_t n);
  void wait_sends();

  GPTModel& model_;
  PipelineLayout layout_;
  Comm* pp_;
  Comm* embedding_;
  int stage_ = 0;
  int peak_ = 0;
  double total_seconds_ = 0, compute_seconds_ = 0;
  std::vector<MicroBatch> batches_;                            // [chunk * slots + slot]
  std::vector<std::unique_ptr<CommRequest>> activation_sends_;  // [chunk * slots + slot]
  std::vector<std::unique_ptr<SendBuffer>> grad_sends_;
};

}  // namespace lattice
