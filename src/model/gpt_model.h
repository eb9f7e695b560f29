// GPTModel: Megatron's GPT with learned absolute positions, pre-LayerNorm layers,
// fused QKV -> core attention -> output projection, MLP fc1 -> GELU -> fc2, final
// LayerNorm, and an output layer tied to the word embedding unless untied.
// Explicit forward and backward; parameters in one ParamBuffer; activations in an
// Arena sized once for (micro_batch_size, seq_length).
//
// Tensor parallelism (model/tensor_parallel.h) splits every layer over the group's P
// ranks as Megatron does: QKV and fc1 column-parallel (heads and ffn split), proj and
// fc2 row-parallel, the word embedding and output layer vocab-parallel with the
// vocab-parallel cross entropy; with sequence parallelism the residual stream, the
// LayerNorms, dropout and residual adds run on token shards. P = 1 is the same code.
//
// Shapes: B micro-batch, T sequence, C hidden, H heads, D head dim, F ffn hidden,
// V vocabulary (real), Vp padded vocabulary, L layers, N = B*T; on one of P ranks
// Hl = H/P heads, Fl = F/P, Vl = Vp/P vocabulary rows, Ns = N/P token rows with
// sequence parallelism (else N).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "model/tensor_parallel.h"
#include "model/transformer_config.h"
#include "optim/param_buffer.h"

namespace lattice {

// Where a micro-batch sits in training; dropout masks are keyed by it.
struct MicroBatchKey {
  uint64_t seed = 1234;
  int64_t iteration = 0;
  int64_t micro_batch = 0;   // index of the micro-batch within the global batch
  bool training = true;      // false: no dropout
};

// Megatron's document-boundary options, computed from the input tokens of each
// micro-batch (its _get_ltor_masks_and_position_ids): with eod the end-of-document id,
//   eod_mask_loss:        no loss at positions whose INPUT token is eod
//   reset_position_ids:   position ids restart at 0 after each eod
//   reset_attention_mask: a token attends only tokens of its own document (ids passed
//                         to the attention kernel; no T x T mask is built)
struct DocumentBoundaries {
  int32_t eod = -1;
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
};

// Sum of the masked token losses and of the mask (Megatron reports evaluation losses
// as sum / count over all tokens of all batches).
struct LossSum {
  double sum = 0, count = 0;
};

class GPTModel {
 public:
  // Builds the parameter registry (this rank's parts under tensor parallelism) and
  // allocates parameters, gradients and the activation arena for micro-batches of up
  // to B x T tokens.
  GPTModel(const TransformerConfig& config, int64_t B, int64_t T, const TensorParallel& tp = {});
  ~GPTModel();

  const TransformerConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  // Megatron's init: N(0, std) weights, output projections std/sqrt(2L), zero biases,
  // LayerNorm weight 1.
  void init_parameters(uint64_t seed);

  // One micro-batch: forward, loss, backward. tokens: [B, T+1] (inputs tokens[:, :T],
  // labels tokens[:, 1:]). loss_mask: [B, T] or null. Gradients are ACCUMULATED into
  // the grad buffer, scaled by grad_scale (the caller passes 1/num_micro_batches).
  // Returns the micro-batch's mean loss over its (masked) tokens.
  double forward_backward(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                          float grad_scale, const MicroBatchKey& key);

  // Forward and loss only (evaluation). Returns the mean loss.
  double forward_loss(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T);
  // The same, as the sum of masked losses and the mask's sum (no dropout).
  LossSum forward_loss_sum(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T);

  // Called during backward with a parameter's index once its gradient is final for the
  // micro-batch (data parallelism starts bucket reductions from it). Null: no calls.
  void set_grad_ready_hook(std::function<void(int)> hook) { grad_ready_ = std::move(hook); }

  // Applies to every later forward (training, evaluation, logits). Fails when an option
  // is on without an eod id.
  void set_document_boundaries(const DocumentBoundaries& d);
  const DocumentBoundaries& document_boundaries() const { return docs_; }

  // With sequence parallelism the LayerNorm gradients of each rank cover its token
  // shard only; after the last micro-batch (and any data-parallel reduction) this
  // all-reduces them over the tensor-parallel group within `ranges` of the buffer (the
  // elements this rank's optimizer reads; empty: all). Nothing otherwise.
  void finish_sequence_parallel_grads(const std::vector<std::pair<int64_t, int64_t>>& ranges);

  // Logits for input tokens [B, T]: writes [B, T, Vp] into logits (caller-owned).
  // Padded columns are left as computed; consumers use the first V. One rank only.
  void forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits);

  // Logits [Vp] of the last position of a single sequence inputs[0:T] (generation).
  void forward_last_logits(const int32_t* inputs, int64_t T, float* logits);

  // Bytes of activation memory one micro-batch of B x T needs (the arena size) on one
  // rank of the given tensor-parallel layout.
  static size_t activation_bytes(const TransformerConfig& config, int64_t B, int64_t T,
                                 const TensorParallel& tp = {});
  size_t arena_bytes() const { return arena_.capacity(); }

  // Forward FLOPs-relevant parameter count excluding position embeddings.
  int64_t num_parameters() const { return params_.numel(); }

 private:
  struct Activations;
  struct LayerParams {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };

  void register_parameters();
  static void allocate_activations(Activations& a, Arena& arena, const TransformerConfig& cfg,
                                   const TensorParallel& tp, int64_t B, int64_t T);
  // Runs embedding, layers and final norm; leaves final hidden states in acts.
  void forward_hidden(Activations& a, const int32_t* tokens, int64_t token_stride, int64_t B,
                      int64_t T, const MicroBatchKey& key);
  const float* all_rows(Activations& a, const float* shard, int64_t N);
  // d_lnf: gradient of the final LayerNorm's output rows of this rank ([Ns, C]).
  void backward_hidden(Activations& a, const float* d_lnf, int64_t B, int64_t T, const MicroBatchKey& key);
  // Output layer and vocab-parallel cross entropy on a.lnf; with `backward` the logits
  // become their gradients (scaled by grad_scale / mask sum). Returns the masked sum.
  LossSum output_loss(Activations& a, const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                      bool backward, float grad_scale);
  // Position ids (and document ids) of inputs tokens[b, 0:T] (rows of token_stride).
  void compute_positions(const int32_t* tokens, int64_t token_stride, int64_t B, int64_t T);
  // The loss mask to use: loss_mask (or 1) times the eod mask; null when all ones.
  const float* effective_loss_mask(const float* loss_mask, int64_t B, int64_t T);
  const float* output_weight() const;
  float* output_weight_grad();

  TransformerConfig cfg_;
  TensorParallel tp_;
  int64_t max_B_, max_T_;
  int64_t Hl_, Fl_, Vl_;          // heads, ffn columns and vocabulary rows on this rank
  int64_t vocab_begin_, vocab_valid_;  // first vocabulary row here; real (unpadded) rows here
  ParamBuffer params_;
  int wte_, wpe_, lnf_w_, lnf_b_, out_w_ = -1;
  std::vector<LayerParams> layers_;
  std::function<void(int)> grad_ready_;
  void grads_ready(std::initializer_list<int> indices) const {
    if (grad_ready_)
      for (int i : indices) grad_ready_(i);
  }
  Arena arena_;
  std::unique_ptr<Activations> acts_;
  std::vector<int32_t> positions_, inputs_, targets_;  // [B*T] staging
  DocumentBoundaries docs_;
  std::vector<int32_t> document_ids_;  // [B*T] with reset_attention_mask
  std::vector<float> loss_mask_;       // [B*T] with eod_mask_loss
  std::vector<float> row_max_;         // [B*T] cross entropy statistics
  std::vector<double> ce_stats_;       // [B*T, 2]
  std::vector<float> sp_grads_;        // sequence-parallel gradient staging
};

}  // namespace lattice
