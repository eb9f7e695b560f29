// GPTModel: Megatron's GPT with learned absolute positions (or the rotary embedding of q
// and k), pre-LayerNorm layers, fused QKV (grouped-query with --num-query-groups; per-head
// query and key norms with --qk-layernorm) -> core attention -> output projection (heads x
// kv_channels wide), MLP fc1 -> GELU (or SwiGLU) -> fc2 (biases unless --disable-bias-linear;
// a mixture of such experts with --num-experts, model/moe_layer.h), final LayerNorm, and an
// output layer tied to the word embedding unless untied.
// Explicit forward and backward; parameters in one ParamBuffer; activations in an
// Arena sized once for (micro_batch_size, seq_length). Activation recomputation
// (TransformerConfig::recompute_*) keeps less in it and reruns forward parts in
// backward, with bit-identical results (docs/memory.md).
//
// Tensor parallelism (model/tensor_parallel.h) splits every layer over the group's P
// ranks as Megatron does: QKV and fc1 column-parallel (heads and ffn split), proj and
// fc2 row-parallel, the word embedding and output layer vocab-parallel with the
// vocab-parallel cross entropy; with sequence parallelism the residual stream, the
// LayerNorms, dropout and residual adds run on token shards. P = 1 is the same code.
//
// Shapes: B micro-batch, T sequence, C hidden, H heads, D head dim, F ffn hidden (F1 = fc1's
// outputs: F, or 2F with SwiGLU),
// V vocabulary (real), Vp padded vocabulary, L layers, N = B*T; on one of P ranks
// Hl = H/P heads, Fl = F/P, F1l = F1/P, Vl = Vp/P vocabulary rows, Ns = N/P token rows with
// sequence parallelism (else N).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/device.h"
#include "core/storage.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gated_delta_net.h"
#include "kernels/layernorm.h"
#include "kernels/mamba.h"
#include "model/context_parallel.h"
#include "model/linear.h"
#include "model/moe_layer.h"
#include "model/qk_layernorm.h"
#include "model/rotary_embedding.h"
#include "model/tensor_parallel.h"
#include "model/transformer_config.h"
#include "optim/param_buffer.h"

namespace lattice {

struct GdnScratch;          // model/gpt_model_buffers.h
struct GdnCoreParams;       // (ditto)
struct GdnContextParallel;  // (ditto)
struct MambaCoreParams;       // (ditto)
struct MambaContextParallel;  // (ditto)

// Where a micro-batch sits in training; dropout masks are keyed by it.
struct MicroBatchKey {
  uint64_t seed = 1234;
  int64_t iteration = 0;
  int64_t micro_batch = 0;   // index of the micro-batch within the global batch
  bool training = true;      // false: no dropout
  // Logits for generation (or a conversion's check) rather than a loss: the MoE layers drop no
  // token (--moe-expert-capacity-factor applies to training and evaluation forwards, as Megatron's).
  bool generation = false;
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

// Which part of the model this rank holds under pipeline parallelism: one or more
// chunks of consecutive layers (Megatron's virtual pipeline stages, in the order the
// schedule numbers them), the embedding in front of chunk 0 on the first stage, and the
// final LayerNorm, output layer and loss after the last chunk on the last stage. The
// default is the whole model.
struct ModelPlacement {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, end) global layers; empty: all
  bool pre_process = true;   // embedding before chunk 0
  bool post_process = true;  // final norm, output layer and loss after the last chunk
  int slots = 1;             // micro-batches whose activations a chunk keeps at once
};

class GPTModel {
 public:
  // Builds the parameter registry (this rank's parts under tensor and pipeline
  // parallelism) and allocates parameters, gradients and the activation arena for
  // placement.slots micro-batches of up to B x T tokens per chunk. expert_parallel: the
  // expert-parallel group (null or one rank: every expert here); rank r of P holds experts
  // r E/P .. (r + 1) E/P - 1 of every MoE layer, under their global numbers.
  // context_parallel: the context-parallel group (model/context_parallel.h); with P ranks this
  // rank holds T/P tokens of each sequence (two chunks) and its activations are sized for them.
  // Every micro-batch is then B full sequences of T tokens, passed whole to each step (the
  // model takes its chunks); the losses and their gradients are those of the whole sequences.
  // gradients false: no gradient buffer (a model for inference: forwards only, no backward).
  GPTModel(const TransformerConfig& config, int64_t B, int64_t T, const TensorParallel& tp = {},
           const ModelPlacement& placement = {}, Comm* expert_parallel = nullptr,
           const ContextParallel& context_parallel = {}, bool gradients = true);
  ~GPTModel();

  const TransformerConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const ContextParallel& context_parallel() const { return cp_; }
  // Elements of a chunk's input or output (what pipeline stages send) for B sequences of T
  // tokens: this rank's token rows (its context-parallel share, its sequence-parallel shard)
  // x hidden size.
  int64_t activation_elements(int64_t B, int64_t T) const {
    return tp_.shard_rows(B * T / cp_.size()) * cfg_.hidden_size;
  }
  Comm* expert_parallel() const { return ep_; }
  // --expert-tensor-parallel-size 1 under tensor parallelism: the experts whole on their ranks.
  bool experts_whole() const { return experts_whole_; }
  // Whole experts under context parallelism: the tensor x context-parallel group
  // (ParallelState::tp_cp), over which the routing statistics of a micro-batch's rows are summed.
  void set_tensor_context_group(Comm* tp_cp) { tp_cp_ = tp_cp; }
  const ModelPlacement& placement() const { return place_; }
  int num_chunks() const { return int(place_.chunks.size()); }
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  // Megatron's init: N(0, std) weights, output projections std/sqrt(2L), zero biases,
  // LayerNorm weight 1.
  void init_parameters(uint64_t seed);

  // One micro-batch on a whole model: forward, loss, backward. tokens: [B, T+1] (inputs
  // tokens[:, :T], labels tokens[:, 1:]). loss_mask: [B, T] or null. Gradients are
  // ACCUMULATED into the grad buffer, scaled by grad_scale (the caller passes
  // 1/num_micro_batches). Returns the micro-batch's mean loss over its (masked) tokens.
  double forward_backward(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                          float grad_scale, const MicroBatchKey& key);

  // Pipeline steps on chunk `chunk`, keeping the micro-batch's activations in `slot`.
  // Every chunk gets the micro-batch's tokens [B, T+1] (positions and document ids come
  // from them). A chunk without the embedding reads its input [Ns, C] from
  // input_buffer(chunk, slot), where the caller received it. Without the loss, the
  // output [Ns, C] is at output(chunk, slot) afterwards; with it, the loss is computed
  // and (when key.training) its gradient too, scaled by grad_scale / mask sum (by grad_scale
  // alone after set_loss_gradient_of_sum(true): the gradient of the summed token losses).
  // segments [B, T] or null: see prepare_inputs.
  LossSum forward_step(int chunk, int slot, const int32_t* tokens, const float* loss_mask, int64_t B,
                       int64_t T, float grad_scale, const MicroBatchKey& key, const int32_t* segments = nullptr);
  float* input_buffer(int chunk, int slot);
  const float* output(int chunk, int slot) const;
  // Backward of the micro-batch in (chunk, slot). A chunk without the loss reads the
  // gradient of its output [Ns, C] from output_grad_buffer(), where the caller received
  // it; a chunk without the embedding leaves the gradient of its input at input_grad().
  void backward_step(int chunk, int slot, int64_t B, int64_t T, const MicroBatchKey& key);
  float* output_grad_buffer();
  const float* input_grad() const;

  // Forward and loss only (evaluation). Returns the mean loss.
  double forward_loss(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T);
  // The same, as the sum of masked losses and the mask's sum (no dropout).
  LossSum forward_loss_sum(const int32_t* tokens, const float* loss_mask, int64_t B, int64_t T,
                           const int32_t* segments = nullptr);

  // Called during backward with a parameter's index once its gradient is final for the
  // micro-batch (data parallelism starts bucket reductions from it). Null: no calls.
  // The last stage's copy of a tied word embedding is not reported (see
  // shared_embedding()): its gradient is final only after the embedding-group all-reduce.
  void set_grad_ready_hook(std::function<void(int)> hook) { grad_ready_ = std::move(hook); }

  // The word embedding this rank shares with another pipeline stage (the first stage's
  // embedding and the last stage's copy for the output layer, when tied and PP > 1),
  // or -1. Its gradients are summed over the embedding group after backward.
  int shared_embedding() const { return shared_embedding_; }
  // Reports a parameter's gradient final to the hook (the shared embedding's, after the
  // embedding-group all-reduce).
  void report_grad_ready(int index) const {
    if (grad_ready_) grad_ready_(index);
  }

  // Mixed precision: the policy every linear layer's GEMMs go through (null: fp32). Not
  // owned; must outlive its use.
  void set_gemm_policy(GemmPolicy* policy) { gemm_policy_ = policy; }
  GemmPolicy* gemm_policy() const { return gemm_policy_; }
  // How a GPU computes the core attention (kernels/attention.h; the CPU always in fp32):
  // bf16 / fp16 tensor cores in half-precision runs.
  void set_attention_math(AttentionMath math) { attention_math_ = math; }
  // Whether a policy with bf16 results (GemmPolicy::bf16_results) keeps the output layer's
  // logits and their gradient in bf16. The same values either way; bf16 halves their memory
  // traffic but makes the cross entropy's backward recompute the exponentials instead of
  // reading them, which a GPU's bandwidth pays for and a CPU's arithmetic does not. On by
  // default with --device cuda (also under the CUDA emulation, whose tests compare it with
  // the CPU's path bit for bit), off with --device cpu; tests switch it.
  void set_bf16_logits(bool on) { bf16_logits_on_ = on; }
  // Whether, with such a policy, the kernels that make the linear layers' inputs (LayerNorm,
  // bias_gelu) write them in bf16 for the GEMMs (bf16_inputs). On by default (it saves a
  // conversion pass per GEMM on both devices); tests switch it.
  void set_bf16_inputs(bool on) { bf16_inputs_on_ = on; }
  // Whether, with such a policy, the core attention's operands are kept in bf16: the QKV
  // layer's GEMM writes its result in bf16 and the attention adds the bias as it reads it
  // (AttentionOperand::packed), and the projection's GEMM writes its input gradient rounded
  // in bf16 for the attention backward: the same values, with no bias or rounding pass and
  // half the bytes written and read. On by default with --device cuda; off with --device
  // cpu, whose attention widens them to fp32 again for its GEMMs; tests switch it.
  void set_bf16_qkv(bool on) { bf16_qkv_on_ = on; }

  // Applies to every later forward (training, evaluation, logits). Fails when an option
  // is on without an eod id.
  void set_document_boundaries(const DocumentBoundaries& d);
  // Megatron's --calculate-per-token-loss: the training loss gradient is that of the sum of the
  // micro-batch's token losses, not of their mean (the step divides by the global token count).
  void set_loss_gradient_of_sum(bool on) { loss_gradient_of_sum_ = on; }
  const DocumentBoundaries& document_boundaries() const { return docs_; }

  // --moe-router-enable-expert-bias: moves every MoE layer's expert bias by the update rate towards
  // even loads, bias_e += rate sign(mean_e' count_e' - count_e) (Megatron's get_updated_expert_bias),
  // from the tokens each expert got in this rank's training forwards since the last call (equal
  // on the tensor-parallel ranks, which route the same rows), summed over `dp` (the data-parallel
  // group, null: none), then restarts the counts. Collective over dp. Nothing without the bias.
  void update_expert_biases(Comm* dp);
  // --num-experts: the MoE losses over their coefficients of every MoE layer of this rank's training
  // forwards since the last call, each summed with its count; the call starts new sums. The
  // load-balancing losses (1 when the experts are evenly loaded): the micro-batch's (always), each
  // sequence's (seq_aux_loss listed) and the global one (global_aux_loss listed: the whole data- and
  // context-parallel group's value, the same on each rank); the z-loss (mean squared logsumexp).
  // Each MoE layer's own load-balancing loss and z-loss too, by the layer's number (this rank's
  // layers; the others' counts 0), for --moe-per-layer-logging.
  struct MoeLossSums {
    LossSum load_balancing, seq_load_balancing, global_load_balancing, z;
    std::vector<LossSum> layer_load_balancing, layer_z;  // [num_layers]
  };
  MoeLossSums take_moe_losses();
  // --mtp-num-layers: each prediction depth's loss (the mean over its shifted masked tokens) of this
  // rank's training forwards since the last call, summed with their count ([mtp_num_layers]; empty
  // without it); the call starts new sums.
  std::vector<LossSum> take_mtp_losses();
  // global_aux_loss: the data-parallel group whose ranks route other tokens (their expert counts are
  // summed into the statistics; null or one rank: none). Collective over it in every training forward
  // of an MoE layer.
  void set_data_parallel_group(Comm* dp) { data_parallel_ = dp; }
  // global_aux_loss: the step's counts start again (Megatron's reset_global_aux_loss_tracker, after
  // each step's backward passes).
  void reset_global_aux_loss_tracker();

  // The replicated parameters whose gradient each tensor-parallel rank sums over its part of
  // the work only: with sequence parallelism the LayerNorms' (a token shard each), with
  // --qk-layernorm q_layernorm's and k_layernorm's (the rank's heads). After the last
  // micro-batch (and any data-parallel reduction) this all-reduces them over the
  // tensor-parallel group within `ranges` of the buffer (the elements this rank's optimizer
  // reads; empty: all). Nothing with one rank.
  void finish_tensor_parallel_grads(const std::vector<std::pair<int64_t, int64_t>>& ranges);

  // Logits for input tokens [B, T]: writes [B, T, Vp] into logits (a caller-owned host
  // array). Padded columns are left as computed; consumers use the first V. One rank only.
  void forward_logits(const int32_t* inputs, int64_t B, int64_t T, float* logits);

  // Logits [Vp] (host array) of the last position of a single sequence inputs[0:T] (generation).
  void forward_last_logits(const int32_t* inputs, int64_t T, float* logits);

  // Bytes of activation memory on one rank (the arena size): placement.slots
  // micro-batches of B x T per chunk plus the shared backward scratch. With activation
  // recomputation (config.recompute_*) a micro-batch keeps only what it does not
  // recompute, plus one shared copy of a recomputed group's buffers (docs/memory.md).
  // ep: the expert-parallel size (the MoE layers keep their experts' rows outside the arena); cp the
  // context-parallel size (its GDN core's buffers are beside the arena: context_parallel_bytes).
  static size_t activation_bytes(const TransformerConfig& config, int64_t B, int64_t T,
                                 const TensorParallel& tp = {}, const ModelPlacement& placement = {}, int ep = 1,
                                 int cp = 1);
  // The parameters a model of `config` registers for `placement` on tensor-parallel rank tp (its
  // parts, in its order and with its splits, so the flat buffer's alignment padding and gradient
  // buckets come out as the model's) with the experts of expert-parallel rank ep_rank of ep_size.
  // Registry only: nothing is allocated (the memory estimate's, train/memory_estimate.h).
  static ParamBuffer parameter_registry(const TransformerConfig& config, const TensorParallel& tp,
                                        const ModelPlacement& placement, int ep_rank, int ep_size);
  size_t arena_bytes() const { return arena_.capacity(); }
  // Context parallelism's buffers beside the arena (the gathered keys and values [B, T, Gl, 2, D],
  // their staging, the reduce-scattered gradients [B, T/cp, Gl, 2, D]); 0 without it.
  static size_t context_parallel_bytes(const TransformerConfig& config, int64_t B, int64_t T, int tp, int cp);
  size_t context_parallel_bytes() const {
    return context_parallel_bytes(cfg_, max_B_, max_T_ * cp_.size(), tp_.size(), cp_.size());
  }

  // Parameters on this rank.
  int64_t num_parameters() const { return params_.numel(); }

  // The rotary embedding's table (positions 0..max_position_embeddings-1), or null with
  // learned absolute positions.
  // The rotary table of a sequence of `length` positions (LongRoPE's long one past the original context).
  const RopeTable* rope_table(int64_t length) const {
    return !rope_ ? nullptr : cfg_.longrope_long(length) ? &rope_long_->table() : &rope_->table();
  }

 private:
  struct Activations;
  struct Scratch;
  struct LayerParams {
    int64_t layer;  // global layer index (a prediction depth's: num_layers + its index)
    std::string name;  // the parameters' prefix: decoder.layers.<layer>. or mtp.layers.<k>.transformer_layer.
    // parameter indices; -1: none (the linear biases with --disable-bias-linear, the norms'
    // biases with RMSNorm)
    int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1, ln2_w = -1, ln2_b = -1, fc1_w = -1,
        fc1_b = -1, fc2_w = -1, fc2_b = -1;
    // --qk-layernorm's q_layernorm and k_layernorm (-1 without it; the biases with RMSNorm); with
    // --multi-latent-attention the latents' q_layernorm [Rq] and kv_layernorm [Rkv] (in k_norm_*)
    int q_norm_w = -1, q_norm_b = -1, k_norm_w = -1, k_norm_b = -1;
    // --multi-latent-attention (qkv_w, qkv_b -1): linear_q_proj, or linear_q_down_proj and
    // linear_q_up_proj; linear_kv_down_proj, linear_kv_up_proj (model/multi_latent_attention.cpp)
    int q_proj_w = -1, q_down_w = -1, q_up_w = -1, kv_down_w = -1, kv_up_w = -1;
    // --num-experts: the router and each expert's fc1 and fc2 (fc1_w, fc2_w are then -1)
    int router_w = -1;
    std::vector<int> expert_fc1, expert_fc2;
    // With linear biases (add_bias_linear): the router's [E], each expert's fc1 [F1e] and fc2 [C]
    int router_b = -1;
    std::vector<int> expert_fc1_b, expert_fc2_b;
    // --moe-shared-expert-intermediate-size: the shared experts' fc1, fc2 and (gate) gate weight
    int shared_fc1 = -1, shared_fc2 = -1, shared_gate = -1;
    // --moe-latent-size: mlp.fc1_latent_proj [L, C] and mlp.fc2_latent_proj [C, L] (replicated)
    int latent_fc1 = -1, latent_fc2 = -1;
    // --moe-router-enable-expert-bias: mlp.router.expert_bias [E] (a buffer: ParamInfo::buffer)
    int expert_bias = -1;
    // --softmax-type learnable: self_attention.core_attention.softmax_offset [heads], split as the heads
    int softmax_offset = -1;
    // A Gated DeltaNet layer (--experimental-attention-variant gated_delta_net; model/gated_delta_net.cpp):
    // qkv_w is its in_proj, proj_w its out_proj (no biases); the convolution's conv1d.weight, dt_bias,
    // A_log (split with the heads) and out_norm's weight and bias (replicated).
    bool linear = false;
    int conv_w = -1, dt_bias = -1, a_log = -1, out_norm_w = -1, out_norm_b = -1;
    // A Mamba layer (--hybrid-override-pattern's M; model/mamba_mixer.cpp): linear too (qkv_w its
    // mixer.in_proj, proj_w its mixer.out_proj, ln1 its norm); conv_w and conv_b the convolution's weight and
    // bias, dt_bias, a_log and d_skip (mixer.D) split with the heads, out_norm_w the gated norm's weight.
    bool mamba = false;
    int conv_b = -1, d_skip = -1;
    // Which blocks the layer has (--hybrid-override-pattern: a mixer-only or an MLP-only layer; else both).
    bool attention = true, mlp = true;
  };
  // The bias of the last row-parallel layer of layer p (fc2's, none for an MoE layer, or the
  // projection's without an MLP block): the one whose output gradient a LayerNorm backward may make.
  static int output_bias(const LayerParams& p) { return p.mlp ? p.fc2_b : p.proj_b; }
  // The attention sinks' logits of layer p's local heads [Hl] (--softmax-type; null: vanilla) and,
  // with learnable ones, their gradient (else null).
  const float* softmax_offset(const LayerParams& p) const;
  float* softmax_offset_grad(const LayerParams& p);
  // --num-experts: the MoE layer's shape, weights and gradients of layer p (model/moe_layer.h).
  // B x T: the micro-batch's rows here (seq_aux_loss's sequences); capacity: a training or evaluation
  // forward, not generation (the capacity's drops, the forced balance); training: a training forward.
  MoeShape moe_shape(int64_t B, int64_t T, bool capacity, bool training) const;
  // l: the layer's number, B x Tl the micro-batch's rows here (the input jitter's draws).
  MoeWeights moe_weights(const LayerParams& p, int64_t l, int64_t B, int64_t Tl, const MicroBatchKey& key) const;
  MoeGrads moe_grads(const LayerParams& p) const;
  // The group whose ranks route the micro-batch's other tokens (their routing statistics summed over
  // it): the tensor-parallel group with whole experts (each rank routes its sequence-parallel rows),
  // else the context-parallel group; null: none.
  Comm* moe_token_group() const;
  // The MoE layer's rows here: this rank's sequence-parallel rows with whole experts, else all N.
  int64_t moe_rows(int64_t N) const { return experts_whole_ ? tp_.shard_rows(N) : N; }
  // --qk-layernorm's parameters and gradients of layer p (model/qk_layernorm.h); --qk-l2-norm's
  // unit weights and zero biases, its gradients a sink; and the norm's kind (--qk-l2-norm: RMSNorm).
  QkNormParams qk_norm_params(const LayerParams& p) const;
  QkNormGrads qk_norm_grads(const LayerParams& p) const;
  Normalization qk_normalization() const { return cfg_.qk_l2_norm ? Normalization::rmsnorm : normalization(); }

  // --mtp-num-layers: a prediction depth's parameters (Megatron-Core's mtp.layers.<k>.*) and kept
  // buffers (gpt_model.cpp), per slot of the loss chunk.
  struct MtpParams {
    int enorm_w = -1, enorm_b = -1, hnorm_w = -1, hnorm_b = -1, eh_proj_w = -1, norm_w = -1, norm_b = -1;
    LayerParams layer;  // transformer_layer
  };
  struct MtpDepth;

  struct RegistryOnly {};
  // parameter_registry's model: its config, placement and experts, its parameters registered, nothing else.
  GPTModel(RegistryOnly, const TransformerConfig& config, const TensorParallel& tp, const ModelPlacement& placement,
           int ep_rank, int ep_size);
  void register_parameters();
  static void allocate(std::vector<Activations>& acts, std::vector<MtpDepth>& mtp, Scratch& scratch, Arena& arena,
                       const TransformerConfig& cfg, const TensorParallel& tp, const ModelPlacement& place,
                       int64_t B, int64_t T, int ep, int cp);
  // Prediction depth k's inputs, positions, targets and loss mask: the micro-batch's (mtp_tokens_, and
  // loss_mask [B, T x cp] or null: ones) rolled left by s = k + 1 along each whole sequence (Megatron's
  // roll_tensor s times: the last s of each sequence 0), then this rank's rows (its context-parallel
  // chunks) into `to` (host, then uploaded) and its mask; the document ids (and with context parallelism
  // the keys') kept, main's. group_rows: the embedding backward's row groups too (a GPU's).
  void shift_inputs(Activations& to, std::vector<float>& mask, const Activations& main, int64_t s,
                    const float* loss_mask, int64_t B, int64_t Tl, bool group_rows);
  // The embedding backward's row groups (a.groups) of a's N inputs and positions (made on the host).
  void group_embedding_rows(Activations& a, int64_t N);
  // The embedding of a's inputs and positions into out [Ns, C] (this rank's rows), then the hidden
  // dropout of stream `site`; and its backward from d_resid (overwritten) into wte's and wpe's grads.
  void embedding_forward(float* out, const Activations& a, int64_t B, int64_t T, const MicroBatchKey& key,
                         const std::string& site);
  void embedding_backward_from(const Activations& a, int64_t B, int64_t T, const MicroBatchKey& key,
                               const std::string& site);
  // The prediction depths of the micro-batch in (loss chunk) `slot` after the main model's forward:
  // each depth's forward, loss and (training) its output layer's backward, whose gradient of the
  // depth's final_layernorm output it keeps. loss_mask: the micro-batch's (host [B, T x cp], the whole
  // sequences', or null); T: this rank's rows per sequence.
  void mtp_forward(Activations& a, int slot, const float* loss_mask, int64_t B, int64_t T, float grad_scale,
                   const MicroBatchKey& key);
  // Their backward, last depth first; leaves the gradient of the main final LayerNorm's output
  // rows of this rank (hnorm's input at depth 1) in the scratch's mtp_d_h [Ns, C].
  void mtp_backward(Activations& a, int slot, int64_t B, int64_t T, const MicroBatchKey& key);
  // The output layer's backward on a's logits (their gradient): dWout accumulates; returns the
  // gradient of a.lnf (this rank's rows, [Ns, C], reduced over the group) in the scratch.
  LayerNormDout output_layer_backward(Activations& a, int64_t N);
  Activations& acts(int chunk, int slot);
  bool has_embedding(int chunk) const { return place_.pre_process && chunk == 0; }
  bool has_loss(int chunk) const { return place_.post_process && chunk == num_chunks() - 1; }
  // Token ids, positions and document ids of inputs tokens[b, 0:T] (rows of token_stride;
  // a host array), with `labels` the targets tokens[b, 1:T+1] too: computed on the host,
  // then one upload into the micro-batch's device buffers. group_rows: also the rows
  // grouped by token and by position for the embedding's backward (a.groups; on a GPU).
  // With context parallelism T is the whole sequence and only this rank's rows are kept (a.n
  // rows of B x T/P). Documents end after each eod token, or with segments ([B, T], SFT's packed
  // conversations) where the segment changes: a token of another segment than the one before it starts
  // a document (its position 0 with reset_position_ids, its own attention with reset_attention_mask).
  void prepare_inputs(Activations& a, const int32_t* tokens, int64_t token_stride, int64_t B, int64_t T,
                      bool labels, bool group_rows = false, const int32_t* segments = nullptr);
  // Context parallelism: the local rows of B sequences of Tl = T/P rows in runs of consecutive
  // tokens (one per sequence and chunk): first local row, rows, position in the sequence and
  // token index in the micro-batch (b T + position). One run of all rows without it.
  struct TokenRun {
    int64_t row, rows, position, token;
  };
  std::vector<TokenRun> token_runs(int64_t B, int64_t Tl) const;
  // The hidden dropout's calls over this rank's shard rows [row0, row0 + Ns) (of N = B Tl):
  // runs of consecutive tokens, each with its first row within the shard and the dropout index
  // of its first element (the token's in one process, times C). One run without context
  // parallelism or without dropout (p = 0).
  struct DropoutRun {
    int64_t row, rows;
    uint64_t first_index;
  };
  std::vector<DropoutRun> dropout_runs(int64_t B, int64_t Tl, float p) const;
  // The micro-batch's T (the whole sequence) as this rank's rows per sequence, checked.
  int64_t local_seq_length(int64_t T) const;
  void forward_chunk(int chunk, Activations& a, int64_t B, int64_t T, const MicroBatchKey& key);
  // A training forward's MoE statistics of MoE layer p (the buffers a.layers[i]; index: its place among
  // this rank's layers, the decoder's in layers_ order, then the prediction depths'): the losses' sums,
  // the global balance's counts, the expert bias's token counts.
  void track_moe_forward(const LayerParams& p, Activations& a, size_t i, size_t index, int64_t B, int64_t T);
  // The LayerNorm that reads a row-parallel layer's output next, made in one pass with it
  // (bias_dropout_add_layernorm_forward): LN2 after the projection; after fc2 the next
  // layer's LN1 or the final LayerNorm. out (this rank's rows, a linear layer's input as
  // layernorm_input writes it), mean, rstd: its buffers; w, b: its parameters.
  struct NextNorm {
    float* out;
    float* mean;
    float* rstd;
    int w, b;
  };
  // LN1 of chunk layer i (first: the chunk's first layer), or with i past the chunk's last
  // layer the final LayerNorm; null where there is none (a pipeline stage's last layer).
  std::optional<NextNorm> next_norm(int chunk, Activations& a, size_t i, int64_t row0);
  // The kernels' description of it (fp32 or bf16 output, as layernorm_input writes it).
  LayerNormOut layernorm_out(const NextNorm& n) const;
  // o's buffers from row `row` on (a LayerNorm's statistics one per row).
  LayerNormOut rows_from(LayerNormOut o, int64_t row) const;
  // Layer i of a chunk: a.resid[i] -> a.layers[i] -> a.resid[i + 1]. Without `output`
  // it stops after the GELU (a recomputed group's last layer: backward needs no more).
  // ln1_made: its LN1 was made with the previous layer's output (next_norm); `after`: the
  // LayerNorm to make with its output.
  void forward_layer(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                     const MicroBatchKey& key, bool output, bool ln1_made, const std::optional<NextNorm>& after);
  // Its MLP block (dense or MoE) from its LN2 output, mid the block's residual input (resid_mid, or the
  // layer's input in an MLP-only layer).
  void forward_mlp_block(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                         const MicroBatchKey& key, bool output, const std::optional<NextNorm>& after, const float* mid);
  // A dense layer's fc1 output and activation (x.fc1, x.gelu) from its LN2 output (forward,
  // and --recompute-modules mlp in backward).
  void mlp_fc1_forward(const LayerParams& p, Activations& a, size_t i, int64_t N);
  // Layer i's attn and lse from its qkv (forward, and selective recomputation in backward).
  void core_attention_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T,
                              const MicroBatchKey& key);
  // --multi-latent-attention (model/multi_latent_attention.cpp): layer i's qkv, in the fused layout
  // the core attention reads (before the rotation), from its LN1 output x [N, C] (every row);
  // mla_attention_output: attn_v, the attention's output without the values' padding.
  void mla_qkv_forward(const LayerParams& p, Activations& a, size_t i, LinearInput x, int64_t N);
  // Its second half: the up projections from the kept latents and the fused qkv (forward, and
  // --recompute-modules mla_up_proj in backward).
  void mla_up_forward(const LayerParams& p, Activations& a, size_t i, int64_t N);
  // A Gated DeltaNet layer (model/gated_delta_net.cpp): its core, from in_proj's output x.qkv to out_proj's
  // input x.attn [N, Hv Dv / P] (forward; selective recomputation), and the backward from out_proj's input
  // gradient in d_c2 (overwritten) to in_proj's output gradient in d_3c, with the gradients of conv1d,
  // A_log, dt_bias and out_norm; it reruns the core's forward first (only x.qkv and x.attn are kept),
  // unless `fresh`: recomputation has just run it (gdn_forward the layer's last, its buffers as needed).
  // Under context parallelism the core runs over the whole sequences, on each rank for its share of the
  // heads or for all of them (GdnContextParallel).
  // The core's shape on micro-batch a's rows (with --reset-attention-mask its document ids: the rows', or
  // under context parallelism the whole sequences').
  GdnShape gdn_shape(int64_t B, int64_t T, const Activations& a) const;
  // A Mamba layer (model/mamba_mixer.cpp): the same between in_proj's output x.qkv and out_proj's input
  // x.attn [N, I / P], with the gradients of conv1d, dt_bias, A_log, D and the gated norm's weight. Under
  // context parallelism each rank runs its share of the heads over the whole sequences (MambaContextParallel).
  MambaShape mamba_shape(int64_t B, int64_t T, const Activations& a) const;
  void mamba_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T);
  void mamba_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh);
  // The layer's parameters for all this rank's heads, or (under context parallelism) for its share of the
  // layer's shape s (its conv1d rows copied into mamba_cp_'s conv_w and conv_b; with `grads`, conv_dw and
  // conv_db zeroed for theirs).
  MambaCoreParams mamba_core_params(const LayerParams& p);
  MambaCoreParams mamba_head_share_params(const LayerParams& p, const MambaShape& s, bool grads);
  void gdn_forward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T);
  void gdn_backward(const LayerParams& p, Activations& a, size_t i, int64_t B, int64_t T, bool fresh);
  // The core of shape s with parameters w on rows x [N, W] into y [N, Hv Dv] with g's buffers; and its
  // backward from dy (overwritten) into dx [N, W] (written), the forward made again first (into y) unless
  // `fresh`, the parameters' gradients added where w says.
  void gdn_core_forward(const LayerParams& p, const GdnCoreParams& w, GdnScratch& g, const float* x, float* y,
                        const GdnShape& s);
  void gdn_core_backward(const LayerParams& p, const GdnCoreParams& w, GdnScratch& g, const float* x, float* y,
                         float* dy, float* dx, const GdnShape& s, bool fresh);
  // The layer's parameters for a core of all this rank's heads, the gradients to sink when not null.
  GdnCoreParams gdn_core_params(const LayerParams& p, float* sink = nullptr);
  // Under context parallelism with split heads: this rank's share (its conv1d rows copied into gdn_cp_'s
  // conv_w; with `grads`, conv_dw zeroed for theirs), for the layer's shape s.
  GdnCoreParams gdn_head_share_params(const LayerParams& p, const GdnShape& s, bool grads);
  // qkv's queries and keys rotated in place, each run of tokens at its positions (the rotary embedding),
  // unless layer `layer` is a NoPE layer (--no-rope-freq).
  void rotate_qkv(float* qkv, int64_t B, int64_t T, int64_t layer);
  void mla_attention_output(Activations& a, size_t i, int64_t N);
  // The backward from d_3c (the qkv gradient, rotated back): the weights' gradients (the latents'
  // gradients all-reduced over the tensor-parallel group first, so the replicated weights' are whole)
  // and LN1's output gradient, reduced: into d_c1, or this rank's rows in d_s with sequence parallelism.
  void mla_qkv_backward(const LayerParams& p, Activations& a, size_t i, LinearInput x, int64_t N);
  // linear_proj's input gradient d_attn_v [N, Hl Dv] widened to the attention's [N, Hl, D] in d_c2.
  void mla_attention_output_backward(const float* d_attn_v, int64_t N);
  // d_lnf: gradient of the final LayerNorm's output rows of this rank ([Ns, C]), or null
  // when the chunk has no final norm (the output gradient is then in scratch d_resid).
  void backward_chunk(int chunk, Activations& a, const LayerNormDout* d_lnf, int64_t B, int64_t T,
                      const MicroBatchKey& key);
  // The layers' part of it: a's layers (parameters layers[0 ..]) and the norm after them (w, b),
  // leaving the gradient of a.resid[0] in d_resid. chunk: the pipeline chunk (its recomputed
  // groups), or -1 for a prediction depth (nothing recomputed).
  void backward_layers(const LayerParams* layers, int chunk, Activations& a, const LayerNormDout* d_norm, int norm_w,
                       int norm_b, int64_t B, int64_t T, const MicroBatchKey& key);
  // Output layer and vocab-parallel cross entropy on a.lnf; with `backward` the logits
  // become their gradients (scaled by grad_scale / mask sum). Returns the masked sum.
  LossSum output_loss(Activations& a, const float* loss_mask, int64_t B, int64_t T, bool backward,
                      float grad_scale);
  // l with the sum of the N token losses in a.losses, masked by host_mask (null: all ones).
  LossSum sum_losses(Activations& a, int64_t N, const float* host_mask, LossSum l);
  // The loss mask to use: loss_mask (a host array, or 1) times the eod mask; null when all
  // ones. Sets `host` to its host copy (null when all ones).
  const float* effective_loss_mask(Activations& a, const float* loss_mask, int64_t B, int64_t T,
                                   const float*& host);
  // A LayerNorm output shard [Ns, C] as the next linear layer's input: every token's rows
  // (all-gathered with sequence parallelism), in bf16 with bf16_inputs().
  LinearInput ln_input(const float* shard, int64_t N);
  // LayerNorm of rows x [rows, C] into a linear layer's input buffer (fp32, or bf16 with
  // bf16_inputs(): the GEMM then reads it without a conversion).
  void layernorm_input(float* out, float* mean, float* rstd, const float* x, int w, int b, int64_t rows);
  // Bytes per element of the linear layers' inputs (2 with bf16_inputs(), else 4), row `row`
  // of such an input in buf, and the all-gather of an input's shards (sequence parallelism;
  // bf16 rows as fp32 values of half the count: the same bytes, C even).
  size_t input_bytes() const { return bf16_inputs() ? sizeof(uint16_t) : sizeof(float); }
  float* input_row(float* buf, int64_t row) const;
  void gather_input_rows(float* full, int64_t N);
  // A buffer a kernel wrote for a linear layer's input (ln_input for LayerNorm outputs).
  LinearInput input(const float* x) const {
    return bf16_inputs() ? LinearInput::in_bf16(reinterpret_cast<const uint16_t*>(x)) : LinearInput(x);
  }
  GemmSite site(int param) const { return GemmSite{gemm_policy_, param}; }
  // The MoE router's and the shared experts' gate's GEMMs: fp32 with --moe-router-dtype fp32 or
  // under an fp8 policy, else as the other layers.
  GemmSite router_site(int param) const;
  // The linear layers' inputs made in bf16 by the kernels that produce them (LayerNorm,
  // bias_gelu) for a policy with bf16_results: no conversion pass per GEMM, and the same values
  // (the policy would convert fp32 inputs to exactly these). The buffers keep their fp32 size.
  bool bf16_inputs() const {
    return bf16_inputs_on_ && gemm_policy_ && gemm_policy_->bf16_results() && !(tp_.sp() && cfg_.hidden_size % 2) &&
           !cfg_.moe() &&  // the MoE layer reads and writes fp32 rows
           !cfg_.mtp();    // the prediction depths' hnorm reads the final LayerNorm's output in fp32
  }
  // While alive, the linear layers' inputs are made in fp32 (the logits of forward_logits
  // come from gemm_f32 on the final LayerNorm's fp32 output, as without bf16 inputs).
  class Fp32Inputs {
   public:
    explicit Fp32Inputs(bool& on) : on_(on), was_(on) { on_ = false; }
    ~Fp32Inputs() { on_ = was_; }
    Fp32Inputs(const Fp32Inputs&) = delete;
    Fp32Inputs& operator=(const Fp32Inputs&) = delete;

   private:
    bool& on_;
    bool was_;
  };
  // The output layer's logits and their gradient in bf16 (set_bf16_logits).
  bool bf16_logits() const { return bf16_logits_on_ && gemm_policy_ && gemm_policy_->bf16_results(); }
  // The QKV layer's result in bf16 (set_bf16_qkv), and the core attention's input for it.
  // Not with the rotary embedding, which rotates the fp32 q and k (with their bias) in place
  // before the attention reads them, nor with context parallelism, which gathers fp32 keys, nor
  // with the output gate (its kernels read fp32 gates and write the gates' fp32 gradients).
  bool bf16_qkv() const {
    return bf16_attention_operands() && !rope_ && !cfg_.qk_norm() && !cfg_.attention_output_gate &&
           !cfg_.gated_delta_net();  // (a GDN layer's core reads in_proj's fp32 output)
  }
  // set_bf16_qkv's switch with a policy that has bf16 results (the rotary embedding aside).
  bool bf16_attention_operands() const {
    return bf16_qkv_on_ && gemm_policy_ && gemm_policy_->bf16_results() && !cfg_.moe() && !cp_.on();
  }
  AttentionOperand qkv_input(const LayerParams& p, const float* qkv) const;
  // With bf16_qkv(): the core attention's output in bf16 as well, written by the attention
  // forward behind the bf16 qkv in its buffer (whose fp32 size leaves room), which the
  // projection's GEMMs read (forward and weight gradient) without converting attn each time.
  // The row-parallel layers' (projection, fc2) results in bf16 as the GEMM writes them, with
  // set_bf16_qkv's switch (with the rotary embedding too): only without tensor parallelism,
  // where no reduction of partial sums comes between the GEMM and the rounding
  // (bias_dropout_add then reads half the bytes).
  bool bf16_row_outputs() const { return bf16_attention_operands() && tp_.size() == 1; }
  // out = residual + dropout(round(x W^T) + bias) for row-parallel layer w (bias b), through
  // y ([Ns, C] scratch; [N, C] rows without sequence parallelism): Megatron's bias_dropout_add.
  // With `norm`, that LayerNorm of out as well, in the same pass.
  void row_parallel_output(float* out, const float* residual, float* y, LinearInput x, int w, int b, int64_t N,
                           int64_t in_local, float p, const PhiloxStream& stream, const std::vector<DropoutRun>& runs,
                           const std::optional<NextNorm>& norm);
  // The output gradient of a row-parallel layer (projection, fc2; bias b), [Ns, C], from
  // the residual stream's gradient d_resid through the layer's dropout. With bf16 inputs and
  // without sequence parallelism only in bf16 (.bf16, in scratch d_f: free in the bf16
  // backward until the attention backward's bf16 dqkv), made in one pass with the bias
  // gradient, which is then summed (bias_backward_cast_bf16, or with dropout
  // dropout_backward_bias_cast_bf16); else in fp32 (.fp32, hidden_dropout_backward's) for the
  // GEMMs to convert and linear_backward to sum.
  struct RowOutputGrad {
    const float* fp32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };
  // made: the LayerNorm backward before it wrote .bf16 and the bias gradient already
  // (residual_grad_out).
  RowOutputGrad row_output_grad(float* d_rows, int b, int64_t N, float p, const PhiloxStream& stream,
                                const std::vector<DropoutRun>& runs, bool made = false);
  // Not with context parallelism, whose dropout runs (dropout_runs) the fused kernels don't take.
  bool bf16_row_output_grads() const {
    return bf16_inputs() && !tp_.sp() && cfg_.hidden_size <= 2 * Fl_ && !cp_.on();
  }
  // Without dropout (p = 0) on row_output_grad's bf16 path the output gradient is d_resid
  // itself: the LayerNorm backward that makes d_resid also writes its bf16 cast and sums
  // the bias gradient (of bias b) as it goes (layernorm_backward's ResidualGradOut), and
  // row_output_grad then has nothing to read. Empty (nothing made there) otherwise.
  ResidualGradOut residual_grad_out(int b, float p) const;
  // Without tensor parallelism the column-parallel layers' (QKV, fc1) input gradients are
  // written rounded, in bf16, by their GEMMs (no reduction comes between the GEMM and the
  // rounding), and the LayerNorm backward before them reads them so: half the bytes written
  // and read. With bf16_qkv() (the GPU's storage choices): the CPU's GEMM would write fp32
  // and pack it after, which costs it more than the rounding as read. ln_grad_site: the
  // input-gradient site of such a layer's weight w; ln_dout: the LayerNorm backward's
  // operand for the gradient it left in d (rounded as read otherwise).
  bool bf16_ln_grads() const { return bf16_qkv() && bf16_inputs() && tp_.size() == 1; }
  GemmSite ln_grad_site(int w) const;
  LayerNormDout ln_dout(const float* d, int w) const;
  // qkv, attn: a layer's buffers (Activations::Layer).
  uint16_t* attn_bf16(float* qkv, int64_t N) const;
  LinearInput proj_input(float* qkv, const float* attn, int64_t N) const;
  // The linear_proj's input of layer x (its bf16 attn, attn, MLA's attn_v, or the gated attn made by
  // gate_attention_output).
  LinearInput proj_input(const LayerParams& p, const Activations& a, size_t i, int64_t N) const;
  // --attention-output-gate: a layer's attn [N, Q/P] times sigmoid of its qkv's gates into
  // scratch_->attn_gated; else nothing.
  void gate_attention_output(const float* attn, const float* qkv, int64_t N);
  // linear_proj's inputs on this rank: Hl x kv_channels, or Hl x v_head_dim with MLA.
  int64_t proj_in_local(const LayerParams& p) const { return cfg_.layer_proj_width(p.layer) / tp_.size(); }
  // The gradient of a row-parallel layer's output ([Ns, C]) from d_resid, the residual
  // stream's: dropout's backward into d_rows, or without dropout (p == 0, the identity)
  // d_resid itself, not copied (a read and a write of [Ns, C] fewer).
  const float* hidden_dropout_backward(float* d_rows, float p, const PhiloxStream& stream,
                                       const std::vector<DropoutRun>& runs) const;
  const float* output_weight() const;
  float* output_weight_grad();
  // A linear layer's bias b, or null when it has none (--disable-bias-linear), for the
  // kernels that take null for no bias; bias() gives zeros instead to the fused kernels
  // that always add one, and bias_grad() a sink (never read) to those that always sum one.
  // A LayerNorm's kind (--normalization); RMSNorm has no bias parameter (bias(-1): zeros).
  Normalization normalization() const {
    return cfg_.rmsnorm() ? Normalization::rmsnorm : Normalization::layernorm;
  }
  // A norm's weight as the kernels apply it: the parameter, or with --apply-layernorm-1p its
  // 1 + weight (norm_1p_, made from the parameters before every forward by
  // refresh_norm_weights; the gradient with respect to either is the same).
  const float* norm_weight(int w) const {
    return cfg_.apply_layernorm_1p ? norm_1p_.data() + norm_1p_at_[size_t(w)] : params_.param(w);
  }
  void refresh_norm_weights();
  void allocate_norm_1p();  // norm_1p_ and its offsets, for the model's norm weights
  const float* bias_or_null(int b) const { return b >= 0 ? params_.param(b) : nullptr; }
  float* bias_grad_or_null(int b) const { return b >= 0 ? params_.grad(b) : nullptr; }
  const float* bias(int b) const { return b >= 0 ? params_.param(b) : no_bias_.data(); }
  float* bias_grad(int b) const { return b >= 0 ? params_.grad(b) : bias_grad_sink_.data(); }
  void grads_ready(const std::vector<int>& indices) const {
    if (grad_ready_ && !grads_pending_)
      for (int i : indices)
        if (i >= 0 && i != shared_embedding_) grad_ready_(i);
  }

  TransformerConfig cfg_;
  TensorParallel tp_;
  ContextParallel cp_;
  ModelPlacement place_;
  Comm* ep_ = nullptr;                 // the expert-parallel group (null: none)
  int64_t first_expert_ = 0, local_experts_ = 0;  // this rank's experts of each MoE layer
  // --expert-tensor-parallel-size 1 under tensor parallelism: every expert whole here, the MoE layer
  // on this rank's sequence-parallel rows (the tensor-parallel ranks routing their own tokens).
  bool experts_whole_ = false;
  Comm* tp_cp_ = nullptr;  // (set_tensor_context_group)
  mutable DeviceArray<float> moe_ep_scratch_;  // the expert-parallel dispatch's (MoeExpertParallel)
  int64_t max_B_, max_T_;             // max_T_: this rank's rows per sequence (T/P with context parallelism)
  int64_t Hl_, Fl_, Vl_;               // heads, ffn columns and vocabulary rows on this rank
  int64_t Gl_;                         // query groups on this rank (Hl_ without grouping)
  // The QKV layer's output columns on this rank: 3 Hl D, or with grouped-query attention
  // (Hl + 2 Gl) D.
  int64_t qkv_local() const { return cfg_.qkv_width() / tp_.size(); }
  // Layer p's: in_proj's with a GDN layer.
  int64_t qkv_local(const LayerParams& p) const { return cfg_.layer_qkv_width(p.layer) / tp_.size(); }
  QkvLayout qkv_layout() const { return {Hl_, Gl_, cfg_.kv_channels, cfg_.attention_output_gate}; }  // this rank's qkv (kernels/qkv_layout.h)
  // fc1's output columns on this rank: Fl_, or the gate's and the up projection's with SwiGLU.
  int64_t fc1_local() const { return cfg_.fc1_width() / tp_.size(); }
  int64_t vocab_begin_, vocab_valid_;  // first vocabulary row here; real (unpadded) rows here
  ParamBuffer params_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, out_w_ = -1, shared_embedding_ = -1;
  // --mtp-num-layers on a last pipeline stage of an untied model: its copy of the word embedding for the
  // depths' lookup (a shared embedding, as the tied output layer's copy is); -1 otherwise.
  int mtp_wte_ = -1;
  // The word embedding this rank's lookups read: the embedding's, or on a last stage without it the
  // copy (the tied output layer's, or mtp_wte_).
  int word_embedding() const { return wte_ >= 0 ? wte_ : mtp_wte_ >= 0 ? mtp_wte_ : out_w_; }
  std::vector<LayerParams> layers_;    // every layer of every chunk, in chunk order
  std::vector<MtpParams> mtp_;         // --mtp-num-layers: each depth's (on the last stage)
  std::vector<MtpDepth> mtp_acts_;     // [slot * mtp_num_layers + depth] (the loss chunk's)
  std::vector<LossSum> mtp_losses_;    // [mtp_num_layers] take_mtp_losses'
  // --mtp-num-layers: the micro-batch's whole sequences' inputs, positions and targets [3, B, T x cp]
  // (prepare_inputs', on the loss chunk).
  std::vector<int32_t> mtp_tokens_;
  std::vector<size_t> chunk_first_;    // index in layers_ of each chunk's first layer
  std::function<void(int)> grad_ready_;
  // --mtp-use-repeated-layer: while a later depth's backward runs, its (the shared) parameters' gradients are
  // not final yet: the first depth's backward, the last to run, announces them.
  bool grads_pending_ = false;
  GemmPolicy* gemm_policy_ = nullptr;
  AttentionMath attention_math_ = AttentionMath::fp32;
  bool bf16_logits_on_ = current_device() != Device::cpu;
  bool bf16_inputs_on_ = true;
  bool bf16_qkv_on_ = current_device() != Device::cpu;
  bool selective_ = false;             // selective recomputation (core attention)
  LossSum load_balancing_, seq_load_balancing_, global_load_balancing_, z_loss_;  // take_moe_losses'
  std::vector<LossSum> layer_load_balancing_, layer_z_loss_;  // [num_layers] the same per layer
  std::vector<MoeGlobalBalance> global_balance_;  // [layers_] global_aux_loss's statistics (empty: none)
  Comm* data_parallel_ = nullptr;      // set_data_parallel_group's
  std::vector<double> expert_tokens_;  // [layers_, E] tokens per expert since the last bias update (expert bias)
  Arena arena_;
  std::vector<Activations> acts_;      // [chunk * slots + slot]
  std::unique_ptr<Scratch> scratch_;
  DocumentBoundaries docs_;
  bool loss_gradient_of_sum_ = false;
  std::unique_ptr<RotaryEmbedding> rope_;  // with --position-embedding-type rope
  std::unique_ptr<RotaryEmbedding> rope_long_;  // LongRoPE's long factors' (rope_: its short ones)
  DeviceArray<float> no_bias_, bias_grad_sink_;  // with --disable-bias-linear or RMSNorm (zeroed when allocated)
  DeviceArray<float> zero_offsets_;              // [Hl] zeros: --softmax-type off-by-one's sink logits
  DeviceArray<float> qk_l2_ones_;                // [D] ones: --qk-l2-norm's weights
  // --apply-layernorm-1p: every norm weight's 1 + weight, at norm_1p_at_[param] (-1: not a norm
  // weight), and the ones added.
  DeviceArray<float> norm_1p_, norm_ones_;
  std::vector<int64_t> norm_1p_at_;
  DeviceArray<float> row_max_;         // [B*T] cross entropy statistics
  DeviceArray<double> ce_stats_;       // [B*T, 2]
  DeviceArray<float> sp_grads_;        // sequence-parallel gradient staging
  std::vector<float> losses_host_;     // [B*T] the token losses read back (device runs)
  // Context parallelism: the gathered keys and values [B, T, Gl, 2, D], the collectives' staging
  // (the same size; the key and value gradients in backward), the reduce-scattered gradients
  // [B, T/P, Gl, 2, D], and this rank's rows of a given loss mask [B, T/P].
  DeviceArray<float> cp_kv_, cp_staging_, cp_recv_;
  std::vector<float> cp_loss_mask_;
  std::unique_ptr<GdnContextParallel> gdn_cp_;  // GDN layers under context parallelism
  std::unique_ptr<MambaContextParallel> mamba_cp_;  // Mamba layers under context parallelism
};

}  // namespace lattice
