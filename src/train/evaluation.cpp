#include "train/evaluation.h"

#include "pipeline/pipeline_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace lattice {

double perplexity(double lm_loss) { return std::exp(std::min(20.0, lm_loss)); }

EvalResult evaluate(GPTModel& model, const SampleSource& source, int64_t first_sample, int64_t num_samples,
                    int64_t global_batch_size, int64_t micro_batch_size, PipelineRunner* pipeline) {
  LATTICE_CHECK(num_samples > 0 && micro_batch_size > 0 && global_batch_size % micro_batch_size == 0)
      << "evaluate: " << num_samples << " samples, GBS " << global_batch_size << ", MBS " << micro_batch_size;
  const int64_t T = source.seq_length();
  std::vector<int32_t> tokens(static_cast<size_t>(micro_batch_size * (T + 1)));
  LossSum total;
  auto add = [&](const LossSum& l) {
    total.sum += l.sum;
    total.count += l.count;
  };
  for (int64_t first = first_sample; first < first_sample + num_samples; first += global_batch_size) {
    const int64_t batch = std::min(global_batch_size, first_sample + num_samples - first);
    const int64_t full = batch / micro_batch_size, rest = batch % micro_batch_size;
    if (pipeline) {  // the batch's micro-batches through the pipeline stages; a short last one on its own
      auto run = [&](int64_t from, int64_t M, int64_t B) {
        add(pipeline->evaluate([&](int64_t m, int32_t* out) { fill_micro_batch(source, from + m * B, B, out); }, M, B,
                               T));
      };
      if (full > 0) run(first, full, micro_batch_size);
      if (rest > 0) run(first + full * micro_batch_size, 1, rest);
      continue;
    }
    for (int64_t s = 0; s < batch; s += micro_batch_size) {
      const int64_t B = std::min(micro_batch_size, batch - s);
      fill_micro_batch(source, first + s, B, tokens.data());
      add(model.forward_loss_sum(tokens.data(), nullptr, B, T));
    }
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
