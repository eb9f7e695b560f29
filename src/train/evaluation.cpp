#include "train/evaluation.h"

#include "pipeline/pipeline_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace lattice {

double perplexity(double lm_loss) { return std::exp(std::min(20.0, lm_loss)); }

EvalResult evaluate(GPTModel& model, const SampleSource& source, int64_t first_sample, int64_t num_samples,
                    int64_t global_batch_size, int64_t micro_batch_size, PipelineRunner* pipeline,
                    Comm* data_parallel) {
  const int64_t d = data_parallel ? data_parallel->size() : 1, rank = data_parallel ? data_parallel->rank() : 0;
  LATTICE_CHECK(num_samples > 0 && micro_batch_size > 0 && global_batch_size % (micro_batch_size * d) == 0)
      << "evaluate: " << num_samples << " samples, GBS " << global_batch_size << ", MBS " << micro_batch_size
      << ", data-parallel size " << d;
  const int64_t T = source.seq_length();
  MicroBatch batch;
  LossSum total;  // this rank's share
  // Runs M micro-batches of B rows, micro-batch m from sample at(m); counted when `counted`.
  auto run = [&](int64_t M, int64_t B, const std::function<int64_t(int64_t)>& at, bool counted) {
    LossSum l;
    if (pipeline) {  // through the pipeline stages
      l = pipeline->evaluate([&](int64_t m, MicroBatch* out) { fill_micro_batch(source, at(m), B, out); }, M, B, T);
    } else {
      for (int64_t m = 0; m < M; ++m) {
        fill_micro_batch(source, at(m), B, &batch);
        const LossSum one =
            model.forward_loss_sum(batch.tokens.data(), batch.loss_mask_or_null(), B, T, batch.segments_or_null());
        l.sum += one.sum;
        l.count += one.count;
      }
    }
    if (!counted) return;
    total.sum += l.sum;
    total.count += l.count;
  };
  for (int64_t first = first_sample; first < first_sample + num_samples; first += global_batch_size) {
    const int64_t batch = std::min(global_batch_size, first_sample + num_samples - first);
    if (batch == global_batch_size) {  // this rank's micro-batches, as training reads them
      run(batch / (micro_batch_size * d), micro_batch_size,
          [&](int64_t m) { return first + (m * d + rank) * micro_batch_size; }, true);
      continue;
    }
    // A short batch (--full-validation's last): every rank runs all of it (the same number of
    // forwards everywhere, which expert parallelism's exchanges need); the last micro-batch short.
    const int64_t full = batch / micro_batch_size, rest = batch % micro_batch_size;
    if (full > 0) run(full, micro_batch_size, [&](int64_t m) { return first + m * micro_batch_size; }, rank == 0);
    if (rest > 0) run(1, rest, [&](int64_t) { return first + full * micro_batch_size; }, rank == 0);
  }
  if (d > 1) {
    double v[2] = {total.sum, total.count};
    data_parallel->all_reduce(v, 2, ReduceOp::sum);
    total.sum = v[0];
    total.count = v[1];
  }
  EvalResult r;
  r.tokens = total.count;
  r.lm_loss = total.count > 0 ? total.sum / total.count : 0.0;
  r.ppl = perplexity(r.lm_loss);
  return r;
}

std::string eval_prefix(int64_t iteration, const char* end_of_training_set) {
  std::string p = "iteration " + std::to_string(iteration);
  if (end_of_training_set) p += std::string(" on ") + end_of_training_set + " set";
  return p;
}

std::string format_evaluation(const std::string& prefix, const EvalResult& r, const std::string& name) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "lm loss value: %.6E | lm loss PPL: %.6E | ", r.lm_loss, r.ppl);
  const std::string line = " " + name + " loss at " + prefix + " | " + buf;
  const std::string dashes(line.size() + 1, '-');
  return dashes + "\n" + line + "\n" + dashes;
}

std::string format_eval_metrics_json(int64_t iteration, const std::string& key, const EvalResult& r) {
  nlohmann::json j = {{"iteration", iteration}, {key + "_loss", r.lm_loss}, {key + "_ppl", r.ppl}};
  return j.dump();
}

}  // namespace lattice
