// Command-line arguments of `lattice train`, with Megatron-LM's flag names and
// defaults. parse_train_args validates each flag and their combinations; every error
// is one line naming the flag.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/transformer_config.h"
#include "optim/optimizer.h"
#include "pipeline/schedule.h"
#include "train/batch_size_rampup.h"

namespace lattice {

struct TrainArgs {
  // model
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0;
  int64_t ffn_hidden_size = 0, kv_channels = 0;
  int64_t seq_length = 0, max_position_embeddings = 0;
  int64_t make_vocab_size_divisible_by = 128;
  float hidden_dropout = 0.1f, attention_dropout = 0.1f;
  float init_method_std = 0.02f, norm_epsilon = 1e-5f;
  bool init_method_xavier_uniform = false;
  std::optional<double> embedding_init_method_std;  // the embeddings' N(0, s^2) (unset: as every weight)
  bool openai_gelu = false;
  bool squared_relu = false;  // the MLP's activation relu(x)^2 (Megatron's --squared-relu)
  bool apply_layernorm_1p = false;  // the norms scale by 1 + weight (Megatron's --apply-layernorm-1p)
  bool swiglu = false;
  bool quick_geglu = false;              // the gated unit with quick GELU (Megatron's --quick-geglu)
  float glu_linear_offset = 0.0f;        // --glu-linear-offset
  float activation_func_clamp_value = 0.0f;  // --activation-func-clamp-value (0: none)
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
  bool qk_l2_norm = false;  // --qk-l2-norm
  bool attention_output_gate = false;  // --attention-output-gate
  int64_t num_experts = 0;
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;
  std::vector<float> moe_aux_loss_coeff = {0.0f};  // one per load-balancing type (or one for all)
  float moe_z_loss_coeff = 0.0f;
  float moe_input_jitter_eps = 0.0f;
  bool moe_router_force_load_balancing = false;
  bool multi_latent_attention = false;     // --multi-latent-attention and its shapes (TransformerConfig's)
  int64_t q_lora_rank = 0, kv_lora_rank = 32, qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  float mla_latent_norm_epsilon = 0.0f;
  int64_t mtp_num_layers = 0;              // --mtp-num-layers
  float mtp_loss_scaling_factor = 0.1f;    // --mtp-loss-scaling-factor
  bool mtp_use_repeated_layer = false;     // --mtp-use-repeated-layer
  bool moe_per_layer_logging = false;
  bool moe_router_pre_softmax = false;
  bool moe_apply_probs_on_input = false;  // --moe-apply-probs-on-input
  std::string moe_layer_freq = "1";
  std::string window_size;            // --window-size W[,0] ("": none)
  std::string window_attn_skip_freq;  // --window-attn-skip-freq N or a list ("": every layer)
  std::string no_rope_freq;           // --no-rope-freq N or a list ("": every layer rotates)
  std::string experimental_attention_variant;  // --experimental-attention-variant ("" or gated_delta_net)
  std::string linear_attention_freq;  // --linear-attention-freq N or a list ("": every layer, with the variant)
  int64_t linear_conv_kernel_dim = 4, linear_key_head_dim = 128, linear_value_head_dim = 128;
  std::string hybrid_override_pattern;  // --hybrid-override-pattern (M Mamba, * attention, - MLP, E MoE per layer)
  // --hybrid-attention-ratio, --hybrid-mlp-ratio and --is-hybrid-model: the pattern by Megatron's allocation
  // (model/hybrid_layer_allocation.h); every layer Mamba with both ratios 0.
  double hybrid_attention_ratio = 0.0, hybrid_mlp_ratio = 0.0;
  bool is_hybrid_model = false;
  int64_t mamba_state_dim = 128, mamba_head_dim = 64, mamba_num_groups = 8, mamba_num_heads = 0;
  int64_t linear_num_key_heads = 16, linear_num_value_heads = 32;
  std::string softmax_type = "vanilla";
  std::string moe_router_score_function = "softmax";
  std::string moe_router_dtype;
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  std::optional<double> moe_expert_capacity_factor;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_router_enable_expert_bias = false;
  float moe_router_bias_update_rate = 1e-3f;
  int64_t moe_shared_expert_intermediate_size = 0;
  int64_t moe_latent_size = 0;  // --moe-latent-size (0: none)
  bool moe_shared_expert_gate = false;
  float moe_router_topk_scaling_factor = 1.0f;
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  bool moe_load_balancing(const std::string& type) const;  // the type is listed
  // The micro-batch's load-balancing loss is logged unless only seq_aux_loss or global_aux_loss are listed.
  bool logs_micro_batch_balance() const {
    return moe_load_balancing("aux_loss") || !(moe_load_balancing("seq_aux_loss") || moe_load_balancing("global_aux_loss"));
  }
  // Non-persistent checkpoints are in use (an interval, their kind or their directory given).
  bool non_persistent() const {
    return non_persistent_save_interval > 0 || !non_persistent_ckpt_type.empty() || !non_persistent_global_ckpt_dir.empty();
  }
  bool use_checkpoint_args = false;  // --use-checkpoint-args: unspecified model flags from --load
  bool skip_train = false;           // --skip-train: evaluate the loaded model only
  std::string normalization = "LayerNorm";
  std::string position_embedding_type = "learned_absolute";
  double rotary_percent = 1.0;
  float rotary_base = 10000.0f, rotary_seq_len_interpolation_factor = 0.0f;
  bool rotary_interleaved = false;
  bool use_rope_scaling = false;
  // --position-embedding-type yarn: YaRN's fields (Megatron-Core's yarn_* names)
  float yarn_rotary_scaling_factor = 1.0f;
  int64_t yarn_original_max_position_embeddings = 4096;
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f, yarn_mscale = 1.0f, yarn_mscale_all_dim = 0.0f;
  std::vector<float> longrope_short_factor, longrope_long_factor;
  int64_t longrope_original_max_position_embeddings = 4096;
  float longrope_attention_factor = 1.0f;
  bool no_yarn_correction_range_round_to_int = false;
  float rope_scaling_factor = 8.0f, rope_scaling_low_freq_factor = 1.0f, rope_scaling_high_freq_factor = 4.0f;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  // batch and iterations
  int64_t micro_batch_size = 0, global_batch_size = 0, train_iters = 0;
  int64_t log_interval = 100;
  uint64_t seed = 1234;
  // optimizer
  std::string optimizer = "adam";
  // --optimizer muon (optim/muon.h)
  float muon_momentum = 0.9f;
  bool muon_use_nesterov = false;
  int64_t muon_num_ns_steps = 5;
  std::string muon_scale_mode = "spectral";
  float muon_extra_scale_factor = 1.0f;
  bool muon_split_qkv = true, muon_no_split_qkv = false;
  std::string muon_tp_mode = "blockwise";
  std::string muon_fp32_matmul_prec = "medium";
  std::string muon_coefficient_type = "quintic";
  std::string muon_scalar_optimizer = "adam";
  // Megatron's precision-aware optimizer: Adam's moments in bf16 (optim/optimizer.h).
  bool use_precision_aware_optimizer = false;
  std::string exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32", main_grads_dtype = "fp32", main_params_dtype = "fp32";
  double lr = 0, min_lr = 0;
  double weight_decay = 0.01;
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f, sgd_momentum = 0.9f;
  float clip_grad = 1.0f;
  // parallel layout (more than 1 arrives with the distributed issues)
  int64_t tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;  // the experts split over this many data-parallel ranks
  int64_t context_parallel_size = 1;       // every sequence split over this many ranks (model/context_parallel.h)
  std::string cp_comm_type = "p2p";        // Megatron's --cp-comm-type; lattice all-gathers the keys and values
  bool sequence_parallel = false;
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  int64_t num_virtual_stages_per_pipeline_rank = 0;    // V directly (0: unset)
  int64_t microbatch_group_size_per_virtual_pipeline_stage = 0;  // interleaved: N micro-batches per chunk turn (0: P)
  std::string pipeline_model_parallel_layout;          // Megatron's layout string (schedule.h); "": unset
  int64_t decoder_first_pipeline_num_layers = 0, decoder_last_pipeline_num_layers = 0;  // 0: even split
  bool account_for_embedding_in_pipeline_split = false;  // the embedding counts as a layer in the split
  bool account_for_loss_in_pipeline_split = false;       // the loss counts as a layer in the split
  bool dry_run = false;
  // Mixed precision (Megatron's flags and defaults).
  bool bf16 = false, fp16 = false, grad_reduce_in_bf16 = false;
  double loss_scale = 0;                 // 0: dynamic
  double initial_loss_scale = 4294967296.0, min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000, hysteresis = 2;
  std::string fp8_format;                // "" | e4m3 | hybrid
  int64_t fp8_margin = 0, fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
  std::string fp8_recipe = "delayed";    // Megatron's --fp8-recipe: delayed | tensorwise | blockwise | mxfp8
  // Megatron's --first-last-layers-bf16 (with --num-layers-at-start/end-in-bf16): the first and last layers
  // outside fp8. Megatron refuses it with the delayed recipe, lattice's only one; without fp8 it does nothing.
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1, num_layers_at_end_in_bf16 = 1;
  // Activation recomputation.
  std::string recompute_granularity;     // "" | full | selective
  bool recompute_activations = false;    // Megatron's shortcut for --recompute-granularity selective
  std::string recompute_method;          // "" | uniform | block
  int64_t recompute_num_layers = 0;
  std::vector<std::string> recompute_modules;  // selective: core_attn | moe (empty: core_attn)
  bool moe_layer_recompute = false;
  bool log_memory = false;
  // data
  bool mock_data = false;
  // --sft: Megatron's supervised fine-tuning data, --data-path a JSONL file of conversations
  // (data/sft_dataset.h) through the chat template (--chat-template, else the tokenizer folder's).
  bool sft = false;
  std::string chat_template;
  std::vector<std::string> data_path;
  // Megatron's --data-args-path (a text file holding --data-path's words) and --per-split-data-args-path
  // (JSON: "train", "valid", "test", each a list or a whitespace-separated string); read into the
  // data paths when the flags are checked.
  std::string data_args_path, per_split_data_args_path;
  double mid_level_dataset_surplus = 0.005;  // Megatron's: the extra samples each blended dataset is built for
  int64_t vocab_size = 0;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;
  int64_t vocab_extra_ids = 0;  // --vocab-extra-ids (SentencePieceTokenizer)
  std::string tiktoken_pattern;  // TikTokenizer's flags (data/tokenizer.h's TokenizerSpec)
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> tiktoken_special_tokens;
  // The tokenizer --tokenizer-type names, built once when parse_train_args validates the flags
  // (a Llama 3 tokenizer.json takes ~1 s to load); null without a tokenizer or before validation.
  std::shared_ptr<const Tokenizer> tokenizer;
  // `tokenizer`, or one built from the flags when it is null.
  std::shared_ptr<const Tokenizer> get_tokenizer() const {
    return tokenizer ? tokenizer : std::shared_ptr<const Tokenizer>(make_tokenizer(tokenizer_spec()));
  }
  // data (Megatron's GPTDataset, blending, evaluation, document boundaries)
  std::string split = "969,30,1";
  std::string data_cache_path;
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  bool multiple_validation_sets = false;  // each --valid-data-path dataset evaluated on its own
  bool full_validation = false;           // each evaluation reads the whole validation split (one epoch)
  int64_t eval_interval = 1000, eval_iters = 100;
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  bool calculate_per_token_loss = false;
  // learning-rate and weight-decay schedule (OptimizerParamScheduler)
  std::string lr_decay_style = "linear";
  int64_t lr_decay_iters = 0, lr_decay_samples = 0;       // 0: unset
  int64_t lr_warmup_iters = 0, lr_warmup_samples = 0;
  double lr_warmup_fraction = 0;                           // 0: unset
  double lr_warmup_init = 0;
  std::string lr_wsd_decay_style = "exponential";
  int64_t lr_wsd_decay_iters = 0, lr_wsd_decay_samples = 0;
  int64_t train_samples = 0;                               // alternative to --train-iters
  std::vector<std::string> rampup_batch_size;  // START INCREMENT SAMPLES (train/batch_size_rampup.h)
  std::optional<double> start_weight_decay, end_weight_decay;
  std::string weight_decay_incr_style = "constant";
  std::optional<double> decoupled_lr, decoupled_min_lr;
  // checkpointing
  std::string load;
  int64_t save_interval = 0;                               // 0: save only at the end
  int64_t non_persistent_save_interval = 0;                // 0: none
  bool log_progress = false;                               // --log-progress: --save/progress.txt
  std::string non_persistent_ckpt_type;                    // "" or global
  std::string non_persistent_global_ckpt_dir;              // "": --save/non_persistent
  bool no_save_optim = false, no_save_rng = false, no_load_optim = false, no_load_rng = false;
  bool finetune = false;
  int64_t ckpt_step = -1;             // --ckpt-step (-1: the tracker's iteration)
  std::string pretrained_checkpoint;  // --pretrained-checkpoint
  bool override_opt_param_scheduler = false, use_checkpoint_opt_param_scheduler = false;
  int64_t keep_last_n = 0;                                 // 0: keep all
  int64_t save_retain_interval = 0;  // Megatron's: a save removes the previous checkpoint unless a multiple (0: none)
  bool exit_signal_handler = false;
  int64_t exit_interval = 0;
  double exit_duration_in_mins = 0;
  // distributed (data parallelism, distributed optimizer)
  double distributed_timeout_minutes = 10;
  bool use_distributed_optimizer = false, overlap_grad_reduce = false, overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;                             // 0: automatic
  int64_t ddp_num_buckets = 0;  // Megatron's: buckets of (this rank's parameters) / this elements (0: unset)
  int64_t num_distributed_optimizer_instances = 1;         // the distributed optimizer's copies over dp x cp
  bool use_tp_pp_dp_mapping = false;  // rank order tp-pp-dp instead of tp-cp-ep-dp-pp (dist/parallel_state.h)
  int64_t zero_stage = 1;
  bool log_comm = false;
  // device: cpu, or cuda (one GPU per process; docs/cuda.md)
  std::string device = "cpu";
  // output
  std::string save, metrics_file;
  // TensorBoard (train/tensorboard_log.h): Megatron's scalars every --tensorboard-log-interval
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1, tensorboard_queue_size = 1000;
  bool log_validation_ppl_to_tensorboard = false, log_timers_to_tensorboard = false;
  bool no_log_loss_scale_to_tensorboard = false, log_world_size_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  double peak_tflops = 0;   // 0: measure with a GEMM calibration
  int64_t num_threads = 0;  // 0: OMP_NUM_THREADS, else all cores
  bool log_throughput = false;
  bool log_params_norm = false, log_num_zeros_in_grad = false;
  int64_t check_weight_hash_across_dp_replicas_interval = 0;  // 0: never (train/weight_hash.h)
  bool no_check_for_nan_in_loss_and_grad = false;  // Megatron's: train on through a nan/inf loss or grad norm
  // Megatron's result checks (train/result_validation.h): a rejected step stops training before its update.
  bool check_for_spiky_loss = false, check_for_large_grads = false;
  std::string result_rejected_tracker_filename;  // rejections appended; iterations rejected twice are skipped
  // Megatron's --iterations-to-skip: 0-based step indices (the iteration logged as N is index N - 1) whose
  // samples are consumed without a step; iterations_to_skip_list() has them with the tracker file's.
  std::vector<std::string> iterations_to_skip;
  std::vector<int64_t> iterations_to_skip_list() const;
  int64_t error_injection_rate = 0;                  // Megatron's; injects nothing with --rerun-mode disabled
  std::string error_injection_type = "transient_error";
  std::string attention_backend = "auto";  // accepted: lattice's attention is its own flash kernel
  // Megatron flags that choose between implementations lattice does not have (fused kernels or
  // not, Transformer Engine or local layers, data-loader processes, timers): accepted so that
  // Megatron's command lines run, and they change nothing (docs/megatron-differences.md).
  struct MegatronImplementationFlags {
    bool use_mcore_models = false, use_flash_attn = false, attention_softmax_in_fp32 = false;
    bool no_masked_softmax_fusion = false, no_bias_gelu_fusion = false, no_bias_dropout_fusion = false;
    bool no_bias_swiglu_fusion = false, no_rope_fusion = false, no_gradient_accumulation_fusion = false;
    bool no_async_tensor_model_parallel_allreduce = false, overlap_p2p_communication = false, manual_gc = false;
    bool accumulate_allreduce_grads_in_fp32 = false, cross_entropy_loss_fusion = false, no_persist_layer_norm = false;
    bool use_cpu_initialization = false, no_create_attention_mask_in_dataloader = false, mmap_bin_files = false;
    bool no_mmap_bin_files = false, deterministic_mode = false, apply_query_key_layer_scaling = false;
    bool no_query_key_layer_scaling = false, async_save = false;
    bool moe_grouped_gemm = false, moe_permute_fusion = false, moe_shared_expert_overlap = false;
    bool moe_router_fusion = false, moe_use_legacy_grouped_gemm = false, tp_comm_overlap = false;
    bool overlap_moe_expert_parallel_comm = false, delay_wgrad_compute = false;
    bool ddp_average_in_collective = false;  // the same average as lattice's 1/(micro-batches x DP) loss scaling
    bool data_parallel_random_init = false, no_align_grad_reduce = false, no_align_param_gather = false;
    bool ddp_pad_buckets_for_high_nccl_busbw = false;
    bool te_rng_tracker = false, inference_rng_tracker = false, enable_cuda_graph = false, external_cuda_graph = false;
    std::vector<std::string> cuda_graph_scope;
    std::string transformer_impl = "transformer_engine", distributed_backend = "nccl";
    std::string ckpt_format = "torch_dist";  // Megatron's default; lattice's format plays its part
    std::string rerun_mode = "disabled";     // Megatron's --rerun-mode: only disabled
    bool ckpt_fully_parallel_save = false, no_ckpt_fully_parallel_save = false, ckpt_fully_parallel_load = false;
    bool ckpt_assume_constant_structure = false;
    std::string moe_token_dispatcher_type = "allgather";  // Megatron's default; lattice dispatches by all-to-all
    int64_t expert_tensor_parallel_size = 0;               // 0: Megatron's default, the tensor-parallel size
    int64_t num_workers = 2, timing_log_level = 0, num_dataset_builder_threads = 1, empty_unused_memory_level = 0;
    std::string dataloader_type = "single";  // Megatron's default sampler: the dataset's samples in order
    // Python's garbage collector, torch launchers, deprecated checkpoint and fp8 spellings, fusions and
    // communication scheduling (the same values either way).
    int64_t manual_gc_interval = 0, local_rank = 0, fp8_interval = 1, train_sync_interval = 0, wgrad_deferral_limit = 0;
    int64_t logging_level = 0;
    bool no_manual_gc_eval = false, use_dist_ckpt = false, no_initialization = false, fp32_residual_connection = false;
    bool disable_bf16_reduced_precision_matmul = false, no_clone_scatter_output_in_embedding = false;
    bool disable_gloo_process_groups = false, no_overlap_p2p_communication = false;
    bool overlap_p2p_communication_warmup_flush = false, no_scatter_gather_tensors_in_pipeline = false;
    bool defer_embedding_wgrad_compute = false, no_gradient_reduce_div_fusion = false;
    bool no_barrier_with_level_1_timing = false, use_te_activation_func = false;
    bool disable_tp_comm_bulk_dgrad = false, disable_tp_comm_bulk_wgrad = false, disable_tp_comm_overlap_ag = false;
    bool disable_tp_comm_overlap_rs = false, disable_tp_comm_split_ag = false, disable_tp_comm_split_rs = false;
    bool tp_comm_overlap_rs_dgrad = false;
    std::string dist_ckpt_format, cross_entropy_fusion_impl = "native", timing_log_option = "minmax";
    std::string tp_comm_bootstrap_backend = "nccl";
    // Checkpoint loading and tokenizers: lattice's load checks every tensor; its tokenizers are Megatron's
    // legacy ones and run no code; --distribute-saved-activations shards recomputation inputs (memory only).
    std::string dist_ckpt_strictness = "assume_ok_unexpected";
    bool legacy_tokenizer = false, trust_remote_code = false, distribute_saved_activations = false;
    std::vector<std::string> hierarchical_context_parallel_sizes;  // with --cp-comm-type a2a+p2p: their product is CP
  } implementation;
  // Megatron's MoE upcycling (checkpoint/moe_upcycling.h): the --num-experts model's weights from --load's dense
  // checkpoint, saved to --save before the first step; granularity = --ffn-hidden-size / --moe-ffn-hidden-size.
  bool moe_use_upcycling = false;
  bool no_fp8_wgrad = false;  // Megatron's: the weight-gradient GEMMs of an fp8 run unquantized
  int64_t moe_upcycling_granularity = 1;
  // Megatron's: with --use-checkpoint-args, --tokenizer-model is not taken from the checkpoint.
  bool no_use_tokenizer_model_from_checkpoint_args = false;
  bool use_mp_args_from_checkpoint_args = false;  // with --use-checkpoint-args: the saved TP/PP sizes too
  bool use_rotary_position_embeddings = false;  // Megatron's older spelling of --position-embedding-type rope
  // Megatron's multi-latent attention spellings of the rotary options: --rope-type rope|yarn (the position
  // embedding type), --rotary-scaling-factor, --mscale, --mscale-all-dim (the --yarn-* values); unset: none given.
  std::string rope_type;
  std::optional<double> rotary_scaling_factor, mscale, mscale_all_dim;
  bool no_position_embedding = false;           // no learned position table: with rope, as rope is
  bool exit_on_missing_checkpoint = false;      // --load without a checkpoint is an error
  bool profile_ops = false;  // per-op time table at the end (train/op_profile_report.h)
  // Megatron's --profile window: the op table of the steps that start with profile_step_start to
  // profile_step_end - 1 iterations done (iterations start + 1 to end), on each rank of --profile-ranks.
  bool profile = false, use_pytorch_profiler = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<std::string> profile_ranks = {"0"};
  std::vector<int> profile_rank_list() const;  // --profile-ranks as numbers (checked by parse_train_args)

  int64_t num_micro_batches() const { return global_batch_size / micro_batch_size; }
  // --rampup-batch-size's ramp, if given.
  std::optional<BatchSizeRampup> rampup() const;
  // The global batch size of the iteration that starts after `consumed` samples, and the
  // samples consumed by the first `iterations` iterations (iterations x global without a ramp).
  int64_t batch_size_at(int64_t consumed) const;
  int64_t consumed_after(int64_t iterations) const;
  TransformerConfig transformer_config() const;
  TokenizerSpec tokenizer_spec() const {
    return {tokenizer_type,   vocab_file, merge_file, tokenizer_model, vocab_size, vocab_extra_ids, tiktoken_pattern,
            tiktoken_num_special_tokens, tiktoken_special_tokens};
  }
  // Elements per gradient bucket for a rank holding local_parameters: --ddp-num-buckets' share
  // (Megatron's num_parameters // n), else --ddp-bucket-size (0: the default).
  int64_t ddp_bucket_elements(int64_t local_parameters) const {
    return ddp_num_buckets > 0 ? std::max<int64_t>(1, local_parameters / ddp_num_buckets) : ddp_bucket_size;
  }
  // `model`: the finalized model configuration (--muon-split-qkv's pieces).
  OptimizerConfig optimizer_config(const TransformerConfig& model) const;
  // The arguments as `--flag value` pairs (for checkpoints and `generate`).
  std::string to_json() const;
};

// Parses argv[first..argc) (after `lattice train`). Throws lattice::Error on unknown
// flags, missing or malformed values and invalid combinations.
TrainArgs parse_train_args(int argc, char** argv, int first);

// The pipeline layout the flags give (--pipeline-model-parallel-layout, --num-virtual-stages-per-pipeline-rank,
// --num-layers-per-virtual-pipeline-stage, the uneven and account-for splits), or a one-line error.
PipelineLayout pipeline_layout_of(const TrainArgs& args);

// `lattice train --help` text: every flag with its default.
std::string train_help();

}  // namespace lattice
