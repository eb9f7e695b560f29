// Megatron's result validation, as its rerun state machine runs it with --rerun-mode disabled (the
// one mode lattice takes): a step whose result a check rejects ends training before its update,
// with one line naming the check, and the rejection is appended to
// --result-rejected-tracker-filename. The checks:
//   --check-for-nan-in-loss-and-grad (on by default): the loss or the gradient norm is nan or inf;
//   --check-for-spiky-loss: a micro-batch's loss (the sum of its token losses) is 10 times the
//     largest of the first 100 micro-batches' or more;
//   --check-for-large-grads: the step's gradient norm is 10 times the largest of the first 100
//     steps' or more.
// Every rank sees the same values (the micro-batch losses in the global batch's order, the reduced
// gradient norm), so every rank takes the same decision and no rank is left waiting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lattice {

struct StepResult;

// Megatron's RerunStateMachine.is_unexpectedly_large: the first `samples` values are sampled (their
// largest magnitude kept) and never rejected; after them a value whose magnitude is `threshold`
// times that largest or more is. nan and inf are neither sampled nor rejected (the non-finite check
// is separate).
class LargeValueTracker {
 public:
  explicit LargeValueTracker(double threshold = 10.0, int64_t samples = 100)
      : threshold_(threshold), samples_(samples) {}
  bool is_unexpectedly_large(double value);
  int64_t count() const { return count_; }
  double max() const { return max_; }
  double threshold() const { return threshold_; }
  int64_t samples() const { return samples_; }
  void restore(int64_t count, double max) { count_ = count, max_ = max; }

 private:
  double threshold_;
  int64_t samples_;
  int64_t count_ = 0;
  double max_ = 0.0;
};

struct ResultValidationConfig {
  bool check_for_nan = false;          // !--no-check-for-nan-in-loss-and-grad
  bool check_for_spiky_loss = false;   // --check-for-spiky-loss
  bool check_for_large_grads = false;  // --check-for-large-grads
  std::string tracker_file;            // --result-rejected-tracker-filename ("": none)
  bool write_tracker = false;          // this rank appends the rejections (world rank 0 does)
};

class ResultValidator {
 public:
  // Fails (naming the flag and file) when the tracker file cannot be appended to.
  explicit ResultValidator(ResultValidationConfig cfg);
  const ResultValidationConfig& config() const { return cfg_; }
  // Whether train_step must gather every micro-batch's loss (StepConfig::micro_batch_losses).
  bool needs_micro_batch_losses() const { return cfg_.check_for_spiky_loss; }

  // Before step `iteration`'s (0-based) update: lattice::Error when a check rejects a result,
  // after appending the rejection to the tracker file. An fp16 step skipped for overflow is not
  // checked (it updates nothing).
  void validate(const StepResult& r, int64_t iteration);

  // The trackers' samples, saved in a checkpoint so that a resumed run checks as an
  // uninterrupted one would (checkpoint.json's "rerun_state_machine": Megatron's
  // large_value_counts and max_values by context, "loss" and "grads").
  nlohmann::json state() const;
  // Restores state() (a checkpoint without it leaves the trackers empty); errors name `where`.
  void restore(const nlohmann::json& state, const std::string& where);

 private:
  [[noreturn]] void reject(int64_t iteration, double result, const std::string& message, const std::string& why);

  ResultValidationConfig cfg_;
  LargeValueTracker loss_, grads_;
};

// Megatron's RerunStateMachine.get_skipped_iterations_from_tracker_file: the iterations a tracker
// file shows rejected twice on one rank (status rerun_disabled) or reproduced on a second rerun
// (status second_rerun_reproducible), sorted. A missing file holds none; a line that is not a
// tracker record is an error naming the file and line.
std::vector<int64_t> iterations_to_skip_from_tracker_file(const std::string& path);

}  // namespace lattice
