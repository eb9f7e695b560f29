#include "train/trainer.h"

#include <omp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "blas/gemm.h"
#include "checkpoint/model_checkpoint.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/gpt_batches.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/flops.h"
#include "train/train_step.h"

namespace lattice {

std::string format_log_line(const LogLine& l) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): "
                "%.1f | throughput per GPU (TFLOP/s/GPU): %.3f | learning rate: %.6E | global batch "
                "size: %5lld | lm loss: %.6E | loss scale: %.1f | grad norm: %.3f | number of skipped "
                "iterations: %3lld | number of nan iterations: %3lld | tokens per second: %.1f | MFU: "
                "%.1f%% |",
                (long long)l.iteration, (long long)l.train_iters, (long long)l.consumed_samples,
                l.elapsed_ms, l.tflops_per_gpu, l.learning_rate, (long long)l.global_batch_size,
                l.lm_loss, l.loss_scale, l.grad_norm, (long long)l.skipped_iterations,
                (long long)l.nan_iterations, l.tokens_per_sec, l.mfu_percent);
  return buf;
}

std::string format_metrics_json(const LogLine& l) {
  nlohmann::json j = {{"iteration", l.iteration},
                      {"consumed_samples", l.consumed_samples},
                      {"lm_loss", l.lm_loss},
                      {"learning_rate", l.learning_rate},
                      {"grad_norm", l.grad_norm},
                      {"loss_scale", l.loss_scale},
                      {"elapsed_ms", l.elapsed_ms},
                      {"tokens_per_sec", l.tokens_per_sec},
                      {"tflops_per_gpu", l.tflops_per_gpu},
                      {"mfu_percent", l.mfu_percent},
                      {"skipped_iterations", l.skipped_iterations},
                      {"nan_iterations", l.nan_iterations}};
  return j.dump();
}

namespace {

std::unique_ptr<SampleSource> make_training_data(const TrainArgs& args, int64_t vocab_size) {
  if (args.mock_data) return std::make_unique<MockSamples>(vocab_size, args.seq_length, args.seed);
  auto ds = std::make_shared<IndexedDataset>(args.data_path[0]);
  ds->validate_token_ids(vocab_size);
  return std::make_unique<SequentialSamples>(ds, args.seq_length);
}

}  // namespace

int run_training(const TrainArgs& args) {
  const int threads = args.num_threads > 0 ? int(args.num_threads) : omp_get_max_threads();
  omp_set_num_threads(threads);
  blas_set_num_threads(threads);

  TransformerConfig cfg = args.transformer_config();
  if (!args.tokenizer_type.empty()) {
    auto tok = make_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file);
    cfg.vocab_size = tok->vocab_size();
  }
  cfg.finalize(args.tensor_model_parallel_size);
  auto data = make_training_data(args, cfg.vocab_size);

  GPTModel model(cfg, args.micro_batch_size, args.seq_length);
  model.init_parameters(args.seed);
  Optimizer optimizer(model.params(), args.optimizer_config());

  const double flops = megatron_flops_per_iteration(cfg, args.global_batch_size, args.seq_length);
  const double peak = args.peak_tflops > 0 ? args.peak_tflops : measure_peak_tflops();
  char hdr[512];
  std::snprintf(hdr, sizeof hdr,
                "> lattice: %lld parameters (padded vocab %lld), %d threads, BLAS %s, peak %.3f "
                "TFLOP/s (%s), memory: params+grads %.1f MB, optimizer state %.1f MB, activations "
                "%.1f MB",
                (long long)model.num_parameters(), (long long)cfg.padded_vocab_size, threads,
                blas_backend_name(), peak, args.peak_tflops > 0 ? "--peak-tflops" : "measured",
                2.0 * model.num_parameters() * 4 / 1e6, optimizer.state_bytes() / 1e6,
                model.arena_bytes() / 1e6);
  log_info(hdr);

  std::ofstream metrics;
  if (!args.metrics_file.empty()) {
    metrics.open(args.metrics_file, std::ios::trunc);
    if (!metrics) LATTICE_FAIL() << "--metrics-file " << args.metrics_file << ": cannot open for writing";
  }

  StepConfig step_cfg{args.micro_batch_size, args.global_batch_size, args.seq_length, args.clip_grad,
                      args.seed};
  double interval_loss = 0, interval_ms = 0;
  int64_t interval_iters = 0;
  double last_norm = 0;
  for (int64_t it = 0; it < args.train_iters; ++it) {
    Timer timer;
    // Constant learning rate for now (Megatron's schedules arrive with the scheduler).
    StepResult r = train_step(model, optimizer, *data, step_cfg, it, args.lr, args.weight_decay);
    interval_ms += timer.ms();
    interval_loss += r.lm_loss;
    last_norm = r.grad_norm;
    ++interval_iters;
    const int64_t done = it + 1;
    if (done % args.log_interval == 0 || done == args.train_iters) {
      LogLine l{};
      l.iteration = done;
      l.train_iters = args.train_iters;
      l.consumed_samples = done * args.global_batch_size;
      l.global_batch_size = args.global_batch_size;
      l.elapsed_ms = interval_ms / double(interval_iters);
      l.tflops_per_gpu = flops / (l.elapsed_ms / 1e3) / 1e12;
      l.learning_rate = args.lr;
      l.lm_loss = interval_loss / double(interval_iters);
      l.loss_scale = 1.0;
      l.grad_norm = last_norm;
      l.tokens_per_sec = double(args.global_batch_size * args.seq_length) / (l.elapsed_ms / 1e3);
      l.mfu_percent = 100.0 * l.tflops_per_gpu / peak;
      log_info(format_log_line(l));
      if (metrics.is_open()) metrics << format_metrics_json(l) << "\n" << std::flush;
      interval_loss = interval_ms = 0;
      interval_iters = 0;
    }
  }
  if (!args.save.empty()) {
    std::string dir = save_model_checkpoint(args.save, args.train_iters, model, args.to_json());
    log_info("> saved checkpoint " + dir);
  }
  return 0;
}

}  // namespace lattice
