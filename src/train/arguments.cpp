#include "train/arguments.h"

#include "pipeline/schedule.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/device.h"
#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "data/training_data.h"
#include "model/hybrid_layer_allocation.h"
#include "model/mixed_precision.h"
#include "train/result_validation.h"

namespace lattice {
namespace {

enum class Kind { i64, u64, f32, f64, opt_f64, str, flag, list, f32_list };

struct Flag {
  const char* name;  // without the leading --
  Kind kind;
  void* target;
  const char* help;
};

// The flag table: one row per flag, Megatron's names and defaults (the defaults are
// the TrainArgs member initialisers).
std::vector<Flag> flag_table(TrainArgs& a) {
  return {
      {"num-layers", Kind::i64, &a.num_layers, "number of transformer layers"},
      {"hidden-size", Kind::i64, &a.hidden_size, "transformer hidden size"},
      {"num-attention-heads", Kind::i64, &a.num_attention_heads, "attention heads"},
      {"ffn-hidden-size", Kind::i64, &a.ffn_hidden_size, "MLP hidden size (0: 4 x hidden size; with --swiglu int(8/3 hidden / 64) x 64)"},
      {"kv-channels", Kind::i64, &a.kv_channels, "head dim (0: hidden size / heads)"},
      {"seq-length", Kind::i64, &a.seq_length, "sequence length"},
      {"max-position-embeddings", Kind::i64, &a.max_position_embeddings, "position table size"},
      {"position-embedding-type", Kind::str, &a.position_embedding_type,
       "learned_absolute (a learned table), rope (rotary embedding of q and k), yarn (rope with YaRN's frequencies) "
       "or none (NoPE)"},
      {"rotary-percent", Kind::f64, &a.rotary_percent, "with rope: share of each head's dims rotated"},
      {"rotary-base", Kind::f32, &a.rotary_base, "with rope: the base of the rotation frequencies"},
      {"rotary-interleaved", Kind::flag, &a.rotary_interleaved,
       "with rope: rotate the pairs (2i, 2i+1) instead of (i, i + dims/2)"},
      {"rotary-seq-len-interpolation-factor", Kind::f32, &a.rotary_seq_len_interpolation_factor,
       "with rope: positions divided by this (0: none)"},
      {"use-rope-scaling", Kind::flag, &a.use_rope_scaling,
       "with rope: Llama 3.1's frequency-dependent scaling of the rotary frequencies"},
      {"rope-scaling-factor", Kind::f32, &a.rope_scaling_factor,
       "with --use-rope-scaling: long wavelengths' stretch factor"},
      {"rope-scaling-low-freq-factor", Kind::f32, &a.rope_scaling_low_freq_factor,
       "with --use-rope-scaling: wavelengths above original context / this are stretched"},
      {"rope-scaling-high-freq-factor", Kind::f32, &a.rope_scaling_high_freq_factor,
       "with --use-rope-scaling: wavelengths below original context / this are kept"},
      {"rope-scaling-original-max-position-embeddings", Kind::i64,
       &a.rope_scaling_original_max_position_embeddings, "with --use-rope-scaling: the original context"},
      {"yarn-rotary-scaling-factor", Kind::f32, &a.yarn_rotary_scaling_factor,
       "with yarn: the context's extension factor s (GPT-OSS: 32)"},
      {"yarn-original-max-position-embeddings", Kind::i64, &a.yarn_original_max_position_embeddings,
       "with yarn: the original context (GPT-OSS: 4096)"},
      {"yarn-beta-fast", Kind::f32, &a.yarn_beta_fast, "with yarn: pairs turning more often over the original context keep their frequency"},
      {"yarn-beta-slow", Kind::f32, &a.yarn_beta_slow, "with yarn: pairs turning less often are interpolated (frequency / s)"},
      {"yarn-mscale", Kind::f32, &a.yarn_mscale, "with yarn: the attention factor's m(s, mscale) = 0.1 mscale ln s + 1"},
      {"yarn-mscale-all-dim", Kind::f32, &a.yarn_mscale_all_dim, "with yarn: the attention factor's divisor m(s, this)"},
      {"no-yarn-correction-range-round-to-int", Kind::flag, &a.no_yarn_correction_range_round_to_int,
       "with yarn: the ramp's dims not floored and ceiled to whole dims (GPT-OSS's truncate false)"},
      {"longrope-short-factor", Kind::f32_list, &a.longrope_short_factor,
       "LongRoPE (lattice's; Phi-3.5's rope_scaling longrope): each rotated pair's frequency divided by its factor "
       "in a sequence of at most --longrope-original-max-position-embeddings"},
      {"longrope-long-factor", Kind::f32_list, &a.longrope_long_factor,
       "LongRoPE: the pairs' factors in a longer sequence"},
      {"longrope-original-max-position-embeddings", Kind::i64, &a.longrope_original_max_position_embeddings,
       "LongRoPE: the longest sequence rotated by the short factors"},
      {"longrope-attention-factor", Kind::f32, &a.longrope_attention_factor,
       "LongRoPE: cos and sin times this (HuggingFace: sqrt(1 + ln(max / original) / ln original))"},
      {"make-vocab-size-divisible-by", Kind::i64, &a.make_vocab_size_divisible_by,
       "pad the vocabulary to a multiple of this (x TP)"},
      {"hidden-dropout", Kind::f32, &a.hidden_dropout, "dropout after attention/MLP and embedding"},
      {"attention-dropout", Kind::f32, &a.attention_dropout, "dropout on attention probabilities"},
      {"init-method-std", Kind::f32, &a.init_method_std, "std of the normal initialisation"},
      {"init-method-xavier-uniform", Kind::flag, &a.init_method_xavier_uniform,
       "initialize every weight matrix U(-a, a), a = sqrt(6 / (fan_in + fan_out)), instead of N(0, std)"},
      {"embedding-init-method-std", Kind::opt_f64, &a.embedding_init_method_std,
       "std of the word and position embeddings' normal initialisation (unset: as every weight)"},
      {"norm-epsilon", Kind::f32, &a.norm_epsilon, "LayerNorm epsilon"},
      {"openai-gelu", Kind::flag, &a.openai_gelu, "tanh GELU instead of the erf form"},
      {"squared-relu", Kind::flag, &a.squared_relu, "the MLP's activation is relu(x)^2 instead of GELU"},
      {"apply-layernorm-1p", Kind::flag, &a.apply_layernorm_1p,
       "every norm scales by 1 + weight, its weight starting at 0 (zero-centered gamma)"},
      {"group-query-attention", Kind::flag, &a.group_query_attention,
       "grouped-query attention: --num-query-groups keys and values shared by the heads"},
      {"num-query-groups", Kind::i64, &a.num_query_groups, "key/value heads with --group-query-attention"},
      {"swiglu", Kind::flag, &a.swiglu, "SwiGLU MLP: silu(gate) x up from fc1 [2 ffn, hidden] (default ffn 8/3 hidden)"},
      {"quick-geglu", Kind::flag, &a.quick_geglu,
       "gated MLP with quick GELU: gate sigmoid(1.702 gate) x up from fc1 [2 ffn, hidden] (GPT-OSS's)"},
      {"glu-linear-offset", Kind::f32, &a.glu_linear_offset, "with a gated MLP: add this to the up projection (GPT-OSS: 1)"},
      {"activation-func-clamp-value", Kind::f32, &a.activation_func_clamp_value,
       "with a gated MLP: clamp the gate to <= v and the up projection to [-v, v] (GPT-OSS: 7; 0: none)"},
      {"untie-embeddings-and-output-weights", Kind::flag, &a.untie_embeddings_and_output_weights,
       "separate output layer instead of the tied word embedding"},
      {"normalization", Kind::str, &a.normalization, "LayerNorm or RMSNorm (no mean subtracted, no bias)"},
      {"disable-bias-linear", Kind::flag, &a.disable_bias_linear,
       "no biases in the linear layers (QKV, projection, fc1, fc2)"},
      {"add-qkv-bias", Kind::flag, &a.add_qkv_bias, "a bias in the QKV layer even with --disable-bias-linear (Qwen2)"},
      {"window-size", Kind::str, &a.window_size,
       "sliding-window attention: W or W,0, each query attends the W keys before it and itself (-1: all)"},
      {"window-attn-skip-freq", Kind::str, &a.window_attn_skip_freq,
       "with --window-size: every N-th layer attends fully, or a list such as [1,1,0] (1: window, 0: full)"},
      {"no-rope-freq", Kind::str, &a.no_rope_freq,
       "with the rotary embedding: every N-th layer skips it (NoPE), or a list such as [0,0,0,1] (1: no rotation)"},
      {"experimental-attention-variant", Kind::str, &a.experimental_attention_variant,
       "gated_delta_net: Gated DeltaNet linear-attention layers (Qwen3-Next's) where --linear-attention-freq says"},
      {"linear-attention-freq", Kind::str, &a.linear_attention_freq,
       "with gated_delta_net: every N-th layer is an attention layer, the rest GDN, or a list such as [1,1,1,0] (1: GDN)"},
      {"linear-conv-kernel-dim", Kind::i64, &a.linear_conv_kernel_dim, "GDN: the causal convolution's width (default 4)"},
      {"hybrid-override-pattern", Kind::str, &a.hybrid_override_pattern,
       "a hybrid model (Nemotron-H's), one character per layer: M Mamba-2, * attention, - MLP, E MoE (e.g. M-M*-)"},
      {"hybrid-attention-ratio", Kind::f64, &a.hybrid_attention_ratio,
       "a hybrid model with this share of --num-layers attention-only layers among Mamba-2 layers (Megatron's spread)"},
      {"hybrid-mlp-ratio", Kind::f64, &a.hybrid_mlp_ratio,
       "a hybrid model with this share of --num-layers MLP-only layers among the Mamba-2 layers"},
      {"is-hybrid-model", Kind::flag, &a.is_hybrid_model,
       "a hybrid model: its pattern from the ratios or --hybrid-override-pattern (neither: every layer Mamba-2)"},
      {"mamba-state-dim", Kind::i64, &a.mamba_state_dim, "Mamba layers: the state's dims per group (default 128)"},
      {"mamba-head-dim", Kind::i64, &a.mamba_head_dim, "Mamba layers: each head's dims (default 64)"},
      {"mamba-num-groups", Kind::i64, &a.mamba_num_groups, "Mamba layers: groups of the B and C projections (default 8)"},
      {"mamba-num-heads", Kind::i64, &a.mamba_num_heads, "Mamba layers: heads (default 0: 2 x hidden / head dim)"},
      {"linear-key-head-dim", Kind::i64, &a.linear_key_head_dim, "GDN: each query and key head's dims (default 128)"},
      {"linear-value-head-dim", Kind::i64, &a.linear_value_head_dim, "GDN: each value head's dims (default 128)"},
      {"linear-num-key-heads", Kind::i64, &a.linear_num_key_heads, "GDN: query and key heads (default 16)"},
      {"linear-num-value-heads", Kind::i64, &a.linear_num_value_heads,
       "GDN: value heads, a multiple of the key heads (default 32)"},
      {"softmax-type", Kind::str, &a.softmax_type,
       "vanilla, off-by-one (a sink logit of 0 in every head's softmax) or learnable (one trained per head)"},
      {"num-experts", Kind::i64, &a.num_experts,
       "experts of every layer's mixture-of-experts MLP (0: the dense MLP; needs --disable-bias-linear)"},
      {"moe-router-topk", Kind::i64, &a.moe_router_topk, "experts each token is routed to (default 2)"},
      {"moe-ffn-hidden-size", Kind::i64, &a.moe_ffn_hidden_size, "each expert's ffn size (0: --ffn-hidden-size)"},
      {"moe-aux-loss-coeff", Kind::f32_list, &a.moe_aux_loss_coeff,
       "weight of the load-balancing loss's gradient (0: none), one per --moe-router-load-balancing-type"},
      {"moe-z-loss-coeff", Kind::f32, &a.moe_z_loss_coeff,
       "weight of the router z-loss (mean squared logsumexp of the logits; 0: none)"},
      {"moe-input-jitter-eps", Kind::f32, &a.moe_input_jitter_eps,
       "in training, the router reads its input times noise uniform in [1 - eps, 1 + eps) (0: none)"},
      {"mtp-num-layers", Kind::i64, &a.mtp_num_layers,
       "multi-token prediction depths after the final LayerNorm, each predicting one token further (0: none)"},
      {"mtp-loss-scaling-factor", Kind::f32, &a.mtp_loss_scaling_factor,
       "weight of the prediction depths' mean loss in the training loss (default 0.1)"},
      {"mtp-use-repeated-layer", Kind::flag, &a.mtp_use_repeated_layer,
       "one prediction depth's parameters for every depth (their gradients summed)"},
      {"moe-per-layer-logging", Kind::flag, &a.moe_per_layer_logging,
       "also log each MoE layer's load-balancing loss (and z-loss) to TensorBoard and --metrics-file"},
      {"moe-router-force-load-balancing", Kind::flag, &a.moe_router_force_load_balancing,
       "for benchmarks: route by random normal logits (near even expert loads), the gradient passed to the router"},
      {"moe-router-load-balancing-type", Kind::list, &a.moe_router_load_balancing_type,
       "aux_loss (the load-balancing loss, weighted by --moe-aux-loss-coeff), seq_aux_loss (per sequence), "
       "global_aux_loss (with the step's counts over the data-parallel ranks), a list of those (their losses "
       "added), sinkhorn (balanced choice in training, no loss) or none"},
      {"moe-layer-freq", Kind::str, &a.moe_layer_freq,
       "which layers are MoE layers: every N-th (an integer, default 1) or a list such as ([0]*1+[1]*23)"},
      {"moe-shared-expert-intermediate-size", Kind::i64, &a.moe_shared_expert_intermediate_size,
       "width of the shared experts' MLP every token also goes through (0: none)"},
      {"moe-latent-size", Kind::i64, &a.moe_latent_size,
       "the routed experts in a latent space of this width, between fc1_latent_proj and fc2_latent_proj (0: none)"},
      {"moe-shared-expert-gate", Kind::flag, &a.moe_shared_expert_gate,
       "scale the shared experts' output by a sigmoid gate per token (Qwen2-MoE)"},
      {"moe-expert-capacity-factor", Kind::opt_f64, &a.moe_expert_capacity_factor,
       "each expert takes at most ceil(tokens k / experts x this) tokens per micro-batch (default: none, dropless)"},
      {"moe-token-drop-policy", Kind::str, &a.moe_token_drop_policy,
       "with a capacity: probs (keep the largest gates, default) or position (keep the first tokens)"},
      {"moe-pad-expert-input-to-capacity", Kind::flag, &a.moe_pad_expert_input_to_capacity,
       "with a capacity: accepted (the padding rows carry gate 0: the same outputs and gradients as without)"},
      {"moe-router-num-groups", Kind::i64, &a.moe_router_num_groups,
       "group-limited routing: the experts in this many groups (with --moe-router-group-topk)"},
      {"moe-router-group-topk", Kind::i64, &a.moe_router_group_topk,
       "group-limited routing: each token's experts from its this many best groups"},
      {"moe-router-dtype", Kind::str, &a.moe_router_dtype,
       "fp32: the router's GEMM in fp32 under --bf16/--fp16 (default: the model's format)"},
      {"moe-router-score-function", Kind::str, &a.moe_router_score_function,
       "softmax (default) or sigmoid (scores normalized over the chosen experts)"},
      {"moe-router-enable-expert-bias", Kind::flag, &a.moe_router_enable_expert_bias,
       "a per-expert bias on the sigmoid scores for the choice, moved towards even loads (aux-loss-free)"},
      {"moe-router-bias-update-rate", Kind::f32, &a.moe_router_bias_update_rate,
       "the expert bias's step per iteration (default 1e-3)"},
      {"moe-router-pre-softmax", Kind::flag, &a.moe_router_pre_softmax,
       "gates: softmax over every expert, then the top-k of those (default: softmax over the top-k logits)"},
      {"moe-apply-probs-on-input", Kind::flag, &a.moe_apply_probs_on_input,
       "with --moe-router-topk 1: the gate multiplies the token's row before its expert, not the expert's output"},
      {"moe-router-topk-scaling-factor", Kind::f32, &a.moe_router_topk_scaling_factor,
       "multiplies the chosen experts' gates (default 1)"},
      {"qk-layernorm", Kind::flag, &a.qk_layernorm,
       "normalize each query and key head (--normalization over --kv-channels) before the rotary embedding (Qwen3)"},
      {"qk-l2-norm", Kind::flag, &a.qk_l2_norm,
       "scale each query and key head to unit RMS (no weights) before the rotary embedding (Llama 4)"},
      {"attention-output-gate", Kind::flag, &a.attention_output_gate,
       "gated attention (Qwen3-Next): linear_qkv makes a gate per query head; the head's output times sigmoid(gate)"},
      {"multi-latent-attention", Kind::flag, &a.multi_latent_attention,
       "multi-latent attention (DeepSeek-V2/V3): queries, keys and values from low-rank latents, a shared rotary "
       "key; with --qk-layernorm the latents are normalized"},
      {"q-lora-rank", Kind::i64, &a.q_lora_rank, "with MLA: the queries' latent rank (0: linear_q_proj, no latent)"},
      {"mla-latent-norm-epsilon", Kind::f32, &a.mla_latent_norm_epsilon,
       "with MLA and --qk-layernorm: the latents' norms' epsilon (0: --norm-epsilon)"},
      {"kv-lora-rank", Kind::i64, &a.kv_lora_rank, "with MLA: the keys' and values' latent rank (default 32)"},
      {"qk-head-dim", Kind::i64, &a.qk_head_dim, "with MLA: each head's unrotated query and key dims (default 128)"},
      {"qk-pos-emb-head-dim", Kind::i64, &a.qk_pos_emb_head_dim,
       "with MLA: each head's rotated query and key dims, the key's shared by the heads (default 64)"},
      {"v-head-dim", Kind::i64, &a.v_head_dim, "with MLA: each head's value dims (default 128)"},
      {"micro-batch-size", Kind::i64, &a.micro_batch_size, "sequences per micro-batch"},
      {"global-batch-size", Kind::i64, &a.global_batch_size,
       "sequences per iteration (0: micro-batch size)"},
      {"train-iters", Kind::i64, &a.train_iters, "iterations to train"},
      {"log-interval", Kind::i64, &a.log_interval, "iterations between log lines"},
      {"seed", Kind::u64, &a.seed, "random seed (initialisation, dropout)"},
      {"optimizer", Kind::str, &a.optimizer, "adam (AdamW), sgd or muon (the weight matrices orthogonalized)"},
      {"muon-momentum", Kind::f32, &a.muon_momentum, "Muon's momentum (an EMA of the gradients; default 0.9)"},
      {"muon-use-nesterov", Kind::flag, &a.muon_use_nesterov, "Muon with Nesterov momentum"},
      {"muon-nesterov", Kind::flag, &a.muon_use_nesterov, "the same as --muon-use-nesterov"},
      {"muon-num-ns-steps", Kind::i64, &a.muon_num_ns_steps, "Muon's Newton-Schulz steps (default 5)"},
      {"muon-scale-mode", Kind::str, &a.muon_scale_mode,
       "Muon's update scale: spectral (sqrt(max(rows, cols)), default), unit_rms_norm or shape_scaling"},
      {"muon-extra-scale-factor", Kind::f32, &a.muon_extra_scale_factor, "multiplies Muon's update (default 1)"},
      {"muon-split-qkv", Kind::flag, &a.muon_split_qkv,
       "orthogonalize linear_qkv's queries, keys and values apart (the default)"},
      {"muon-no-split-qkv", Kind::flag, &a.muon_no_split_qkv, "orthogonalize linear_qkv as one matrix"},
      {"muon-tp-mode", Kind::str, &a.muon_tp_mode,
       "Muon under tensor parallelism: blockwise (each rank's shard on its own, default) or duplicated (the "
       "shards gathered, the whole matrix orthogonalized on every rank)"},
      {"muon-fp32-matmul-prec", Kind::str, &a.muon_fp32_matmul_prec,
       "medium, high or highest: accepted; lattice's Newton-Schulz GEMMs are always fp32 (highest)"},
      {"muon-coefficient-type", Kind::str, &a.muon_coefficient_type,
       "Newton-Schulz coefficients: quintic (default), simple, polar_express or aol"},
      {"muon-scalar-optimizer", Kind::str, &a.muon_scalar_optimizer,
       "the optimizer of the parameters Muon leaves (embedding, output layer, norms, biases): adam"},
      {"lr", Kind::f64, &a.lr, "learning rate"},
      {"min-lr", Kind::f64, &a.min_lr, "minimum learning rate (used by the LR schedule)"},
      {"weight-decay", Kind::f64, &a.weight_decay, "decoupled weight decay (not on biases/1-D)"},
      {"adam-beta1", Kind::f32, &a.adam_beta1, "Adam beta1"},
      {"adam-beta2", Kind::f32, &a.adam_beta2, "Adam beta2"},
      {"adam-eps", Kind::f32, &a.adam_eps, "Adam epsilon"},
      {"sgd-momentum", Kind::f32, &a.sgd_momentum, "SGD momentum"},
      {"use-precision-aware-optimizer", Kind::flag, &a.use_precision_aware_optimizer,
       "let --exp-avg-dtype and --exp-avg-sq-dtype store Adam's moments in bf16 (Megatron's precision-aware "
       "optimizer)"},
      {"exp-avg-dtype", Kind::str, &a.exp_avg_dtype, "Adam's first moment: fp32 or bf16 (half its memory)"},
      {"exp-avg-sq-dtype", Kind::str, &a.exp_avg_sq_dtype, "Adam's second moment: fp32 or bf16 (half its memory)"},
      {"main-grads-dtype", Kind::str, &a.main_grads_dtype, "the main gradients' dtype: fp32 (lattice's only)"},
      {"main-params-dtype", Kind::str, &a.main_params_dtype, "the main parameters' dtype: fp32 (lattice's only)"},
      {"clip-grad", Kind::f32, &a.clip_grad, "global gradient-norm clipping (0: off)"},
      {"tensor-model-parallel-size", Kind::i64, &a.tensor_model_parallel_size, "TP size"},
      {"pipeline-model-parallel-size", Kind::i64, &a.pipeline_model_parallel_size, "PP size"},
      {"expert-model-parallel-size", Kind::i64, &a.expert_model_parallel_size,
       "EP size: each MoE layer's experts split over this many data-parallel ranks (all-to-all token dispatch)"},
      {"context-parallel-size", Kind::i64, &a.context_parallel_size,
       "CP size: every sequence split over this many ranks (two chunks each; the keys and values all-gathered)"},
      {"cp-comm-type", Kind::str, &a.cp_comm_type,
       "accepted: p2p | a2a | allgather | a2a+p2p (the same math; lattice all-gathers the keys and values)"},
      {"num-layers-per-virtual-pipeline-stage", Kind::i64, &a.num_layers_per_virtual_pipeline_stage,
       "layers per model chunk: interleaved 1F1B with L / (PP x this) chunks per stage"},
      {"num-virtual-stages-per-pipeline-rank", Kind::i64, &a.num_virtual_stages_per_pipeline_rank,
       "model chunks per pipeline stage (interleaved 1F1B): the other way to give --num-layers-per-virtual-pipeline-stage"},
      {"microbatch-group-size-per-virtual-pipeline-stage", Kind::i64,
       &a.microbatch_group_size_per_virtual_pipeline_stage,
       "interleaved 1F1B: the consecutive micro-batches run through one chunk before the next, between PP and the "
       "micro-batches per step (0: PP)"},
      {"pipeline-model-parallel-layout", Kind::str, &a.pipeline_model_parallel_layout,
       "the layers of each pipeline stage, e.g. \"Et*3|(tt|)*2,t*2L\" (E embedding, t layer, m MTP depth, L loss; "
       "stages split by |, in virtual-stage order; docs/distributed.md)"},
      {"decoder-first-pipeline-num-layers", Kind::i64, &a.decoder_first_pipeline_num_layers,
       "layers on the first pipeline stage (0: even split)"},
      {"decoder-last-pipeline-num-layers", Kind::i64, &a.decoder_last_pipeline_num_layers,
       "layers on the last pipeline stage (0: even split)"},
      {"account-for-embedding-in-pipeline-split", Kind::flag, &a.account_for_embedding_in_pipeline_split,
       "count the embedding as one layer in the pipeline split: the first stage holds one layer fewer"},
      {"account-for-loss-in-pipeline-split", Kind::flag, &a.account_for_loss_in_pipeline_split,
       "count the output layer and loss as one layer in the pipeline split: the last stage holds one layer fewer"},
      {"dry-run", Kind::flag, &a.dry_run, "print the parallel layout and pipeline schedule, then exit"},
      {"bf16", Kind::flag, &a.bf16, "bf16 mixed precision (fp32 main parameters and gradients)"},
      {"fp16", Kind::flag, &a.fp16, "fp16 mixed precision with loss scaling"},
      {"grad-reduce-in-bf16", Kind::flag, &a.grad_reduce_in_bf16, "data-parallel gradient reduction in bf16"},
      {"loss-scale", Kind::f64, &a.loss_scale, "constant fp16 loss scale (0: dynamic)"},
      {"initial-loss-scale", Kind::f64, &a.initial_loss_scale, "dynamic loss scale to start from"},
      {"min-loss-scale", Kind::f64, &a.min_loss_scale, "dynamic loss scale floor"},
      {"loss-scale-window", Kind::i64, &a.loss_scale_window, "iterations without overflow before the scale doubles"},
      {"hysteresis", Kind::i64, &a.hysteresis, "overflows tolerated before the scale halves"},
      {"fp8-format", Kind::str, &a.fp8_format, "fp8 linear layers: e4m3 | hybrid (e5m2 gradients)"},
      {"fp8-margin", Kind::i64, &a.fp8_margin, "fp8 scaling margin (powers of 2)"},
      {"fp8-amax-history-len", Kind::i64, &a.fp8_amax_history_len, "fp8 delayed-scaling amax history"},
      {"fp8-amax-compute-algo", Kind::str, &a.fp8_amax_compute_algo, "fp8 amax from the history: most_recent | max"},
      {"first-last-layers-bf16", Kind::flag, &a.first_last_layers_bf16,
       "the first and last decoder layers outside fp8 (the current-scaling recipes; refused with delayed, as Megatron); "
       "nothing without fp8"},
      {"num-layers-at-start-in-bf16", Kind::i64, &a.num_layers_at_start_in_bf16,
       "with --first-last-layers-bf16: how many first layers"},
      {"num-layers-at-end-in-bf16", Kind::i64, &a.num_layers_at_end_in_bf16,
       "with --first-last-layers-bf16: how many last layers"},
      {"fp8-recipe", Kind::str, &a.fp8_recipe,
       "fp8 scaling recipe: delayed (amax history) | tensorwise | blockwise | mxfp8 (current scaling); custom is refused"},
      {"recompute-granularity", Kind::str, &a.recompute_granularity, "activation recomputation: full | selective"},
      {"recompute-activations", Kind::flag, &a.recompute_activations,
       "Megatron's shortcut for --recompute-granularity selective (it overrides that flag)"},
      {"recompute-method", Kind::str, &a.recompute_method, "full recomputation: uniform | block"},
      {"recompute-num-layers", Kind::i64, &a.recompute_num_layers, "layers per recomputed group (uniform) or recomputed layers per chunk (block)"},
      {"recompute-modules", Kind::list, &a.recompute_modules,
       "selective recomputation's modules: core_attn (the default), moe (every MoE layer), mlp (every dense MLP's "
       "fc1 and activation), layernorm (every layer's two norms), moe_act (the experts' activations), shared_experts (the shared experts' outputs)"},
      {"moe-layer-recompute", Kind::flag, &a.moe_layer_recompute, "recompute every MoE layer in backward"},
      {"log-memory", Kind::flag, &a.log_memory, "per-rank memory estimate at start-up and measured peak"},
      {"sequence-parallel", Kind::flag, &a.sequence_parallel,
       "LayerNorm, dropout and residual on token shards of the tensor-parallel group"},
      {"mock-data", Kind::flag, &a.mock_data, "synthetic data instead of --data-path"},
      {"sft", Kind::flag, &a.sft,
       "supervised fine-tuning: --data-path is a JSONL file of {\"messages\": [...]}, loss on the assistant's tokens"},
      {"chat-template", Kind::str, &a.chat_template,
       "--sft's chat template: a Jinja file, a tokenizer_config.json or their folder (default: the tokenizer's folder's)"},
      {"data-path", Kind::list, &a.data_path, "prefix of a .bin/.idx dataset"},
      {"mid-level-dataset-surplus", Kind::f64, &a.mid_level_dataset_surplus,
       "a weighted blend builds each dataset for its share of the samples times 1 + this"},
      {"data-args-path", Kind::str, &a.data_args_path,
       "a text file holding --data-path's words ([w1] p1 [w2 p2 ...]), for blends too long for a command line"},
      {"per-split-data-args-path", Kind::str, &a.per_split_data_args_path,
       "a JSON file {\"train\": ..., \"valid\": ..., \"test\": ...} holding --train/valid/test-data-path's words "
       "(each a list or a string)"},
      {"vocab-size", Kind::i64, &a.vocab_size,
       "vocabulary size when no tokenizer is named; NullTokenizer's ids (its end of document is this id)"},
      {"tokenizer-type", Kind::str, &a.tokenizer_type, "ByteTokenizer"},
      {"vocab-file", Kind::str, &a.vocab_file, "tokenizer vocabulary file"},
      {"merge-file", Kind::str, &a.merge_file, "tokenizer merges file"},
      {"tokenizer-model", Kind::str, &a.tokenizer_model,
       "HuggingFaceTokenizer: tokenizer.json or its folder; the SentencePiece tokenizers: tokenizer.model or its folder"},
      {"vocab-extra-ids", Kind::i64, &a.vocab_extra_ids, "SentencePieceTokenizer: <extra_id_0..N-1> added to the vocabulary"},
      {"tiktoken-pattern", Kind::str, &a.tiktoken_pattern, "TikTokenizer: Megatron's pre-tokenizer pattern v1 or v2"},
      {"tiktoken-num-special-tokens", Kind::i64, &a.tiktoken_num_special_tokens,
       "TikTokenizer: ids before the vocabulary's ranks (0: 1000)"},
      {"tiktoken-special-tokens", Kind::list, &a.tiktoken_special_tokens,
       "TikTokenizer: the first special tokens (default <unk> <s> </s>)"},
      {"split", Kind::str, &a.split, "train,valid,test proportions of --data-path"},
      {"data-cache-path", Kind::str, &a.data_cache_path, "where dataset index files are cached"},
      {"train-data-path", Kind::list, &a.train_data_path, "training data ([w1] p1 [w2 p2 ...])"},
      {"valid-data-path", Kind::list, &a.valid_data_path, "validation data ([w1] p1 ...)"},
      {"multiple-validation-sets", Kind::flag, &a.multiple_validation_sets,
       "evaluate each --valid-data-path dataset (given without weights) on its own: a validation loss per set"},
      {"full-validation", Kind::flag, &a.full_validation,
       "each validation evaluation reads the whole validation split (one epoch, every sample once) instead of "
       "--eval-iters batches; --eval-iters then sizes the test evaluation only"},
      {"test-data-path", Kind::list, &a.test_data_path, "test data ([w1] p1 ...)"},
      {"eval-interval", Kind::i64, &a.eval_interval, "iterations between validation evaluations"},
      {"eval-iters", Kind::i64, &a.eval_iters, "batches per evaluation"},
      {"eod-mask-loss", Kind::flag, &a.eod_mask_loss, "no loss on end-of-document tokens"},
      {"calculate-per-token-loss", Kind::flag, &a.calculate_per_token_loss,
       "loss and gradient: the global batch's token losses summed and divided by its token count"},
      {"reset-position-ids", Kind::flag, &a.reset_position_ids, "positions restart after each EOD"},
      {"reset-attention-mask", Kind::flag, &a.reset_attention_mask,
       "attention does not cross document boundaries"},
      {"lr-decay-style", Kind::str, &a.lr_decay_style,
       "constant, linear, cosine, inverse-square-root or WSD"},
      {"lr-decay-iters", Kind::i64, &a.lr_decay_iters, "iterations to decay over (0: --train-iters)"},
      {"lr-decay-samples", Kind::i64, &a.lr_decay_samples, "samples to decay over"},
      {"lr-warmup-iters", Kind::i64, &a.lr_warmup_iters, "linear warmup iterations"},
      {"lr-warmup-samples", Kind::i64, &a.lr_warmup_samples, "linear warmup samples"},
      {"lr-warmup-fraction", Kind::f64, &a.lr_warmup_fraction, "warmup as a fraction of the decay"},
      {"lr-warmup-init", Kind::f64, &a.lr_warmup_init, "learning rate at the start of warmup"},
      {"lr-wsd-decay-style", Kind::str, &a.lr_wsd_decay_style,
       "WSD decay: exponential, linear, cosine or minus_sqrt"},
      {"lr-wsd-decay-iters", Kind::i64, &a.lr_wsd_decay_iters, "WSD decay iterations"},
      {"lr-wsd-decay-samples", Kind::i64, &a.lr_wsd_decay_samples, "WSD decay samples"},
      {"train-samples", Kind::i64, &a.train_samples, "samples to train (instead of --train-iters)"},
      {"rampup-batch-size", Kind::list, &a.rampup_batch_size,
       "START INCREMENT SAMPLES: the global batch grows from START by INCREMENT over SAMPLES samples "
       "(with --train-samples)"},
      {"start-weight-decay", Kind::opt_f64, &a.start_weight_decay, "weight decay at the start"},
      {"end-weight-decay", Kind::opt_f64, &a.end_weight_decay, "weight decay at the end"},
      {"weight-decay-incr-style", Kind::str, &a.weight_decay_incr_style,
       "constant, linear or cosine"},
      {"decoupled-lr", Kind::opt_f64, &a.decoupled_lr, "learning rate of embedding and output layer"},
      {"decoupled-min-lr", Kind::opt_f64, &a.decoupled_min_lr, "their minimum learning rate"},
      {"save", Kind::str, &a.save, "directory to save checkpoints in"},
      {"save-interval", Kind::i64, &a.save_interval, "iterations between checkpoints (0: at the end)"},
      {"log-progress", Kind::flag, &a.log_progress,
       "append job starts and each checkpoint's throughputs, FLOPs and tokens to --save/progress.txt"},
      {"non-persistent-save-interval", Kind::i64, &a.non_persistent_save_interval,
       "iterations between non-persistent checkpoints (only the latest kept; resumed from when newer)"},
      {"non-persistent-ckpt-type", Kind::str, &a.non_persistent_ckpt_type,
       "global (lattice's one kind: a checkpoint directory of its own)"},
      {"non-persistent-global-ckpt-dir", Kind::str, &a.non_persistent_global_ckpt_dir,
       "where non-persistent checkpoints go (default: --save/non_persistent; read from --load/non_persistent)"},
      {"load", Kind::str, &a.load, "checkpoint directory to resume from"},
      {"use-checkpoint-args", Kind::flag, &a.use_checkpoint_args,
       "model and tokenizer flags not given here are the --load checkpoint's"},
      {"no-save-optim", Kind::flag, &a.no_save_optim, "do not save the optimizer state"},
      {"no-save-rng", Kind::flag, &a.no_save_rng, "do not save the RNG state"},
      {"no-load-optim", Kind::flag, &a.no_load_optim, "do not load the optimizer state"},
      {"no-load-rng", Kind::flag, &a.no_load_rng, "do not load the RNG state"},
      {"finetune", Kind::flag, &a.finetune, "load weights only; iteration restarts at 0"},
      {"ckpt-step", Kind::i64, &a.ckpt_step,
       "load this iteration's checkpoint instead of the latest (of --load, or --pretrained-checkpoint)"},
      {"pretrained-checkpoint", Kind::str, &a.pretrained_checkpoint,
       "when --load holds no checkpoint: fine-tune from this one (its weights only, as --finetune)"},
      {"skip-train", Kind::flag, &a.skip_train,
       "no training: evaluate the --load checkpoint on the validation and test splits, save nothing"},
      {"override-opt_param-scheduler", Kind::flag, &a.override_opt_param_scheduler,
       "take the schedule from the flags, not the checkpoint"},
      {"use-checkpoint-opt_param-scheduler", Kind::flag, &a.use_checkpoint_opt_param_scheduler,
       "take the schedule from the checkpoint"},
      {"keep-last-n", Kind::i64, &a.keep_last_n, "keep only the newest N checkpoints (0: all)"},
      {"save-retain-interval", Kind::i64, &a.save_retain_interval,
       "Megatron's: each save removes the checkpoint before it unless its iteration is a multiple of this "
       "(a multiple of --save-interval; 0: keep all)"},
      {"exit-signal-handler", Kind::flag, &a.exit_signal_handler,
       "on SIGTERM/SIGINT save a checkpoint and exit"},
      {"exit-interval", Kind::i64, &a.exit_interval, "exit after an iteration divisible by this"},
      {"exit-duration-in-mins", Kind::f64, &a.exit_duration_in_mins, "exit after this many minutes"},
      {"distributed-timeout-minutes", Kind::f64, &a.distributed_timeout_minutes,
       "a rank waiting longer than this ends the job"},
      {"use-distributed-optimizer", Kind::flag, &a.use_distributed_optimizer,
       "shard optimizer state over data-parallel ranks (ZeRO-1)"},
      {"use-tp-pp-dp-mapping", Kind::flag, &a.use_tp_pp_dp_mapping,
       "Megatron's other rank order: tp, then pp, then dp (a rank's pipeline stages are neighbours; "
       "no context or expert parallelism)"},
      {"num-distributed-optimizer-instances", Kind::i64, &a.num_distributed_optimizer_instances,
       "copies of the distributed optimizer over the data-parallel ranks: each shards over dp / N of them"},
      {"overlap-grad-reduce", Kind::flag, &a.overlap_grad_reduce,
       "overlap gradient reduction with backward"},
      {"overlap-param-gather", Kind::flag, &a.overlap_param_gather,
       "overlap the parameter all-gather with the next forward"},
      {"ddp-bucket-size", Kind::i64, &a.ddp_bucket_size, "elements per gradient bucket (0: automatic)"},
      {"ddp-num-buckets", Kind::i64, &a.ddp_num_buckets,
       "gradient buckets of (this rank's parameters) / this elements each, instead of --ddp-bucket-size"},
      {"ddp-pad-buckets-for-high-nccl-busbw", Kind::flag, &a.implementation.ddp_pad_buckets_for_high_nccl_busbw,
       "accepted (padding the buckets changes no sum)"},
      {"zero-stage", Kind::i64, &a.zero_stage,
       "1: shard the optimizer state (2, the gradients too, is not implemented)"},
      {"log-comm", Kind::flag, &a.log_comm, "report communication bytes and time per step"},
      {"metrics-file", Kind::str, &a.metrics_file, "write one JSON object per logged iteration"},
      {"tensorboard-dir", Kind::str, &a.tensorboard_dir, "write TensorBoard event files (Megatron's scalars) here"},
      {"tensorboard-log-interval", Kind::i64, &a.tensorboard_log_interval,
       "iterations between TensorBoard scalars"},
      {"tensorboard-queue-size", Kind::i64, &a.tensorboard_queue_size,
       "TensorBoard events held before a write (accepted; lattice writes at every log point)"},
      {"log-validation-ppl-to-tensorboard", Kind::flag, &a.log_validation_ppl_to_tensorboard,
       "also the validation perplexity"},
      {"log-timers-to-tensorboard", Kind::flag, &a.log_timers_to_tensorboard,
       "also the iteration time (seconds) at every --log-interval"},
      {"no-log-loss-scale-to-tensorboard", Kind::flag, &a.no_log_loss_scale_to_tensorboard,
       "leave the loss scale out"},
      {"log-world-size-to-tensorboard", Kind::flag, &a.log_world_size_to_tensorboard, "also the world size"},
      {"log-memory-to-tensorboard", Kind::flag, &a.log_memory_to_tensorboard,
       "also rank 0's memory: mem-reserved-bytes (resident, or in use on its GPU), mem-allocated-bytes, "
       "mem-max-allocated-bytes and mem-allocated-count (lattice's buffers)"},
      {"peak-tflops", Kind::f64, &a.peak_tflops,
       "peak TFLOP/s for MFU (0: measured by a GEMM calibration)"},
      {"device", Kind::str, &a.device, "where tensors live and kernels run: cpu or cuda (one GPU per process)"},
      {"num-threads", Kind::i64, &a.num_threads, "threads for kernels and GEMM (0: OMP_NUM_THREADS, else all cores)"},
      {"log-throughput", Kind::flag, &a.log_throughput, "accepted for Megatron compatibility"},
      {"log-params-norm", Kind::flag, &a.log_params_norm, "the parameters' L2 norm in the log line and TensorBoard"},
      {"check-weight-hash-across-dp-replicas-interval", Kind::i64, &a.check_weight_hash_across_dp_replicas_interval,
       "every N iterations compare the parameters' hashes across data-parallel replicas; a difference stops "
       "training with an error naming the parameter and ranks (0: never)"},
      {"no-check-for-nan-in-loss-and-grad", Kind::flag, &a.no_check_for_nan_in_loss_and_grad,
       "train on when a step's loss or gradient norm is nan or infinite (by default such a step stops training "
       "before its update)"},
      {"check-for-spiky-loss", Kind::flag, &a.check_for_spiky_loss,
       "stop before the update of a step with a micro-batch whose loss (the sum of its token losses) is 10 or more "
       "times the largest of the first 100 micro-batches'"},
      {"check-for-large-grads", Kind::flag, &a.check_for_large_grads,
       "stop before the update of a step whose gradient norm is 10 or more times the largest of the first 100 steps'"},
      {"result-rejected-tracker-filename", Kind::str, &a.result_rejected_tracker_filename,
       "append each rejected result (nan/inf, spiky loss, large grads) to this file; an iteration it shows rejected "
       "twice is skipped by the next run"},
      {"iterations-to-skip", Kind::list, &a.iterations_to_skip,
       "0-based step indices (the iteration logged as N is N - 1) whose global batch is consumed without a step"},
      {"error-injection-rate", Kind::i64, &a.error_injection_rate,
       "accepted: Megatron injects errors only into result-validation reruns (--rerun-mode validate_results)"},
      {"error-injection-type", Kind::str, &a.error_injection_type,
       "correct_result, transient_error or persistent_error: accepted (see --error-injection-rate)"},
      {"log-num-zeros-in-grad", Kind::flag, &a.log_num_zeros_in_grad,
       "the number of zero gradients in the log line and TensorBoard"},
      // Implementation choices of Megatron's (TrainArgs::MegatronImplementationFlags): no-ops.
      {"use-mcore-models", Kind::flag, &a.implementation.use_mcore_models, "accepted: lattice has one model implementation"},
      {"transformer-impl", Kind::str, &a.implementation.transformer_impl,
       "local or transformer_engine: accepted, lattice's layers are its own"},
      {"use-flash-attn", Kind::flag, &a.implementation.use_flash_attn, "accepted: lattice's attention is a flash attention"},
      {"attention-softmax-in-fp32", Kind::flag, &a.implementation.attention_softmax_in_fp32,
       "accepted: lattice's attention softmax is always fp32"},
      {"no-masked-softmax-fusion", Kind::flag, &a.implementation.no_masked_softmax_fusion, "accepted (fusion choices change no math)"},
      {"no-bias-gelu-fusion", Kind::flag, &a.implementation.no_bias_gelu_fusion, "accepted (fusion choices change no math)"},
      {"no-bias-dropout-fusion", Kind::flag, &a.implementation.no_bias_dropout_fusion, "accepted (fusion choices change no math)"},
      {"no-bias-swiglu-fusion", Kind::flag, &a.implementation.no_bias_swiglu_fusion, "accepted (fusion choices change no math)"},
      {"no-rope-fusion", Kind::flag, &a.implementation.no_rope_fusion, "accepted (fusion choices change no math)"},
      {"no-gradient-accumulation-fusion", Kind::flag, &a.implementation.no_gradient_accumulation_fusion,
       "accepted (fusion choices change no math)"},
      {"no-async-tensor-model-parallel-allreduce", Kind::flag, &a.implementation.no_async_tensor_model_parallel_allreduce,
       "accepted (a scheduling choice)"},
      {"overlap-p2p-communication", Kind::flag, &a.implementation.overlap_p2p_communication,
       "accepted: pipeline activations are always sent asynchronously"},
      {"manual-gc", Kind::flag, &a.implementation.manual_gc, "accepted: no garbage collector"},
      {"manual-gc-interval", Kind::i64, &a.implementation.manual_gc_interval, "accepted: no garbage collector"},
      {"no-manual-gc-eval", Kind::flag, &a.implementation.no_manual_gc_eval, "accepted: no garbage collector"},
      {"local-rank", Kind::i64, &a.implementation.local_rank,
       "accepted from torch launchers: each process's GPU is its node-local MPI rank's"},
      {"use-dist-ckpt", Kind::flag, &a.implementation.use_dist_ckpt,
       "accepted: deprecated in Megatron and without effect (--ckpt-format chooses)"},
      {"dist-ckpt-format", Kind::str, &a.implementation.dist_ckpt_format,
       "accepted: deprecated in Megatron and without effect (--ckpt-format chooses)"},
      {"fp8-interval", Kind::i64, &a.implementation.fp8_interval, "accepted: deprecated in Megatron and ignored"},
      {"no-initialization", Kind::flag, &a.implementation.no_initialization,
       "accepted: the weights are drawn anyway (fast), and --load overwrites them"},
      {"fp32-residual-connection", Kind::flag, &a.implementation.fp32_residual_connection,
       "accepted: lattice's residual stream is fp32 in every precision"},
      {"disable-bf16-reduced-precision-matmul", Kind::flag, &a.implementation.disable_bf16_reduced_precision_matmul,
       "accepted: lattice's bf16 GEMMs always accumulate in fp32"},
      {"no-clone-scatter-output-in-embedding", Kind::flag, &a.implementation.no_clone_scatter_output_in_embedding,
       "accepted (a PyTorch memory detail)"},
      {"disable-gloo-process-groups", Kind::flag, &a.implementation.disable_gloo_process_groups,
       "accepted: lattice's groups are MPI's (and NCCL's on GPUs)"},
      {"train-sync-interval", Kind::i64, &a.implementation.train_sync_interval,
       "accepted: each step waits for its results"},
      {"cross-entropy-fusion-impl", Kind::str, &a.implementation.cross_entropy_fusion_impl,
       "native or te: accepted (lattice's cross entropy is its own fused kernel)"},
      {"no-overlap-p2p-communication", Kind::flag, &a.implementation.no_overlap_p2p_communication,
       "accepted: pipeline sends are asynchronous either way (the same values)"},
      {"overlap-p2p-communication-warmup-flush", Kind::flag, &a.implementation.overlap_p2p_communication_warmup_flush,
       "accepted (a scheduling choice)"},
      {"no-scatter-gather-tensors-in-pipeline", Kind::flag, &a.implementation.no_scatter_gather_tensors_in_pipeline,
       "accepted: each stage sends its whole activations"},
      {"defer-embedding-wgrad-compute", Kind::flag, &a.implementation.defer_embedding_wgrad_compute,
       "accepted: the output layer's weight gradient is the same sum whenever it is computed"},
      {"wgrad-deferral-limit", Kind::i64, &a.implementation.wgrad_deferral_limit, "accepted (see above)"},
      {"no-gradient-reduce-div-fusion", Kind::flag, &a.implementation.no_gradient_reduce_div_fusion,
       "accepted (fusion choices change no math)"},
      {"timing-log-option", Kind::str, &a.implementation.timing_log_option,
       "max, minmax or all: accepted (lattice has no Megatron timers)"},
      {"no-barrier-with-level-1-timing", Kind::flag, &a.implementation.no_barrier_with_level_1_timing,
       "accepted (see above)"},
      {"logging-level", Kind::i64, &a.implementation.logging_level, "accepted: lattice logs every line it has"},
      {"use-te-activation-func", Kind::flag, &a.implementation.use_te_activation_func,
       "accepted: lattice's activation kernels are its own"},
      {"disable-tp-comm-bulk-dgrad", Kind::flag, &a.implementation.disable_tp_comm_bulk_dgrad,
       "accepted: Transformer Engine's userbuffer overlaps (the same sums)"},
      {"disable-tp-comm-bulk-wgrad", Kind::flag, &a.implementation.disable_tp_comm_bulk_wgrad, "accepted (see above)"},
      {"disable-tp-comm-overlap-ag", Kind::flag, &a.implementation.disable_tp_comm_overlap_ag, "accepted (see above)"},
      {"disable-tp-comm-overlap-rs", Kind::flag, &a.implementation.disable_tp_comm_overlap_rs, "accepted (see above)"},
      {"disable-tp-comm-split-ag", Kind::flag, &a.implementation.disable_tp_comm_split_ag, "accepted (see above)"},
      {"disable-tp-comm-split-rs", Kind::flag, &a.implementation.disable_tp_comm_split_rs, "accepted (see above)"},
      {"tp-comm-overlap-rs-dgrad", Kind::flag, &a.implementation.tp_comm_overlap_rs_dgrad, "accepted (see above)"},
      {"tp-comm-bootstrap-backend", Kind::str, &a.implementation.tp_comm_bootstrap_backend,
       "nccl, mpi or gloo: accepted (see above)"},
      {"dist-ckpt-strictness", Kind::str, &a.implementation.dist_ckpt_strictness,
       "accepted: lattice's load checks every tensor of the model and refuses a missing or mismatched one, whatever "
       "this says (assume_ok_unexpected, log_unexpected, log_all, raise_unexpected, raise_all, return_unexpected, "
       "return_all, ignore_all)"},
      {"legacy-tokenizer", Kind::flag, &a.implementation.legacy_tokenizer,
       "accepted: lattice's tokenizers are Megatron's legacy ones"},
      {"trust-remote-code", Kind::flag, &a.implementation.trust_remote_code,
       "accepted: lattice reads tokenizer files and runs no code from them"},
      {"distribute-saved-activations", Kind::flag, &a.implementation.distribute_saved_activations,
       "accepted with --recompute-granularity full, a --recompute-method and tensor parallelism (Megatron's "
       "conditions): where the recomputation's inputs are kept, the same values"},
      {"hierarchical-context-parallel-sizes", Kind::list, &a.implementation.hierarchical_context_parallel_sizes,
       "with --cp-comm-type a2a+p2p (which needs it): the context-parallel sizes of its levels, whose product is "
       "--context-parallel-size (the same attention)"},
      {"no-fp8-wgrad", Kind::flag, &a.no_fp8_wgrad,
       "with --fp8-format: the weight gradients' GEMMs read unquantized (fp32) output gradients and inputs"},
      {"moe-use-upcycling", Kind::flag, &a.moe_use_upcycling,
       "the --num-experts model's weights from --load's dense checkpoint (every expert the dense MLP, or a piece of "
       "it), saved to --save (which must hold none) before training starts at iteration 0"},
      {"moe-upcycling-granularity", Kind::i64, &a.moe_upcycling_granularity,
       "with --moe-use-upcycling: the dense MLP's pieces per expert group, --ffn-hidden-size / --moe-ffn-hidden-size"},
      {"use-mp-args-from-checkpoint-args", Kind::flag, &a.use_mp_args_from_checkpoint_args,
       "with --use-checkpoint-args: the tensor- and pipeline-parallel sizes (and virtual stages) the checkpoint was "
       "saved with, unless given"},
      {"no-use-tokenizer-model-from-checkpoint-args", Kind::flag, &a.no_use_tokenizer_model_from_checkpoint_args,
       "with --use-checkpoint-args: leave --tokenizer-model to the command line"},
      {"data-parallel-random-init", Kind::flag, &a.implementation.data_parallel_random_init,
       "accepted: Megatron then broadcasts data-parallel rank 0's parameters, the ones lattice draws on every rank"},
      {"no-align-grad-reduce", Kind::flag, &a.implementation.no_align_grad_reduce,
       "accepted (when the pipeline stages launch their gradient reductions: the same sums)"},
      {"no-align-param-gather", Kind::flag, &a.implementation.no_align_param_gather,
       "accepted (when the pipeline stages launch their parameter gathers: the same values)"},
      {"te-rng-tracker", Kind::flag, &a.implementation.te_rng_tracker,
       "accepted: lattice's random draws are its own Philox streams (docs/megatron-differences.md)"},
      {"inference-rng-tracker", Kind::flag, &a.implementation.inference_rng_tracker,
       "accepted: lattice's random draws are its own Philox streams"},
      {"enable-cuda-graph", Kind::flag, &a.implementation.enable_cuda_graph,
       "accepted: lattice launches its kernels without CUDA graphs (the same math)"},
      {"external-cuda-graph", Kind::flag, &a.implementation.external_cuda_graph,
       "accepted: lattice launches its kernels without CUDA graphs (the same math)"},
      {"cuda-graph-scope", Kind::list, &a.implementation.cuda_graph_scope, "accepted with --enable-cuda-graph"},
      {"ddp-average-in-collective", Kind::flag, &a.implementation.ddp_average_in_collective,
       "accepted: the same average (lattice scales each micro-batch's loss gradient by 1 / (micro-batches x DP))"},
      {"distributed-backend", Kind::str, &a.implementation.distributed_backend,
       "nccl or gloo: accepted; lattice uses NCCL for GPU tensors and MPI for CPU ones"},
      {"num-workers", Kind::i64, &a.implementation.num_workers, "accepted: samples are read in-process from mmap"},
      {"dataloader-type", Kind::str, &a.implementation.dataloader_type,
       "single: the samples in the dataset's (shuffled) order, Megatron's default; cyclic and external are not "
       "implemented"},
      {"timing-log-level", Kind::i64, &a.implementation.timing_log_level,
       "0, 1 or 2: accepted; --log-timers-to-tensorboard and --profile-ops give lattice's timings"},
      {"accumulate-allreduce-grads-in-fp32", Kind::flag, &a.implementation.accumulate_allreduce_grads_in_fp32,
       "accepted: gradients are fp32 and reduced in fp32 (unless --grad-reduce-in-bf16)"},
      {"cross-entropy-loss-fusion", Kind::flag, &a.implementation.cross_entropy_loss_fusion,
       "accepted: the cross entropy is always one fused kernel"},
      {"no-persist-layer-norm", Kind::flag, &a.implementation.no_persist_layer_norm, "accepted (fusion choices change no math)"},
      {"use-cpu-initialization", Kind::flag, &a.implementation.use_cpu_initialization,
       "accepted: initial values do not depend on where they are made"},
      {"no-create-attention-mask-in-dataloader", Kind::flag, &a.implementation.no_create_attention_mask_in_dataloader,
       "accepted: the attention is causal by construction (no mask tensor)"},
      {"mmap-bin-files", Kind::flag, &a.implementation.mmap_bin_files, "accepted: .bin files are read through mmap"},
      {"no-mmap-bin-files", Kind::flag, &a.implementation.no_mmap_bin_files, "accepted: the same samples either way"},
      {"num-dataset-builder-threads", Kind::i64, &a.implementation.num_dataset_builder_threads,
       "accepted: the dataset indices are built in-process"},
      {"deterministic-mode", Kind::flag, &a.implementation.deterministic_mode,
       "accepted: lattice's runs are always deterministic"},
      {"apply-query-key-layer-scaling", Kind::flag, &a.implementation.apply_query_key_layer_scaling,
       "accepted: it guards fp16 attention scores, which lattice computes in fp32"},
      {"no-query-key-layer-scaling", Kind::flag, &a.implementation.no_query_key_layer_scaling, "accepted (see above)"},
      {"empty-unused-memory-level", Kind::i64, &a.implementation.empty_unused_memory_level,
       "0, 1 or 2: accepted (lattice's activation memory is one arena)"},
      {"async-save", Kind::flag, &a.implementation.async_save, "accepted: checkpoints are written as they are saved"},
      {"ckpt-format", Kind::str, &a.implementation.ckpt_format,
       "torch_dist: accepted, lattice's one checkpoint format is layout-independent as torch_dist is (others refused)"},
      {"ckpt-fully-parallel-save", Kind::flag, &a.implementation.ckpt_fully_parallel_save,
       "accepted: how torch_dist spreads its writes over ranks (lattice's writer is its own)"},
      {"no-ckpt-fully-parallel-save", Kind::flag, &a.implementation.no_ckpt_fully_parallel_save, "accepted (see above)"},
      {"ckpt-fully-parallel-load", Kind::flag, &a.implementation.ckpt_fully_parallel_load,
       "accepted: how torch_dist spreads its reads over ranks"},
      {"rerun-mode", Kind::str, &a.implementation.rerun_mode,
       "disabled: accepted (Megatron's result-validation reruns, validate_results and report_stats, are refused)"},
      {"ckpt-assume-constant-structure", Kind::flag, &a.implementation.ckpt_assume_constant_structure,
       "accepted: a torch_dist save-time cache (lattice's checkpoints need none)"},
      {"moe-grouped-gemm", Kind::flag, &a.implementation.moe_grouped_gemm,
       "accepted: one GEMM pair per expert, the same math as grouped GEMMs"},
      {"moe-permute-fusion", Kind::flag, &a.implementation.moe_permute_fusion, "accepted (fusion choices change no math)"},
      {"tp-comm-overlap", Kind::flag, &a.implementation.tp_comm_overlap,
       "accepted with --sequence-parallel: the tensor-parallel gathers and reductions give the same sums overlapped or not"},
      {"moe-router-fusion", Kind::flag, &a.implementation.moe_router_fusion,
       "accepted: the router's top-k, softmax and loss statistics are the same math fused or not"},
      {"moe-use-legacy-grouped-gemm", Kind::flag, &a.implementation.moe_use_legacy_grouped_gemm,
       "accepted: one GEMM pair per expert (see --moe-grouped-gemm)"},
      {"overlap-moe-expert-parallel-comm", Kind::flag, &a.implementation.overlap_moe_expert_parallel_comm,
       "accepted: the experts' all-to-all gives the same rows overlapped with compute or not"},
      {"delay-wgrad-compute", Kind::flag, &a.implementation.delay_wgrad_compute,
       "accepted: the weight gradients are the same sums whenever they are computed"},
      {"moe-shared-expert-overlap", Kind::flag, &a.implementation.moe_shared_expert_overlap,
       "accepted: the shared experts' output is the same whether or not it overlaps the dispatch"},
      {"moe-token-dispatcher-type", Kind::str, &a.implementation.moe_token_dispatcher_type,
       "accepted: alltoall | allgather (the same math; lattice dispatches by all-to-all under expert parallelism)"},
      {"expert-tensor-parallel-size", Kind::i64, &a.implementation.expert_tensor_parallel_size,
       "the experts' tensor-parallel size: --tensor-model-parallel-size's (the default), or 1 (every expert whole, "
       "the tensor-parallel ranks in the expert-parallel groups; needs --sequence-parallel)"},
      {"rope-type", Kind::str, &a.rope_type,
       "Megatron's multi-latent attention spelling of --position-embedding-type: rope or yarn"},
      {"rotary-scaling-factor", Kind::opt_f64, &a.rotary_scaling_factor, "Megatron's MLA spelling of --yarn-rotary-scaling-factor"},
      {"mscale", Kind::opt_f64, &a.mscale, "Megatron's MLA spelling of --yarn-mscale"},
      {"mscale-all-dim", Kind::opt_f64, &a.mscale_all_dim, "Megatron's MLA spelling of --yarn-mscale-all-dim"},
      {"use-rotary-position-embeddings", Kind::flag, &a.use_rotary_position_embeddings,
       "Megatron's older spelling of --position-embedding-type rope"},
      {"no-position-embedding", Kind::flag, &a.no_position_embedding,
       "no learned position table (only with rope, which has none)"},
      {"exit-on-missing-checkpoint", Kind::flag, &a.exit_on_missing_checkpoint,
       "with --load: fail when it holds no checkpoint instead of training from scratch"},
      {"attention-backend", Kind::str, &a.attention_backend,
       "flash, fused, unfused, local or auto: accepted for Megatron compatibility (lattice's own flash attention)"},
      {"profile-ops", Kind::flag, &a.profile_ops,
       "time every kernel after the first iteration; a table of calls and ms per iteration at the end"},
      {"profile", Kind::flag, &a.profile,
       "Megatron's profiling window: the --profile-ops table of iterations --profile-step-start + 1 to "
       "--profile-step-end, logged by each rank of --profile-ranks"},
      {"profile-step-start", Kind::i64, &a.profile_step_start,
       "with --profile: profile from the step after this many iterations"},
      {"profile-step-end", Kind::i64, &a.profile_step_end, "with --profile: stop profiling after this iteration"},
      {"profile-ranks", Kind::list, &a.profile_ranks, "with --profile: the global ranks that profile and log a table"},
      {"use-pytorch-profiler", Kind::flag, &a.use_pytorch_profiler,
       "refused: lattice has no PyTorch profiler (--profile gives its op table)"},
  };
}

std::string default_text(const Flag& f) {
  std::ostringstream os;
  switch (f.kind) {
    case Kind::i64: os << *static_cast<int64_t*>(f.target); break;
    case Kind::u64: os << *static_cast<uint64_t*>(f.target); break;
    case Kind::f32: os << *static_cast<float*>(f.target); break;
    case Kind::f64: os << *static_cast<double*>(f.target); break;
    case Kind::str: {
      auto& s = *static_cast<std::string*>(f.target);
      os << (s.empty() ? "none" : s);
      break;
    }
    case Kind::opt_f64: {
      auto& v = *static_cast<std::optional<double>*>(f.target);
      if (v) os << *v;
      else os << "none";
      break;
    }
    case Kind::flag: os << "off"; break;
    case Kind::list: {
      auto& v = *static_cast<std::vector<std::string>*>(f.target);
      if (v.empty()) os << "none";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
      break;
    }
    case Kind::f32_list: {
      auto& v = *static_cast<std::vector<float>*>(f.target);
      for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
      break;
    }
  }
  return os.str();
}

template <typename T>
T parse_number(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  T out{};
  if constexpr (std::is_same_v<T, int64_t>) {
    out = std::strtoll(v.c_str(), &end, 10);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!v.empty() && v[0] == '-') end = const_cast<char*>(v.c_str());
    else out = std::strtoull(v.c_str(), &end, 10);
  } else {
    out = T(std::strtod(v.c_str(), &end));
  }
  if (v.empty() || errno != 0 || end == nullptr || *end != '\0')
    LATTICE_FAIL() << "--" << flag << ": invalid value '" << v << "'";
  return out;
}

// Megatron's other spellings of a flag, and the flag lattice reads them as.
const std::map<std::string, std::string>& flag_aliases() {
  static const std::map<std::string, std::string> aliases = {
      {"override-opt-param-scheduler", "override-opt_param-scheduler"},
      {"use-checkpoint-opt-param-scheduler", "use-checkpoint-opt_param-scheduler"},
      {"persistent-save-interval", "save-interval"},
      {"encoder-seq-length", "seq-length"},   // Megatron's GPT sets either from the other
      {"encoder-num-layers", "num-layers"}};
  return aliases;
}

// Megatron's removed flags: its error for each.
const char* removed_flag_error(const std::string& name) {
  static const std::map<std::string, const char*> removed = {
      {"batch-size", "--batch-size argument is no longer valid, use --micro-batch-size instead"},
      {"warmup", "--warmup argument is no longer valid, use --lr-warmup-fraction instead"},
      {"model-parallel-size", "--model-parallel-size is no longer valid, use --tensor-model-parallel-size instead"},
      {"checkpoint-activations",
       "--checkpoint-activations is no longer valid, use --recompute-activations, or, for more control, "
       "--recompute-granularity and --recompute-method"}};
  const auto it = removed.find(name);
  return it == removed.end() ? nullptr : it->second;
}

// Megatron flags lattice does not take (docs/megatron-differences.md, "Megatron flags lattice does not
// take"), by name prefix: what they are for, so the refusal says more than "unknown".
const char* megatron_flag_not_taken(const std::string& name) {
  static const std::pair<const char*, const char*> kinds[] = {
      {"sft-tokenizer-prompt-format",
       "lattice's --sft tokenizes conversations with the tokenizer's chat template (--chat-template PATH), not "
       "Megatron's prompt formats"},
      {"wandb-", "Weights & Biases logging is not part of lattice (TensorBoard events: --tensorboard-dir)"},
      {"one-logger-", "one-logger tracking is not part of lattice"},
      {"no-one-logger", "one-logger tracking is not part of lattice"},
      {"app-tag-run-", "one-logger tracking is not part of lattice"},
      {"inprocess-", "Megatron's in-process restart is not part of lattice (a job restarts from its checkpoint)"},
      {"straggler-", "Megatron's straggler detector is not part of lattice"},
      {"log-straggler", "Megatron's straggler detector is not part of lattice"},
      {"disable-straggler-on-startup", "Megatron's straggler detector is not part of lattice"},
      {"retro-", "Retro models are not implemented"},
      {"grpo-", "RL training (GRPO) is not implemented"},
      {"rl-", "RL training is not implemented"},
      {"langrl-", "RL training is not implemented"},
      {"perform-rl-step", "RL training is not implemented"},
      {"dino-", "vision models are not implemented"},
      {"vision-", "vision models are not implemented"},
      {"ict-", "the biencoder and ICT models are not implemented"},
      {"biencoder-", "the biencoder and ICT models are not implemented"},
      {"inference-", "Megatron's inference server is not part of lattice train (lattice generate has its own flags)"},
      {"fp4-", "fp4 is not implemented (lattice's low precisions: --bf16, --fp16, --fp8-format)"},
      {"use-megatron-fsdp", "FSDP parameter sharding is not implemented (--use-distributed-optimizer shards the "
                            "optimizer state and gradients)"},
      {"use-torch-fsdp2", "FSDP parameter sharding is not implemented (--use-distributed-optimizer shards the "
                          "optimizer state and gradients)"},
      {"data-parallel-sharding-strategy", "FSDP parameter sharding is not implemented (--use-distributed-optimizer "
                                          "shards the optimizer state and gradients)"},
      {"fsdp-", "FSDP parameter sharding is not implemented"},
      {"optimizer-cpu-offload", "optimizer offloading is not implemented"},
      {"cpu-offloading-", "activation offloading is not implemented"},
      {"ckpt-convert-", "lattice train does not convert checkpoints: lattice convert --from-megatron DIR reads "
                        "Megatron's torch and torch_dist checkpoints, --to-megatron writes its torch format"},
  };
  for (const auto& [prefix, reason] : kinds)
    if (name.rfind(prefix, 0) == 0) return reason;
  return nullptr;
}

// A string flag's value among its choices, or an error listing them.
void check_one_of(const char* flag, const std::string& v, std::initializer_list<const char*> choices) {
  std::string list;
  for (const char* c : choices) {
    if (v == c) return;
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  LATTICE_FAIL() << "--" << flag << " must be one of " << list << ", got '" << v << "'";
}

bool is_flag_token(const std::string& s) {
  // "-1" or "-1e-3" is a value, "--x" is a flag.
  return s.size() > 2 && s[0] == '-' && s[1] == '-';
}

// Flags that are parsed but whose feature has not landed yet: using one is an error,
// never a silent no-op. A line goes away when its feature lands.
void reject_unimplemented(const TrainArgs& a) {
  const TrainArgs d;
  auto reject = [](bool used, const char* flag) {
    if (used) LATTICE_FAIL() << "--" << flag << " is not implemented yet";
  };
  reject(a.zero_stage != d.zero_stage, "zero-stage");
}

// --bf16 / --fp16 / --fp8-format and the loss-scale flags.
void validate_precision(const TrainArgs& a) {
  const TrainArgs d;
  if (a.bf16 && a.fp16) LATTICE_FAIL() << "--bf16 and --fp16 are exclusive";
  if (a.grad_reduce_in_bf16 && !a.bf16) LATTICE_FAIL() << "--grad-reduce-in-bf16 needs --bf16";
  if (!a.fp16 && (a.loss_scale != d.loss_scale || a.initial_loss_scale != d.initial_loss_scale ||
                  a.min_loss_scale != d.min_loss_scale || a.loss_scale_window != d.loss_scale_window ||
                  a.hysteresis != d.hysteresis))
    LATTICE_FAIL() << "--loss-scale, --initial-loss-scale, --min-loss-scale, --loss-scale-window and --hysteresis "
                      "need --fp16";
  if (a.loss_scale < 0) LATTICE_FAIL() << "--loss-scale must be >= 0 (0: dynamic), got " << a.loss_scale;
  if (!a.fp8_format.empty() && a.fp8_format != "e4m3" && a.fp8_format != "hybrid")
    LATTICE_FAIL() << "--fp8-format must be e4m3 or hybrid, got '" << a.fp8_format << "'";
  if (a.fp8_format.empty() && (a.fp8_margin != d.fp8_margin || a.fp8_amax_history_len != d.fp8_amax_history_len ||
                               a.fp8_amax_compute_algo != d.fp8_amax_compute_algo))
    LATTICE_FAIL() << "--fp8-margin, --fp8-amax-history-len and --fp8-amax-compute-algo need --fp8-format";
}

// Megatron's precision-aware optimizer: its dtypes need the switch; lattice stores Adam's moments
// in fp32 or bf16, and its main gradients and parameters in fp32.
void validate_precision_aware_optimizer(const TrainArgs& a) {
  struct Dtype {
    const char* flag;
    const std::string& value;
    std::vector<std::string> megatron;  // Megatron's choices
    std::vector<std::string> lattice;   // the ones lattice implements
  };
  const Dtype dtypes[] = {{"exp-avg-dtype", a.exp_avg_dtype, {"fp32", "fp16", "bf16", "fp8"}, {"fp32", "bf16"}},
                          {"exp-avg-sq-dtype", a.exp_avg_sq_dtype, {"fp32", "fp16", "bf16", "fp8"}, {"fp32", "bf16"}},
                          {"main-grads-dtype", a.main_grads_dtype, {"fp32", "bf16"}, {"fp32"}},
                          {"main-params-dtype", a.main_params_dtype, {"fp32", "fp16"}, {"fp32"}}};
  for (const Dtype& d : dtypes) {
    auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), d.value) != v.end(); };
    if (!in(d.megatron)) {
      std::string choices;
      for (const std::string& c : d.megatron) choices += (choices.empty() ? "" : ", ") + c;
      LATTICE_FAIL() << "--" << d.flag << " must be one of " << choices << ", got '" << d.value << "'";
    }
    if (d.value != "fp32" && !a.use_precision_aware_optimizer)
      LATTICE_FAIL() << "--" << d.flag << " " << d.value << " needs --use-precision-aware-optimizer";
    if (!in(d.lattice))
      LATTICE_FAIL() << "--" << d.flag << " " << d.value << " is not implemented"
                     << (d.lattice.size() > 1 ? " (lattice stores Adam's moments in fp32 or bf16)"
                                              : " (lattice keeps it in fp32)");
  }
  if (a.use_precision_aware_optimizer && a.optimizer != "adam")
    LATTICE_FAIL() << "--use-precision-aware-optimizer needs --optimizer adam (its dtypes are Adam's state)";
}

// --moe-router-load-balancing-type: one type, or a list of the loss types each weighted by its own
// --moe-aux-loss-coeff (Megatron's lists).
void validate_load_balancing(const TrainArgs& a) {
  const std::vector<std::string>& types = a.moe_router_load_balancing_type;
  const std::vector<float>& coeffs = a.moe_aux_loss_coeff;
  if (types.empty()) LATTICE_FAIL() << "--moe-router-load-balancing-type needs a value";
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& t = types[i];
    const bool loss = t == "aux_loss" || t == "seq_aux_loss" || t == "global_aux_loss";
    if (!loss && t != "sinkhorn" && t != "none")
      LATTICE_FAIL() << "--moe-router-load-balancing-type " << t
                     << " is not supported (aux_loss, seq_aux_loss, global_aux_loss, a list of those, sinkhorn or none)";
    if (!loss && types.size() > 1)
      LATTICE_FAIL() << "--moe-router-load-balancing-type " << t << " goes alone (a list takes aux_loss, seq_aux_loss"
                     << " and global_aux_loss)";
    if (std::find(types.begin(), types.begin() + long(i), t) != types.begin() + long(i))
      LATTICE_FAIL() << "--moe-router-load-balancing-type lists " << t << " twice";
  }
  if (coeffs.empty()) LATTICE_FAIL() << "--moe-aux-loss-coeff needs a value";
  if (coeffs.size() != 1 && coeffs.size() != types.size())
    LATTICE_FAIL() << "--moe-aux-loss-coeff has " << coeffs.size() << " values for " << types.size()
                   << " --moe-router-load-balancing-type values (one for each, or one for a single type)";
  if (types.size() > 1 && coeffs.size() != types.size())
    LATTICE_FAIL() << "--moe-aux-loss-coeff needs one value for each of the " << types.size()
                   << " --moe-router-load-balancing-type values";
  for (float c : coeffs)
    if (!(c >= 0.0f && std::isfinite(c)))
      LATTICE_FAIL() << "--moe-aux-loss-coeff must be a finite number >= 0, got " << c;
}

// --optimizer muon: Megatron's flags, the parts lattice does not implement refused by name.
void validate_muon(const TrainArgs& a) {
  if (a.optimizer != "muon") return;
  if (a.use_distributed_optimizer)
    LATTICE_FAIL() << "--optimizer muon does not go with --use-distributed-optimizer (a matrix's Newton-Schulz "
                      "iteration needs all of it; Megatron's layer-wise distributed optimizer is not implemented)";
  if (a.muon_tp_mode != "blockwise" && a.muon_tp_mode != "duplicated")
    LATTICE_FAIL() << "--muon-tp-mode " << a.muon_tp_mode
                   << " is not implemented (blockwise: each tensor-parallel rank its shard; duplicated: the whole "
                      "matrix on every rank)";
  if (a.muon_scalar_optimizer != "adam")
    LATTICE_FAIL() << "--muon-scalar-optimizer " << a.muon_scalar_optimizer << " is not implemented (adam)";
  const std::string& prec = a.muon_fp32_matmul_prec;
  if (prec != "medium" && prec != "high" && prec != "highest")
    LATTICE_FAIL() << "--muon-fp32-matmul-prec must be medium, high or highest, got '" << prec << "'";
  newton_schulz_coefficients(a.muon_coefficient_type, a.muon_num_ns_steps);  // their errors name the flags
  muon_scale_factor(1, 1, a.muon_scale_mode);
  if (!(a.muon_momentum >= 0.0f && a.muon_momentum < 1.0f))
    LATTICE_FAIL() << "--muon-momentum must be in [0, 1), got " << a.muon_momentum;
}

// --sft (Megatron's): JSONL files of conversations (--data-path or the per-split paths, blended as
// pretraining data is), a tokenizer, the packing of Megatron's SFTDataset.
void validate_sft(const TrainArgs& a) {
  if (!a.chat_template.empty() && !a.sft) LATTICE_FAIL() << "--chat-template goes with --sft";
  if (!a.sft) return;
  if (a.mock_data) LATTICE_FAIL() << "--sft reads conversations from --data-path, not --mock-data";
  if (a.tokenizer_type.empty()) LATTICE_FAIL() << "--sft needs --tokenizer-type (conversations are text)";
  if (a.reset_position_ids || a.reset_attention_mask)
    LATTICE_FAIL() << "--sft sets the documents itself (each conversation its positions and attention): drop "
                   << (a.reset_position_ids ? "--reset-position-ids" : "--reset-attention-mask");
}

// --data-args-path and --per-split-data-args-path (Megatron's): the data paths read from files, for
// blends too long for a command line. The first holds --data-path's words (split at any whitespace);
// the second a JSON object whose "train", "valid" and "test" are each a list of words or one string
// of them ("valid" and "test" may be missing or null: no such split).
void read_data_args_files(TrainArgs& a) {
  auto read = [](const std::string& path, const char* flag) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) LATTICE_FAIL() << "--" << flag << " " << path << ": is a directory, not a file";
    std::ifstream in(path);
    if (!in) LATTICE_FAIL() << "--" << flag << " " << path << ": cannot open: " << std::strerror(errno);
    std::stringstream text;
    text << in.rdbuf();
    if (in.bad()) LATTICE_FAIL() << "--" << flag << " " << path << ": cannot read";
    return text.str();
  };
  auto words = [](const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
  };
  if (!a.data_args_path.empty()) {
    if (!a.data_path.empty()) LATTICE_FAIL() << "--data-args-path and --data-path are exclusive";
    a.data_path = words(read(a.data_args_path, "data-args-path"));
    if (a.data_path.empty()) LATTICE_FAIL() << "--data-args-path " << a.data_args_path << ": no data paths in the file";
  }
  if (a.per_split_data_args_path.empty()) return;
  const std::string& file = a.per_split_data_args_path;
  if (!a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty())
    LATTICE_FAIL() << "--per-split-data-args-path and --train-data-path/--valid-data-path/--test-data-path are exclusive";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read(file, "per-split-data-args-path"));
  } catch (const nlohmann::json::parse_error& e) {
    LATTICE_FAIL() << "--per-split-data-args-path " << file << ": not JSON (" << e.what() << ")";
  }
  if (!j.is_object())
    LATTICE_FAIL() << "--per-split-data-args-path " << file << ": expected an object with train, valid and test";
  for (const auto& [key, value] : j.items())
    if (key != "train" && key != "valid" && key != "test")
      LATTICE_FAIL() << "--per-split-data-args-path " << file << ": unknown key \"" << key
                     << "\" (train, valid, test)";
  std::vector<std::string>* targets[3] = {&a.train_data_path, &a.valid_data_path, &a.test_data_path};
  const char* keys[3] = {"train", "valid", "test"};
  for (int k = 0; k < 3; ++k) {
    if (!j.contains(keys[k]) || j[keys[k]].is_null()) {
      if (k == 0) LATTICE_FAIL() << "--per-split-data-args-path " << file << ": no \"train\" data";
      continue;
    }
    const nlohmann::json& v = j[keys[k]];
    if (v.is_string()) {
      *targets[k] = words(v.get<std::string>());
    } else if (v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_string(); })) {
      for (const auto& e : v)
        for (const std::string& w : words(e.get<std::string>())) targets[k]->push_back(w);
    } else {
      LATTICE_FAIL() << "--per-split-data-args-path " << file << ": \"" << keys[k]
                     << "\" must be a list of strings or a string";
    }
    if (targets[k]->empty()) LATTICE_FAIL() << "--per-split-data-args-path " << file << ": \"" << keys[k] << "\" is empty";
  }
}

void validate(TrainArgs& a) {
  // Megatron's --recompute-activations: selective recomputation, whatever --recompute-granularity says.
  if (a.recompute_activations) a.recompute_granularity = "selective";
  reject_unimplemented(a);
  validate_muon(a);
  validate_sft(a);
  validate_precision(a);
  validate_precision_aware_optimizer(a);
  validate_load_balancing(a);
  // Megatron pads each expert's rows to its capacity with tokens of gate 0: nothing reaches an output
  // or a gradient from them, so lattice runs each expert on the tokens it keeps (the same numbers).
  if (a.moe_per_layer_logging && a.num_experts == 0)
    LATTICE_FAIL() << "--moe-per-layer-logging logs the MoE layers' losses: it needs --num-experts";
  if (a.num_distributed_optimizer_instances < 1)
    LATTICE_FAIL() << "--num-distributed-optimizer-instances must be >= 1, got " << a.num_distributed_optimizer_instances;
  if (a.num_distributed_optimizer_instances > 1 && !a.use_distributed_optimizer)
    LATTICE_FAIL() << "--num-distributed-optimizer-instances " << a.num_distributed_optimizer_instances
                   << " needs --use-distributed-optimizer (the instances are its copies)";
  if (a.moe_pad_expert_input_to_capacity && !a.moe_expert_capacity_factor)
    LATTICE_FAIL() << "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor";
  auto positive = [](const char* flag, int64_t v) {
    if (v <= 0) LATTICE_FAIL() << "--" << flag << " is required and must be positive (got " << v << ")";
  };
  positive("num-layers", a.num_layers);
  positive("hidden-size", a.hidden_size);
  positive("num-attention-heads", a.num_attention_heads);
  positive("seq-length", a.seq_length);
  positive("micro-batch-size", a.micro_batch_size);
  if (a.train_samples != 0 && a.train_iters != 0)
    LATTICE_FAIL() << "--train-iters and --train-samples are exclusive";
  if (a.train_samples == 0) positive("train-iters", a.train_iters);
  else positive("train-samples", a.train_samples);
  positive("log-interval", a.log_interval);
  positive("tensorboard-log-interval", a.tensorboard_log_interval);
  positive("tensorboard-queue-size", a.tensorboard_queue_size);
  if (a.tensorboard_dir.empty() && (a.log_validation_ppl_to_tensorboard || a.log_timers_to_tensorboard ||
                                    a.log_world_size_to_tensorboard || a.log_memory_to_tensorboard))
    LATTICE_FAIL() << "--log-validation-ppl-to-tensorboard, --log-timers-to-tensorboard, "
                      "--log-world-size-to-tensorboard and --log-memory-to-tensorboard need --tensorboard-dir DIR";
  if (a.max_position_embeddings == 0) a.max_position_embeddings = a.seq_length;
  if (a.global_batch_size == 0) a.global_batch_size = a.micro_batch_size;
  if (!a.rampup_batch_size.empty()) {
    if (a.rampup_batch_size.size() != 3)
      LATTICE_FAIL() << "--rampup-batch-size takes 3 values (START INCREMENT SAMPLES), got "
                     << a.rampup_batch_size.size();
    if (a.train_samples == 0)
      LATTICE_FAIL() << "--rampup-batch-size needs sample-based training (--train-samples, not --train-iters), "
                        "as Megatron's";
    for (const std::string& v : a.rampup_batch_size) (void)parse_number<int64_t>("rampup-batch-size", v);
    (void)a.rampup();  // checks the values
  }
  if (a.train_samples > 0) {  // Megatron's update_train_iters
    if (a.global_batch_size > 0 && a.train_samples < a.batch_size_at(0))
      LATTICE_FAIL() << "--train-samples " << a.train_samples << " is less than one "
                     << (a.rampup() ? "first global batch of --rampup-batch-size " : "--global-batch-size ")
                     << a.batch_size_at(0);
    if (a.global_batch_size > 0)
      a.train_iters = a.rampup() ? a.rampup()->train_iters(a.train_samples) : a.train_samples / a.global_batch_size;
  }
  if (a.global_batch_size < 0) LATTICE_FAIL() << "--global-batch-size must be positive";
  if (a.profile_ops && a.train_iters < 2)
    LATTICE_FAIL() << "--profile-ops needs 2 or more iterations (the first is warm-up), got " << a.train_iters;
  if (a.use_pytorch_profiler)
    LATTICE_FAIL() << "--use-pytorch-profiler: lattice has no PyTorch profiler; --profile logs lattice's op table "
                      "over the same steps";
  if (a.profile && a.profile_ops)
    LATTICE_FAIL() << "--profile and --profile-ops choose different steps to profile: give one";
  if (a.profile && (a.profile_step_start < 0 || a.profile_step_end <= a.profile_step_start))
    LATTICE_FAIL() << "--profile-step-start " << a.profile_step_start << " and --profile-step-end "
                   << a.profile_step_end << " select no step (0 <= start < end)";
  a.profile_rank_list();  // each a number
  if (a.global_batch_size % a.micro_batch_size != 0)
    LATTICE_FAIL() << "--global-batch-size " << a.global_batch_size
                   << " is not a multiple of --micro-batch-size " << a.micro_batch_size;
  if (a.seq_length > a.max_position_embeddings)
    LATTICE_FAIL() << "--seq-length " << a.seq_length << " exceeds --max-position-embeddings "
                   << a.max_position_embeddings;
  if (a.tensor_model_parallel_size < 1)
    LATTICE_FAIL() << "--tensor-model-parallel-size must be >= 1, got " << a.tensor_model_parallel_size;
  if (a.expert_model_parallel_size < 1)
    LATTICE_FAIL() << "--expert-model-parallel-size must be >= 1, got " << a.expert_model_parallel_size;
  if (a.expert_model_parallel_size > 1) {
    if (a.num_experts <= 0)
      LATTICE_FAIL() << "--expert-model-parallel-size " << a.expert_model_parallel_size << " needs --num-experts";
    if (a.num_experts % a.expert_model_parallel_size != 0)
      LATTICE_FAIL() << "--num-experts " << a.num_experts << " is not divisible by --expert-model-parallel-size "
                     << a.expert_model_parallel_size;
  }
  if (a.context_parallel_size < 1)
    LATTICE_FAIL() << "--context-parallel-size must be >= 1, got " << a.context_parallel_size;
  if (a.cp_comm_type != "p2p" && a.cp_comm_type != "a2a" && a.cp_comm_type != "allgather" &&
      a.cp_comm_type != "a2a+p2p")
    LATTICE_FAIL() << "--cp-comm-type must be p2p, a2a, allgather or a2a+p2p, got '" << a.cp_comm_type << "'";
  if (a.context_parallel_size > 1) {
    const int64_t cp = a.context_parallel_size;
    if (a.seq_length % (2 * cp) != 0)
      LATTICE_FAIL() << "--seq-length " << a.seq_length << " is not divisible by 2 x --context-parallel-size " << cp
                     << " (each rank holds two of the sequence's " << 2 * cp << " chunks)";
    if (a.sequence_parallel && (a.seq_length / cp) % a.tensor_model_parallel_size != 0)
      LATTICE_FAIL() << "--seq-length " << a.seq_length << " / --context-parallel-size " << cp
                     << " is not divisible by --tensor-model-parallel-size " << a.tensor_model_parallel_size
                     << " (required by --sequence-parallel)";
  }
  // A unified hybrid pattern's depths are --mtp-num-layers (given or not, as Megatron derives it).
  if (const HybridPattern h = parse_hybrid_pattern(a.hybrid_override_pattern); h.mtp_depths > 0) {
    if (a.mtp_num_layers > 0 && a.mtp_num_layers != h.mtp_depths)
      LATTICE_FAIL() << "--mtp-num-layers " << a.mtp_num_layers << " but --hybrid-override-pattern '"
                     << a.hybrid_override_pattern << "' has " << h.mtp_depths << " prediction depths";
    a.mtp_num_layers = h.mtp_depths;
  }
  if (a.mtp_num_layers > 0 && a.pipeline_model_parallel_size > 1 && a.position_embedding_type == "learned_absolute")
    LATTICE_FAIL() << "--mtp-num-layers with --pipeline-model-parallel-size > 1 needs --position-embedding-type rope "
                      "or none: the last stage's prediction depths have no position table";
  pipeline_layout_of(a);
  if (a.sequence_parallel && a.seq_length % a.tensor_model_parallel_size != 0)
    LATTICE_FAIL() << "--seq-length " << a.seq_length << " is not divisible by --tensor-model-parallel-size "
                   << a.tensor_model_parallel_size << " (required by --sequence-parallel)";
  if (a.ddp_bucket_size < 0) LATTICE_FAIL() << "--ddp-bucket-size must be >= 0, got " << a.ddp_bucket_size;
  if (a.ddp_num_buckets < 0) LATTICE_FAIL() << "--ddp-num-buckets must be greater than 0, got " << a.ddp_num_buckets;
  if (a.ddp_num_buckets > 0 && a.ddp_bucket_size > 0)
    LATTICE_FAIL() << "--ddp-num-buckets and --ddp-bucket-size cannot both be given";
  if (a.distributed_timeout_minutes <= 0)
    LATTICE_FAIL() << "--distributed-timeout-minutes must be positive, got " << a.distributed_timeout_minutes;
  if (a.lr < 0) LATTICE_FAIL() << "--lr must be >= 0, got " << a.lr;
  if (a.min_lr < 0) LATTICE_FAIL() << "--min-lr must be >= 0, got " << a.min_lr;
  if (a.weight_decay < 0) LATTICE_FAIL() << "--weight-decay must be >= 0, got " << a.weight_decay;
  if (a.clip_grad < 0) LATTICE_FAIL() << "--clip-grad must be >= 0, got " << a.clip_grad;
  const TrainArgs::MegatronImplementationFlags& impl = a.implementation;
  if (impl.transformer_impl != "local" && impl.transformer_impl != "transformer_engine")
    LATTICE_FAIL() << "--transformer-impl must be local or transformer_engine, got '" << impl.transformer_impl << "'";
  if (impl.ckpt_format != "torch_dist")
    LATTICE_FAIL() << "--ckpt-format " << impl.ckpt_format
                   << " is not implemented: lattice writes one layout-independent checkpoint format (Megatron's torch_dist "
                      "role; docs/checkpoint-format.md); drop the flag or give torch_dist (lattice convert --from-megatron "
                      "and --to-megatron convert Megatron's own checkpoints)";
  if (impl.rerun_mode != "disabled")
    LATTICE_FAIL() << "--rerun-mode " << impl.rerun_mode
                   << " is not implemented (Megatron's rerun state machine; lattice's steps are deterministic, so a "
                      "rerun gives the same bits): give disabled or drop the flag";
  if (a.error_injection_rate < 0) LATTICE_FAIL() << "--error-injection-rate must be >= 0, got " << a.error_injection_rate;
  check_one_of("error-injection-type", a.error_injection_type, {"correct_result", "transient_error", "persistent_error"});
  a.iterations_to_skip_list();  // names a malformed --iterations-to-skip or tracker file
  if (impl.ckpt_fully_parallel_save && impl.no_ckpt_fully_parallel_save)
    LATTICE_FAIL() << "--ckpt-fully-parallel-save and --no-ckpt-fully-parallel-save contradict each other";
  if (impl.distributed_backend != "nccl" && impl.distributed_backend != "gloo")
    LATTICE_FAIL() << "--distributed-backend must be nccl or gloo, got '" << impl.distributed_backend << "'";
  if (impl.num_workers < 0) LATTICE_FAIL() << "--num-workers must be >= 0, got " << impl.num_workers;
  for (const auto& [flag, v] : {std::pair{"manual-gc-interval", impl.manual_gc_interval},
                                std::pair{"local-rank", impl.local_rank}, std::pair{"fp8-interval", impl.fp8_interval},
                                std::pair{"train-sync-interval", impl.train_sync_interval},
                                std::pair{"wgrad-deferral-limit", impl.wgrad_deferral_limit}})
    if (v < 0) LATTICE_FAIL() << "--" << flag << " must be >= 0, got " << v;
  check_one_of("dist-ckpt-strictness", impl.dist_ckpt_strictness,
               {"assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
                "return_unexpected", "return_all", "ignore_all"});
  if (impl.distribute_saved_activations) {  // Megatron's assertions
    if (a.tensor_model_parallel_size < 2)
      LATTICE_FAIL() << "--distribute-saved-activations needs --tensor-model-parallel-size > 1 (the activations are "
                        "distributed over the tensor-parallel group)";
    if (a.recompute_granularity != "full" || a.recompute_method.empty())
      LATTICE_FAIL() << "--distribute-saved-activations needs --recompute-granularity full and a --recompute-method";
  }
  if (!impl.hierarchical_context_parallel_sizes.empty() || a.cp_comm_type == "a2a+p2p") {
    int64_t product = 1;
    for (const std::string& s : impl.hierarchical_context_parallel_sizes) {
      const int64_t v = parse_number<int64_t>("hierarchical-context-parallel-sizes", s);
      if (v < 1) LATTICE_FAIL() << "--hierarchical-context-parallel-sizes: " << s << " is not a size (1 or more)";
      product *= v;
    }
    if (impl.hierarchical_context_parallel_sizes.empty())  // Megatron's assertion
      LATTICE_FAIL() << "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes";
    if (product != a.context_parallel_size)
      LATTICE_FAIL() << "--hierarchical-context-parallel-sizes multiply to " << product
                     << ", not --context-parallel-size " << a.context_parallel_size;
  }
  if (a.no_fp8_wgrad && a.fp8_format.empty()) LATTICE_FAIL() << "--no-fp8-wgrad needs --fp8-format";
  if (impl.fp32_residual_connection && !a.bf16 && !a.fp16)  // Megatron's assertion
    LATTICE_FAIL() << "--fp32-residual-connection needs --bf16 or --fp16 (the residual stream of an fp32 run is fp32)";
  check_one_of("cross-entropy-fusion-impl", impl.cross_entropy_fusion_impl, {"native", "te"});
  check_one_of("timing-log-option", impl.timing_log_option, {"max", "minmax", "all"});
  check_one_of("tp-comm-bootstrap-backend", impl.tp_comm_bootstrap_backend, {"nccl", "mpi", "gloo"});
  if (impl.dataloader_type != "single")
    LATTICE_FAIL() << "--dataloader-type " << impl.dataloader_type
                   << (impl.dataloader_type == "cyclic" || impl.dataloader_type == "external"
                           ? " is not implemented: lattice reads the samples in the dataset's order (single)"
                           : " must be single, cyclic or external");
  if (impl.timing_log_level < 0 || impl.timing_log_level > 2)
    LATTICE_FAIL() << "--timing-log-level must be 0, 1 or 2, got " << impl.timing_log_level;
  if (impl.accumulate_allreduce_grads_in_fp32 && a.grad_reduce_in_bf16)
    LATTICE_FAIL() << "--accumulate-allreduce-grads-in-fp32 and --grad-reduce-in-bf16 contradict each other";
  if (impl.mmap_bin_files && impl.no_mmap_bin_files)
    LATTICE_FAIL() << "--mmap-bin-files and --no-mmap-bin-files contradict each other";
  if (impl.apply_query_key_layer_scaling && impl.no_query_key_layer_scaling)
    LATTICE_FAIL() << "--apply-query-key-layer-scaling and --no-query-key-layer-scaling contradict each other";
  if (impl.tp_comm_overlap && !a.sequence_parallel)  // Megatron's condition
    LATTICE_FAIL() << "--tp-comm-overlap needs --sequence-parallel";
  if (impl.moe_token_dispatcher_type != "alltoall" && impl.moe_token_dispatcher_type != "allgather")
    LATTICE_FAIL() << "--moe-token-dispatcher-type must be alltoall or allgather, got '" << impl.moe_token_dispatcher_type
                   << "'" << (impl.moe_token_dispatcher_type == "flex" ? " (flex, DeepEP's, is not implemented)" : "");
  if (impl.expert_tensor_parallel_size != 0 && impl.expert_tensor_parallel_size != 1 &&
      impl.expert_tensor_parallel_size != a.tensor_model_parallel_size)
    LATTICE_FAIL() << "--expert-tensor-parallel-size " << impl.expert_tensor_parallel_size << " is neither 1 nor "
                   << "--tensor-model-parallel-size " << a.tensor_model_parallel_size
                   << " (other sizes are not implemented)";
  if (impl.expert_tensor_parallel_size == 1 && a.tensor_model_parallel_size > 1) {  // whole experts
    if (a.num_experts == 0) LATTICE_FAIL() << "--expert-tensor-parallel-size 1 needs --num-experts";
    if (!a.sequence_parallel)
      LATTICE_FAIL() << "--expert-tensor-parallel-size 1 needs --sequence-parallel (each tensor-parallel rank routes "
                        "its own rows)";
  }
  if (impl.num_dataset_builder_threads < 1)
    LATTICE_FAIL() << "--num-dataset-builder-threads must be >= 1, got " << impl.num_dataset_builder_threads;
  if (impl.empty_unused_memory_level < 0 || impl.empty_unused_memory_level > 2)
    LATTICE_FAIL() << "--empty-unused-memory-level must be 0, 1 or 2, got " << impl.empty_unused_memory_level;
  if (a.use_rotary_position_embeddings) {
    if (a.position_embedding_type != "learned_absolute" && a.position_embedding_type != "rope")
      LATTICE_FAIL() << "--use-rotary-position-embeddings contradicts --position-embedding-type "
                     << a.position_embedding_type;
    a.position_embedding_type = "rope";
  }
  if (!a.rope_type.empty()) {
    if (a.rope_type != "rope" && a.rope_type != "yarn")
      LATTICE_FAIL() << "--rope-type must be rope or yarn, got '" << a.rope_type << "'";
    if (a.position_embedding_type != "learned_absolute" && a.position_embedding_type != a.rope_type)
      LATTICE_FAIL() << "--rope-type " << a.rope_type << " contradicts --position-embedding-type " << a.position_embedding_type;
    a.position_embedding_type = a.rope_type;
  }
  if (a.rotary_scaling_factor) a.yarn_rotary_scaling_factor = float(*a.rotary_scaling_factor);
  if (a.mscale) a.yarn_mscale = float(*a.mscale);
  if (a.mscale_all_dim) a.yarn_mscale_all_dim = float(*a.mscale_all_dim);
  if (a.no_position_embedding && a.position_embedding_type != "rope" && a.position_embedding_type != "yarn")
    LATTICE_FAIL() << "--no-position-embedding needs --position-embedding-type rope (lattice has no model without "
                      "position information)";
  if (a.exit_on_missing_checkpoint && a.load.empty()) LATTICE_FAIL() << "--exit-on-missing-checkpoint needs --load";
  if (a.attention_backend != "auto" && a.attention_backend != "flash" && a.attention_backend != "fused" &&
      a.attention_backend != "unfused" && a.attention_backend != "local")
    LATTICE_FAIL() << "--attention-backend must be flash, fused, unfused, local or auto, got '" << a.attention_backend
                   << "'";
  if (a.optimizer != "adam" && a.optimizer != "sgd" && a.optimizer != "muon")
    LATTICE_FAIL() << "--optimizer must be adam, sgd or muon, got " << a.optimizer;
  read_data_args_files(a);
  const bool split_paths = !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  if (a.mock_data && (!a.data_path.empty() || split_paths))
    LATTICE_FAIL() << "--mock-data and --data-path/--train-data-path are exclusive";
  if (!a.data_path.empty() && split_paths)
    LATTICE_FAIL() << "--data-path and --train-data-path/--valid-data-path/--test-data-path are exclusive";
  if (!a.mock_data && a.data_path.empty() && a.train_data_path.empty())
    LATTICE_FAIL() << "no training data: give --data-path PREFIX, --train-data-path PREFIX or --mock-data";
  if (!a.data_path.empty()) parse_blend(a.data_path, "data-path");  // weights > 0, pairs
  if (!a.train_data_path.empty()) parse_blend(a.train_data_path, "train-data-path");
  if (a.multiple_validation_sets) validation_set_prefixes(a.valid_data_path);
  else if (!a.valid_data_path.empty()) parse_blend(a.valid_data_path, "valid-data-path");
  if (!a.test_data_path.empty()) parse_blend(a.test_data_path, "test-data-path");
  split_ranges(a.split, 0);  // names a malformed --split
  if (a.eval_interval <= 0) LATTICE_FAIL() << "--eval-interval must be positive, got " << a.eval_interval;
  if (a.eval_iters < 0) LATTICE_FAIL() << "--eval-iters must be >= 0, got " << a.eval_iters;
  if (!(a.mid_level_dataset_surplus >= 0))
    LATTICE_FAIL() << "--mid-level-dataset-surplus must be >= 0, got " << a.mid_level_dataset_surplus;
  if (a.embedding_init_method_std && !(*a.embedding_init_method_std >= 0))
    LATTICE_FAIL() << "--embedding-init-method-std must be >= 0, got " << *a.embedding_init_method_std;
  if (a.full_validation && a.mock_data)
    LATTICE_FAIL() << "--full-validation evaluates the whole validation split, and --mock-data's has no end: "
                      "give --data-path or --valid-data-path";
  // Also names an unknown --tokenizer-type or a bad --vocab-file/--merge-file.
  int64_t tokenizer_vocab_size = 0;
  if (!a.tokenizer_type.empty()) {
    a.tokenizer = make_tokenizer(a.tokenizer_spec());
    tokenizer_vocab_size = a.tokenizer->vocab_size();
  }
  if (a.tokenizer_type.empty() && a.vocab_size <= 0)
    LATTICE_FAIL() << "--vocab-size is required when no --tokenizer-type is given";
  if (a.num_threads < 0) LATTICE_FAIL() << "--num-threads must be >= 0";
  parse_device(a.device.c_str());  // names --device
  const bool delayed_fp8 = parse_fp8_scaling(a.fp8_recipe) == Fp8Scaling::delayed && !a.fp8_format.empty();
  if (!a.fp8_format.empty()) {  // Megatron's TransformerConfig checks, with fp8 only
    const int64_t per_stage = a.num_layers / std::max<int64_t>(1, a.pipeline_model_parallel_size);
    for (const auto& [n, flag] : {std::pair{a.num_layers_at_start_in_bf16, "--num-layers-at-start-in-bf16"},
                                  std::pair{a.num_layers_at_end_in_bf16, "--num-layers-at-end-in-bf16"}})
      if (a.first_last_layers_bf16 && (n < 0 || n > per_stage))
        LATTICE_FAIL() << flag << " " << n << " must be between 0 and the layers per pipeline stage (" << per_stage << ")";
    if (a.first_last_layers_bf16 && delayed_fp8)
      LATTICE_FAIL() << "--first-last-layers-bf16: the delayed fp8 recipe (--fp8-recipe delayed) does not "
                        "support first / last layers in bf16, as Megatron's does not";

  }
  if (a.implementation.ddp_average_in_collective && a.calculate_per_token_loss)  // Megatron's assertion
    LATTICE_FAIL() << "--ddp-average-in-collective cannot be used with --calculate-per-token-loss (the gradients are "
                      "divided by the global batch's token count, not averaged over the ranks)";
  // fp8's delayed scaling records each GEMM input's amax; a recomputed forward would
  // record them twice and quantize with moved scales. The current-scaling recipes keep no
  // amaxes: a recomputed GEMM quantizes as the first.
  if (a.recompute_granularity == "full" && delayed_fp8)
    LATTICE_FAIL() << "--recompute-granularity full is not supported with --fp8-recipe delayed (the recomputed "
                      "forward would record fp8 amaxes twice); use --recompute-granularity selective, or a "
                      "current-scaling recipe (tensorwise, blockwise, mxfp8)";
  const bool moe_recompute = a.moe_layer_recompute || std::count(a.recompute_modules.begin(), a.recompute_modules.end(), "moe");
  if (moe_recompute && delayed_fp8)
    LATTICE_FAIL() << (a.moe_layer_recompute ? "--moe-layer-recompute" : "--recompute-modules moe")
                   << " is not supported with --fp8-recipe delayed (the recomputed experts would record fp8 amaxes "
                      "twice)";
  for (const char* module : {"mlp", "shared_experts", "mla_up_proj"})
    if (std::count(a.recompute_modules.begin(), a.recompute_modules.end(), module) && delayed_fp8)
      LATTICE_FAIL() << "--recompute-modules " << module << " is not supported with --fp8-recipe delayed (its "
                     << "recomputed GEMMs would record fp8 amaxes twice)";
  // Model-shape checks (heads dividing hidden size, ...) live in TransformerConfig.
  TransformerConfig cfg = a.transformer_config();
  if (tokenizer_vocab_size > 0) cfg.vocab_size = tokenizer_vocab_size;
  cfg.finalize(a.tensor_model_parallel_size);
}

}  // namespace

std::vector<int> TrainArgs::profile_rank_list() const {
  std::vector<int> ranks;
  for (const std::string& r : profile_ranks) {
    const int64_t rank = parse_number<int64_t>("profile-ranks", r);
    if (rank < 0 || rank > std::numeric_limits<int>::max())
      LATTICE_FAIL() << "--profile-ranks: " << r << " is not a rank (0 or more)";
    ranks.push_back(int(rank));
  }
  if (ranks.empty()) LATTICE_FAIL() << "--profile-ranks needs one rank or more";
  return ranks;
}

std::vector<int64_t> TrainArgs::iterations_to_skip_list() const {
  std::set<int64_t> skip;
  for (const std::string& s : iterations_to_skip) {
    const int64_t it = parse_number<int64_t>("iterations-to-skip", s);
    if (it < 0) LATTICE_FAIL() << "--iterations-to-skip: " << s << " is not an iteration index (0 or more)";
    skip.insert(it);
  }
  if (!result_rejected_tracker_filename.empty())
    for (int64_t it : iterations_to_skip_from_tracker_file(result_rejected_tracker_filename)) skip.insert(it);
  return {skip.begin(), skip.end()};
}

std::optional<BatchSizeRampup> TrainArgs::rampup() const {
  if (rampup_batch_size.size() != 3) return std::nullopt;
  return BatchSizeRampup(parse_number<int64_t>("rampup-batch-size", rampup_batch_size[0]),
                         parse_number<int64_t>("rampup-batch-size", rampup_batch_size[1]),
                         parse_number<int64_t>("rampup-batch-size", rampup_batch_size[2]), global_batch_size);
}

int64_t TrainArgs::batch_size_at(int64_t consumed) const {
  const std::optional<BatchSizeRampup> r = rampup();
  return r ? r->batch_size(consumed) : global_batch_size;
}

int64_t TrainArgs::consumed_after(int64_t iterations) const {
  const std::optional<BatchSizeRampup> r = rampup();
  return r ? r->consumed_after(iterations) : iterations * global_batch_size;
}

bool TrainArgs::moe_load_balancing(const std::string& type) const {
  return std::find(moe_router_load_balancing_type.begin(), moe_router_load_balancing_type.end(), type) !=
         moe_router_load_balancing_type.end();
}

TransformerConfig TrainArgs::transformer_config() const {
  TransformerConfig c;
  c.num_layers = num_layers;
  c.hidden_size = hidden_size;
  c.num_attention_heads = num_attention_heads;
  c.ffn_hidden_size = ffn_hidden_size;
  c.kv_channels = kv_channels;
  c.vocab_size = tokenizer_type == "ByteTokenizer" ? 257 : vocab_size;
  c.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
  c.max_position_embeddings = max_position_embeddings;
  c.hidden_dropout = hidden_dropout;
  c.attention_dropout = attention_dropout;
  c.layernorm_epsilon = norm_epsilon;
  c.init_method_std = init_method_std;
  c.init_method_xavier_uniform = init_method_xavier_uniform;
  if (embedding_init_method_std) c.embedding_init_method_std = float(*embedding_init_method_std);
  const char* glu = swiglu ? "--swiglu" : quick_geglu ? "--quick-geglu" : nullptr;
  if (swiglu && quick_geglu) LATTICE_FAIL() << "--swiglu and --quick-geglu: the MLP has one gated unit; give one of them";
  if (glu && openai_gelu)
    LATTICE_FAIL() << "--openai-gelu and " << glu << ": the gated MLP has no tanh GELU; give one of them";
  if (squared_relu && (glu || openai_gelu))
    LATTICE_FAIL() << "--squared-relu and " << (glu ? glu : "--openai-gelu")
                   << ": the MLP has one activation; give one of them";
  c.gelu = squared_relu ? GeluKind::squared_relu : openai_gelu ? GeluKind::tanh : GeluKind::erf;
  c.apply_layernorm_1p = apply_layernorm_1p;
  c.swiglu = swiglu;
  c.quick_geglu = quick_geglu;
  c.glu_linear_offset = glu_linear_offset;
  c.activation_func_clamp_value = activation_func_clamp_value;
  c.num_query_groups = group_query_attention ? num_query_groups : 0;  // Megatron ignores it without the switch
  c.untie_embeddings_and_output_weights = untie_embeddings_and_output_weights;
  c.add_bias_linear = !disable_bias_linear;
  c.add_qkv_bias = add_qkv_bias;
  c.qk_layernorm = qk_layernorm;
  c.qk_l2_norm = qk_l2_norm;
  c.attention_output_gate = attention_output_gate;
  c.multi_latent_attention = multi_latent_attention;
  c.q_lora_rank = q_lora_rank;
  c.mla_latent_norm_epsilon = mla_latent_norm_epsilon;
  c.kv_lora_rank = kv_lora_rank;
  c.qk_head_dim = qk_head_dim;
  c.qk_pos_emb_head_dim = qk_pos_emb_head_dim;
  c.v_head_dim = v_head_dim;
  c.num_experts = num_experts;
  c.expert_tensor_parallel_size = implementation.expert_tensor_parallel_size;
  c.moe_router_topk = moe_router_topk;
  c.moe_ffn_hidden_size = moe_ffn_hidden_size;
  c.moe_router_pre_softmax = moe_router_pre_softmax;
  c.moe_apply_probs_on_input = moe_apply_probs_on_input;
  c.moe_shared_expert_intermediate_size = moe_shared_expert_intermediate_size;
  c.moe_latent_size = moe_latent_size;
  c.moe_router_score_function = moe_router_score_function;
  c.moe_router_dtype = moe_router_dtype;
  c.moe_router_num_groups = moe_router_num_groups;
  c.moe_router_group_topk = moe_router_group_topk;
  c.moe_router_enable_expert_bias = moe_router_enable_expert_bias;
  c.moe_router_bias_update_rate = moe_router_bias_update_rate;
  c.moe_shared_expert_gate = moe_shared_expert_gate;
  if (num_experts > 0) c.moe_layer_pattern = TransformerConfig::parse_moe_layer_freq(moe_layer_freq, num_layers);
  c.moe_router_topk_scaling_factor = moe_router_topk_scaling_factor;
  c.softmax_type = softmax_type;
  if (!window_size.empty()) c.window_size = TransformerConfig::parse_window_size(window_size);
  if (!window_attn_skip_freq.empty()) {
    if (c.window_size < 0) LATTICE_FAIL() << "--window-attn-skip-freq needs --window-size";
    c.window_attn_pattern = TransformerConfig::parse_window_attn_skip_freq(window_attn_skip_freq, num_layers);
  }
  if (!no_rope_freq.empty()) c.no_rope_pattern = TransformerConfig::parse_no_rope_freq(no_rope_freq, num_layers);
  c.experimental_attention_variant = experimental_attention_variant;
  if (!linear_attention_freq.empty())
    c.linear_attention_pattern = TransformerConfig::parse_linear_attention_freq(linear_attention_freq, num_layers);
  c.linear_conv_kernel_dim = linear_conv_kernel_dim;
  c.linear_key_head_dim = linear_key_head_dim;
  c.linear_value_head_dim = linear_value_head_dim;
  c.linear_num_key_heads = linear_num_key_heads;
  c.linear_num_value_heads = linear_num_value_heads;
  const HybridPattern pattern = parse_hybrid_pattern(hybrid_override_pattern);
  if (is_hybrid_model || hybrid_attention_ratio != 0.0 || hybrid_mlp_ratio != 0.0 || !hybrid_override_pattern.empty())
    c.hybrid_layer_pattern = allocate_hybrid_layers(num_layers, hybrid_attention_ratio, hybrid_mlp_ratio, pattern.main);
  c.mtp_hybrid_pattern = pattern.mtp;  // (its depths are mtp_num_layers: the argument check made them agree)
  c.mamba_state_dim = mamba_state_dim;
  c.mamba_head_dim = mamba_head_dim;
  c.mamba_num_groups = mamba_num_groups;
  c.mamba_num_heads = mamba_num_heads;
  // Each listed type's coefficient (a single type: the single value; sinkhorn's is checked as 0).
  c.moe_aux_loss_coeff = 0.0f;
  for (size_t i = 0; i < moe_router_load_balancing_type.size(); ++i) {
    const std::string& t = moe_router_load_balancing_type[i];
    const float coeff = moe_aux_loss_coeff.size() == 1 ? moe_aux_loss_coeff[0] : moe_aux_loss_coeff[i];
    if (t == "aux_loss" || t == "sinkhorn") c.moe_aux_loss_coeff = coeff;
    if (t == "seq_aux_loss") {
      c.moe_seq_aux_loss = true;
      c.moe_seq_aux_loss_coeff = coeff;
    }
    if (t == "global_aux_loss") {
      c.moe_global_aux_loss = true;
      c.moe_global_aux_loss_coeff = coeff;
    }
    if (t == "sinkhorn") c.moe_sinkhorn = true;
  }
  c.moe_z_loss_coeff = moe_z_loss_coeff;
  c.moe_input_jitter_eps = moe_input_jitter_eps;
  c.moe_router_force_load_balancing = moe_router_force_load_balancing;
  c.mtp_num_layers = mtp_num_layers;
  c.mtp_loss_scaling_factor = mtp_loss_scaling_factor;
  c.mtp_use_repeated_layer = mtp_use_repeated_layer;
  if (moe_expert_capacity_factor) {
    if (!(*moe_expert_capacity_factor > 0.0))
      LATTICE_FAIL() << "--moe-expert-capacity-factor must be a finite number > 0, got " << *moe_expert_capacity_factor;
    c.moe_expert_capacity_factor = *moe_expert_capacity_factor;
  }
  c.moe_token_drop_policy = moe_token_drop_policy;
  c.normalization = normalization;
  c.position_embedding_type = position_embedding_type;
  c.rotary_percent = rotary_percent;
  c.rotary_base = rotary_base;
  c.rotary_interleaved = rotary_interleaved;
  c.rotary_seq_len_interpolation_factor = rotary_seq_len_interpolation_factor;
  c.use_rope_scaling = use_rope_scaling;
  c.rope_scaling_factor = rope_scaling_factor;
  c.rope_scaling_low_freq_factor = rope_scaling_low_freq_factor;
  c.rope_scaling_high_freq_factor = rope_scaling_high_freq_factor;
  c.rope_scaling_original_max_position_embeddings = rope_scaling_original_max_position_embeddings;
  c.yarn_rotary_scaling_factor = yarn_rotary_scaling_factor;
  c.yarn_original_max_position_embeddings = yarn_original_max_position_embeddings;
  c.yarn_beta_fast = yarn_beta_fast;
  c.yarn_beta_slow = yarn_beta_slow;
  c.yarn_mscale = yarn_mscale;
  c.yarn_mscale_all_dim = yarn_mscale_all_dim;
  c.longrope_short_factor = longrope_short_factor;
  c.longrope_long_factor = longrope_long_factor;
  c.longrope_original_max_position_embeddings = longrope_original_max_position_embeddings;
  c.longrope_attention_factor = longrope_attention_factor;
  c.yarn_correction_range_round_to_int = !no_yarn_correction_range_round_to_int;
  c.recompute_granularity = recompute_granularity;
  c.recompute_method = recompute_method;
  c.recompute_num_layers = recompute_num_layers;
  c.recompute_modules = recompute_modules;
  c.moe_layer_recompute = moe_layer_recompute;
  return c;
}

OptimizerConfig TrainArgs::optimizer_config(const TransformerConfig& model) const {
  OptimizerConfig o;
  o.optimizer = optimizer;
  o.adam_beta1 = adam_beta1;
  o.adam_beta2 = adam_beta2;
  o.adam_eps = adam_eps;
  o.sgd_momentum = sgd_momentum;
  o.clip_grad = clip_grad;
  o.exp_avg_bf16 = exp_avg_dtype == "bf16";
  o.exp_avg_sq_bf16 = exp_avg_sq_dtype == "bf16";
  MuonConfig& m = o.muon;
  m.momentum = muon_momentum;
  m.nesterov = muon_use_nesterov;
  m.ns_steps = muon_num_ns_steps;
  m.coefficient_type = muon_coefficient_type;
  m.scale_mode = muon_scale_mode;
  m.extra_scale_factor = muon_extra_scale_factor;
  m.tp_mode = muon_tp_mode;
  if (!muon_no_split_qkv) m.qkv_split_rows = model.qkv_group_rows();
  return o;
}

std::string TrainArgs::to_json() const {
  TrainArgs copy = *this;
  nlohmann::json j;
  for (const Flag& f : flag_table(copy)) {
    std::string key = f.name;
    switch (f.kind) {
      case Kind::i64: j[key] = *static_cast<int64_t*>(f.target); break;
      case Kind::u64: j[key] = *static_cast<uint64_t*>(f.target); break;
      case Kind::f32: j[key] = *static_cast<float*>(f.target); break;
      case Kind::f64: j[key] = *static_cast<double*>(f.target); break;
      case Kind::opt_f64: {
        auto& v = *static_cast<std::optional<double>*>(f.target);
        j[key] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
        break;
      }
      case Kind::str: j[key] = *static_cast<std::string*>(f.target); break;
      case Kind::flag: j[key] = *static_cast<bool*>(f.target); break;
      case Kind::list: j[key] = *static_cast<std::vector<std::string>*>(f.target); break;
      case Kind::f32_list: j[key] = *static_cast<std::vector<float>*>(f.target); break;
    }
  }
  return j.dump();
}

namespace {

// --use-checkpoint-args: the model's flags from the checkpoint's model_config (every checkpoint,
// a converted one too, has it) and the tokenizer's and sequence's from the arguments it recorded,
// as (flag, value) pairs; a switch appears only when on.
std::vector<std::pair<std::string, nlohmann::json>> checkpoint_flags(const CheckpointState& s) {
  using json = nlohmann::json;
  const json& m = s.model_config;
  std::vector<std::pair<std::string, json>> out;
  auto from_model = [&](const char* flag, const char* field) {
    if (m.contains(field) && !m[field].is_null()) out.emplace_back(flag, m[field]);
  };
  auto on = [&](const char* flag, bool value) {
    if (value) out.emplace_back(flag, true);
  };
  from_model("num-layers", "num_layers");
  from_model("hidden-size", "hidden_size");
  from_model("num-attention-heads", "num_attention_heads");
  from_model("ffn-hidden-size", "ffn_hidden_size");
  from_model("kv-channels", "kv_channels");
  from_model("max-position-embeddings", "max_position_embeddings");
  from_model("norm-epsilon", "layernorm_epsilon");
  on("openai-gelu", m.value("openai_gelu", false));
  on("squared-relu", m.value("squared_relu", false));
  on("apply-layernorm-1p", m.value("apply_layernorm_1p", false));
  on("untie-embeddings-and-output-weights", m.value("untie_embeddings_and_output_weights", false));
  from_model("position-embedding-type", "position_embedding_type");
  from_model("rotary-percent", "rotary_percent");
  from_model("rotary-base", "rotary_base");
  on("rotary-interleaved", m.value("rotary_interleaved", false));
  if (m.value("rotary_seq_len_interpolation_factor", 0.0) > 0.0)
    from_model("rotary-seq-len-interpolation-factor", "rotary_seq_len_interpolation_factor");
  on("disable-bias-linear", !m.value("add_bias_linear", true));
  on("add-qkv-bias", m.value("add_qkv_bias", false));
  on("qk-layernorm", m.value("qk_layernorm", false));
  if (m.value("multi_latent_attention", false)) {
    out.emplace_back("multi-latent-attention", true);
    from_model("q-lora-rank", "q_lora_rank");
    from_model("kv-lora-rank", "kv_lora_rank");
    from_model("qk-head-dim", "qk_head_dim");
    from_model("qk-pos-emb-head-dim", "qk_pos_emb_head_dim");
    from_model("v-head-dim", "v_head_dim");
    if (m.value("mla_latent_norm_epsilon", 0.0) > 0.0) from_model("mla-latent-norm-epsilon", "mla_latent_norm_epsilon");
  }
  on("qk-l2-norm", m.value("qk_l2_norm", false));
  on("attention-output-gate", m.value("attention_output_gate", false));
  if (m.value("mtp_num_layers", 0) > 0) from_model("mtp-num-layers", "mtp_num_layers");
  on("mtp-use-repeated-layer", m.value("mtp_use_repeated_layer", false));
  if (m.value("num_experts", 0) > 0) {
    from_model("num-experts", "num_experts");
    from_model("moe-router-topk", "moe_router_topk");
    from_model("moe-ffn-hidden-size", "moe_ffn_hidden_size");
    on("moe-router-pre-softmax", m.value("moe_router_pre_softmax", false));
    on("moe-apply-probs-on-input", m.value("moe_apply_probs_on_input", false));
    if (m.value("moe_shared_expert_intermediate_size", 0) > 0)
      from_model("moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size");
    on("moe-shared-expert-gate", m.value("moe_shared_expert_gate", false));
    if (m.value("moe_latent_size", 0) > 0) from_model("moe-latent-size", "moe_latent_size");
    if (m.value("moe_router_score_function", std::string("softmax")) != "softmax")
      from_model("moe-router-score-function", "moe_router_score_function");
    on("moe-router-enable-expert-bias", m.value("moe_router_enable_expert_bias", false));
    if (m.value("moe_router_num_groups", 0) > 0) {
      from_model("moe-router-num-groups", "moe_router_num_groups");
      from_model("moe-router-group-topk", "moe_router_group_topk");
    }
    if (m.contains("moe_layer_freq") && m["moe_layer_freq"].is_array() && !m["moe_layer_freq"].empty())
      out.emplace_back("moe-layer-freq", json(m["moe_layer_freq"].dump()));
    if (m.value("moe_router_topk_scaling_factor", 1.0) != 1.0)
      from_model("moe-router-topk-scaling-factor", "moe_router_topk_scaling_factor");
  }
  from_model("normalization", "normalization");
  on("swiglu", m.value("swiglu", false));
  on("quick-geglu", m.value("quick_geglu", false));
  if (m.value("glu_linear_offset", 0.0) != 0.0) from_model("glu-linear-offset", "glu_linear_offset");
  if (m.value("activation_func_clamp_value", 0.0) > 0.0)
    from_model("activation-func-clamp-value", "activation_func_clamp_value");
  if (m.value("softmax_type", std::string("vanilla")) != "vanilla") from_model("softmax-type", "softmax_type");
  if (m.value("window_size", int64_t(-1)) >= 0) {
    out.emplace_back("window-size", json(std::to_string(m["window_size"].get<int64_t>()) + ",0"));
    if (m.contains("window_attn_skip_freq") && m["window_attn_skip_freq"].is_array() &&
        !m["window_attn_skip_freq"].empty())
      out.emplace_back("window-attn-skip-freq", json(m["window_attn_skip_freq"].dump()));
  }
  if (m.contains("no_rope_freq") && m["no_rope_freq"].is_array() && !m["no_rope_freq"].empty())
    out.emplace_back("no-rope-freq", json(m["no_rope_freq"].dump()));
  if (!m.value("experimental_attention_variant", std::string()).empty()) {
    from_model("experimental-attention-variant", "experimental_attention_variant");
    out.emplace_back("linear-attention-freq", json(m["linear_attention_freq"].dump()));
    for (const char* f : {"linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                          "linear_num_key_heads", "linear_num_value_heads"}) {
      std::string flag = f;
      std::replace(flag.begin(), flag.end(), '_', '-');
      from_model(flag.c_str(), f);
    }
  }
  if (!m.value("hybrid_override_pattern", std::string()).empty()) {
    from_model("hybrid-override-pattern", "hybrid_override_pattern");
    for (const char* f : {"mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads"}) {
      std::string flag = f;
      std::replace(flag.begin(), flag.end(), '_', '-');
      from_model(flag.c_str(), f);
    }
  }
  if (m.contains("num_query_groups") && m["num_query_groups"].is_number_integer() &&
      m["num_query_groups"] != m.value("num_attention_heads", json())) {
    out.emplace_back("group-query-attention", true);
    from_model("num-query-groups", "num_query_groups");
  }
  if (m.value("position_embedding_type", std::string()) == "yarn") {
    from_model("yarn-rotary-scaling-factor", "yarn_rotary_scaling_factor");
    from_model("yarn-original-max-position-embeddings", "yarn_original_max_position_embeddings");
    from_model("yarn-beta-fast", "yarn_beta_fast");
    from_model("yarn-beta-slow", "yarn_beta_slow");
    from_model("yarn-mscale", "yarn_mscale");
    from_model("yarn-mscale-all-dim", "yarn_mscale_all_dim");
    on("no-yarn-correction-range-round-to-int", !m.value("yarn_correction_range_round_to_int", true));
  }
  if (m.contains("longrope_short_factor") && m["longrope_short_factor"].is_array() && !m["longrope_short_factor"].empty()) {
    from_model("longrope-short-factor", "longrope_short_factor");
    from_model("longrope-long-factor", "longrope_long_factor");
    from_model("longrope-original-max-position-embeddings", "longrope_original_max_position_embeddings");
    from_model("longrope-attention-factor", "longrope_attention_factor");
  }
  if (m.value("use_rope_scaling", false)) {
    out.emplace_back("use-rope-scaling", true);
    from_model("rope-scaling-factor", "rope_scaling_factor");
    from_model("rope-scaling-low-freq-factor", "rope_scaling_low_freq_factor");
    from_model("rope-scaling-high-freq-factor", "rope_scaling_high_freq_factor");
    from_model("rope-scaling-original-max-position-embeddings", "rope_scaling_original_max_position_embeddings");
  }
  for (const char* flag : {"seq-length", "make-vocab-size-divisible-by", "tokenizer-type", "vocab-file", "merge-file",
                           "tokenizer-model", "vocab-extra-ids", "vocab-size", "tiktoken-pattern",
                           "tiktoken-num-special-tokens", "tiktoken-special-tokens"}) {
    if (!s.args.contains(flag)) continue;
    const json& v = s.args[flag];
    const bool unset = v.is_null() || (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()) ||
                       (v.is_number() && v.get<double>() == 0);
    if (!unset) out.emplace_back(flag, v);
  }
  // Pre-tokenised data (or a converted model without a tokenizer): the model's vocabulary.
  const bool tokenizer = s.args.contains("tokenizer-type") && s.args["tokenizer-type"].is_string() &&
                         !s.args["tokenizer-type"].get<std::string>().empty();
  const bool vocab = std::any_of(out.begin(), out.end(), [](const auto& f) { return f.first == "vocab-size"; });
  if (!tokenizer && !vocab) from_model("vocab-size", "vocab_size");
  return out;
}

// Sets each flag the command line did not give to the checkpoint's value.
void apply_checkpoint_args(TrainArgs& a, const std::vector<Flag>& table, const std::set<std::string>& given) {
  if (a.load.empty()) LATTICE_FAIL() << "--use-checkpoint-args needs --load (the checkpoint whose flags to take)";
  std::vector<std::pair<std::string, nlohmann::json>> flags;
  const std::string dir = a.ckpt_step >= 0 ? checkpoint_at_iteration(a.load, a.ckpt_step, "--ckpt-step") : a.load;
  try {
    const CheckpointState s = CheckpointReader::open(dir).state();
    flags = checkpoint_flags(s);
    // --use-mp-args-from-checkpoint-args (Megatron's): the parallel layout the checkpoint was saved with too.
    if (a.use_mp_args_from_checkpoint_args)
      for (const char* flag : {"tensor-model-parallel-size", "pipeline-model-parallel-size",
                               "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank"})
        if (s.args.contains(flag) && !s.args[flag].is_null()) flags.emplace_back(flag, s.args[flag]);
  } catch (const Error& e) {
    LATTICE_FAIL() << "--use-checkpoint-args: --load " << e.what();
  }
  for (const auto& [name, v] : flags) {
    if (given.count(name)) continue;  // the command line's own value (the load checks it against the model)
    if (name == "tokenizer-model" && a.no_use_tokenizer_model_from_checkpoint_args) continue;
    const Flag* flag = nullptr;
    for (const Flag& f : table)
      if (name == f.name) flag = &f;
    LATTICE_CHECK(flag) << "no flag --" << name;
    try {
      switch (flag->kind) {
        case Kind::i64: *static_cast<int64_t*>(flag->target) = v.get<int64_t>(); break;
        case Kind::u64: *static_cast<uint64_t*>(flag->target) = v.get<uint64_t>(); break;
        case Kind::f32: *static_cast<float*>(flag->target) = v.get<float>(); break;
        case Kind::f64: *static_cast<double*>(flag->target) = v.get<double>(); break;
        case Kind::opt_f64: *static_cast<std::optional<double>*>(flag->target) = v.get<double>(); break;
        case Kind::str: *static_cast<std::string*>(flag->target) = v.get<std::string>(); break;
        case Kind::flag: *static_cast<bool*>(flag->target) = v.get<bool>(); break;
        case Kind::list: *static_cast<std::vector<std::string>*>(flag->target) = v.get<std::vector<std::string>>(); break;
        case Kind::f32_list: *static_cast<std::vector<float>*>(flag->target) = v.get<std::vector<float>>(); break;
      }
    } catch (const nlohmann::json::exception&) {
      LATTICE_FAIL() << "--use-checkpoint-args: --load " << a.load << " records --" << name << " as " << v.dump()
                     << ", which is not a valid value";
    }
  }
}

}  // namespace

TrainArgs parse_train_args(int argc, char** argv, int first) {
  TrainArgs a;
  std::vector<Flag> table = flag_table(a);
  std::map<std::string, std::string> spelled;  // the flags given (the table's names), as spelled on the command line
  for (int i = first; i < argc; ++i) {
    std::string tok = argv[i];
    if (!is_flag_token(tok)) LATTICE_FAIL() << "unexpected argument '" << tok << "' (flags start with --)";
    std::string name = tok.substr(2);
    std::string inline_value;
    bool has_inline = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline = true;
    }
    if (const char* removed = removed_flag_error(name)) LATTICE_FAIL() << removed;
    const std::string given = name;  // the spelling on the command line, for its errors
    if (const auto alias = flag_aliases().find(name); alias != flag_aliases().end()) name = alias->second;
    const Flag* flag = nullptr;
    for (const Flag& f : table)
      if (name == f.name) flag = &f;
    if (!flag && megatron_flag_not_taken(name))
      LATTICE_FAIL() << "--" << name << ": " << megatron_flag_not_taken(name);
    if (!flag) LATTICE_FAIL() << "unknown flag --" << name << " (see lattice train --help)";
    if (const auto [it, fresh] = spelled.emplace(name, given); !fresh)
      LATTICE_FAIL() << (it->second == given ? "--" + given + " given twice"
                                             : "--" + it->second + " and --" + given + " are one flag: give it once");
    if (flag->kind == Kind::flag) {
      if (has_inline) LATTICE_FAIL() << "--" << given << " takes no value";
      *static_cast<bool*>(flag->target) = true;
      continue;
    }
    std::vector<std::string> values;
    if (has_inline) values.push_back(inline_value);
    while (i + 1 < argc && !is_flag_token(argv[i + 1]) &&
           (values.empty() || flag->kind == Kind::list || flag->kind == Kind::f32_list))
      values.push_back(argv[++i]);
    if (values.empty()) LATTICE_FAIL() << "--" << given << " needs a value";
    const std::string& v = values[0];
    switch (flag->kind) {
      case Kind::i64: *static_cast<int64_t*>(flag->target) = parse_number<int64_t>(given, v); break;
      case Kind::u64: *static_cast<uint64_t*>(flag->target) = parse_number<uint64_t>(given, v); break;
      case Kind::f32: *static_cast<float*>(flag->target) = parse_number<float>(given, v); break;
      case Kind::f64: *static_cast<double*>(flag->target) = parse_number<double>(given, v); break;
      case Kind::opt_f64:
        *static_cast<std::optional<double>*>(flag->target) = parse_number<double>(given, v);
        break;
      case Kind::str: *static_cast<std::string*>(flag->target) = v; break;
      case Kind::list: *static_cast<std::vector<std::string>*>(flag->target) = values; break;
      case Kind::f32_list: {
        auto& out = *static_cast<std::vector<float>*>(flag->target);
        out.clear();
        for (const std::string& value : values) out.push_back(parse_number<float>(given, value));
        break;
      }
      case Kind::flag: break;
    }
  }
  if (a.use_checkpoint_args) {
    std::set<std::string> given;
    for (const auto& [name, spelling] : spelled) given.insert(name);
    apply_checkpoint_args(a, table, given);
  }
  validate(a);
  return a;
}

std::string train_help() {
  TrainArgs a;
  std::ostringstream os;
  os << "usage: lattice train [flags]\n\nFlags (Megatron-LM names; default in brackets):\n";
  for (const Flag& f : flag_table(a)) {
    std::string left = std::string("  --") + f.name;
    if (f.kind != Kind::flag) left += f.kind == Kind::list || f.kind == Kind::f32_list ? " V [V ...]" : " V";
    os << left;
    for (size_t pad = left.size(); pad < 46; ++pad) os << ' ';
    os << f.help << " [" << default_text(f) << "]\n";
  }
  return os.str();
}

namespace {
// The layers of each stage and chunk, from the layout flags.
PipelineLayout pipeline_layout_without_group(const TrainArgs& a) {
  const int P = int(a.pipeline_model_parallel_size);
  const int64_t V = a.num_virtual_stages_per_pipeline_rank;
  if (V < 0) LATTICE_FAIL() << "--num-virtual-stages-per-pipeline-rank must be >= 1, got " << V;
  if (int(a.num_layers_per_virtual_pipeline_stage > 0) + int(V > 0) + int(!a.pipeline_model_parallel_layout.empty()) > 1)
    LATTICE_FAIL() << "no more than one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank "
                      "and --pipeline-model-parallel-layout can be given";
  if (!a.pipeline_model_parallel_layout.empty()) {
    for (const auto& [set, flag] : {std::pair{a.decoder_first_pipeline_num_layers > 0, "--decoder-first-pipeline-num-layers"},
                                    std::pair{a.decoder_last_pipeline_num_layers > 0, "--decoder-last-pipeline-num-layers"},
                                    std::pair{a.account_for_embedding_in_pipeline_split, "--account-for-embedding-in-pipeline-split"},
                                    std::pair{a.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split"}})
      if (set) LATTICE_FAIL() << "--pipeline-model-parallel-layout cannot be combined with " << flag;
    return parse_pipeline_layout(a.pipeline_model_parallel_layout, a.num_layers, P, a.mtp_num_layers);
  }
  int64_t per_virtual = a.num_layers_per_virtual_pipeline_stage;
  if (V > 1) {  // V chunks per stage: the layers per chunk they give
    if (P < 2) LATTICE_FAIL() << "--num-virtual-stages-per-pipeline-rank " << V << " needs --pipeline-model-parallel-size > 1";
    if (a.decoder_first_pipeline_num_layers > 0 || a.decoder_last_pipeline_num_layers > 0)
      LATTICE_FAIL() << "--num-virtual-stages-per-pipeline-rank with --decoder-first/last-pipeline-num-layers is not "
                        "implemented: give the stages with --pipeline-model-parallel-layout";
    const int64_t split = a.num_layers + int64_t(a.account_for_embedding_in_pipeline_split) +
                          int64_t(a.account_for_loss_in_pipeline_split);
    if (split % (int64_t(P) * V) != 0)
      LATTICE_FAIL() << "--num-layers " << a.num_layers
                     << (split != a.num_layers ? " (with the embedding or loss counted in the split: " +
                                                     std::to_string(split) + ")"
                                               : std::string())
                     << " is not divisible by --pipeline-model-parallel-size " << P
                     << " x --num-virtual-stages-per-pipeline-rank " << V;
    per_virtual = split / (int64_t(P) * V);
  }
  return make_pipeline_layout(a.num_layers, P, per_virtual, a.decoder_first_pipeline_num_layers,
                              a.decoder_last_pipeline_num_layers, a.account_for_embedding_in_pipeline_split,
                              a.account_for_loss_in_pipeline_split);
}

}  // namespace

PipelineLayout pipeline_layout_of(const TrainArgs& a) {
  PipelineLayout l = pipeline_layout_without_group(a);
  const int64_t N = a.microbatch_group_size_per_virtual_pipeline_stage;
  if (N < 0) LATTICE_FAIL() << "--microbatch-group-size-per-virtual-pipeline-stage must be >= 1, got " << N;
  l.microbatch_group_size = N;
  return l;
}

}  // namespace lattice
