// Command-line arguments of `lattice train`, with Megatron-LM's flag names and
// defaults. parse_train_args validates each flag and their combinations; every error
// is one line naming the flag.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer_config.h"
#include "optim/optimizer.h"

namespace lattice {

struct TrainArgs {
  // model
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0;
  int64_t ffn_hidden_size = 0, kv_channels = 0;
  int64_t seq_length = 0, max_position_embeddings = 0;
  int64_t make_vocab_size_divisible_by = 128;
  float hidden_dropout = 0.1f, attention_dropout = 0.1f;
  float init_method_std = 0.02f, norm_epsilon = 1e-5f;
  bool openai_gelu = false;
  bool untie_embeddings_and_output_weights = false;
  std::string position_embedding_type = "learned_absolute";
  // batch and iterations
  int64_t micro_batch_size = 0, global_batch_size = 0, train_iters = 0;
  int64_t log_interval = 100;
  uint64_t seed = 1234;
  // optimizer
  std::string optimizer = "adam";
  double lr = 0, min_lr = 0;
  double weight_decay = 0.01;
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f, sgd_momentum = 0.9f;
  float clip_grad = 1.0f;
  // parallel layout (more than 1 arrives with the distributed issues)
  int64_t tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  // data
  bool mock_data = false;
  std::vector<std::string> data_path;
  int64_t vocab_size = 0;
  std::string tokenizer_type, vocab_file, merge_file;
  // output
  std::string save, metrics_file;
  double peak_tflops = 0;   // 0: measure with a GEMM calibration
  int64_t num_threads = 0;  // 0: OMP_NUM_THREADS, else all cores
  bool log_throughput = false;

  int64_t num_micro_batches() const { return global_batch_size / micro_batch_size; }
  TransformerConfig transformer_config() const;
  OptimizerConfig optimizer_config() const;
  // The arguments as `--flag value` pairs (for checkpoints and `generate`).
  std::string to_json() const;
};

// Parses argv[first..argc) (after `lattice train`). Throws lattice::Error on unknown
// flags, missing or malformed values and invalid combinations.
TrainArgs parse_train_args(int argc, char** argv, int first);

// `lattice train --help` text: every flag with its default.
std::string train_help();

}  // namespace lattice
