// TransformerConfig: the model's shape and numerics, with Megatron-Core's field names.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/activation.h"

namespace lattice {

struct TransformerConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t ffn_hidden_size = 0;        // 0 -> 4 * hidden_size
  int64_t kv_channels = 0;            // 0 -> hidden_size / num_attention_heads
  int64_t vocab_size = 0;             // real (unpadded) vocabulary
  int64_t padded_vocab_size = 0;      // 0 -> padded by make_vocab_size_divisible_by
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 0;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float layernorm_epsilon = 1e-5f;
  float init_method_std = 0.02f;
  GeluKind gelu = GeluKind::erf;      // --openai-gelu -> tanh
  bool untie_embeddings_and_output_weights = false;

  // Fills the derived fields (ffn, kv_channels, padded vocab) and checks the
  // combination; errors name the flag (e.g. --num-attention-heads).
  void finalize(int64_t tensor_model_parallel_size = 1);
};

// Megatron's padding: ceil(V / (divisible_by * tp)) * (divisible_by * tp).
int64_t pad_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tensor_model_parallel_size);

}  // namespace lattice
