#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "blas/gemm.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/durable_fs.h"
#include "checkpoint/moe_upcycling.h"
#include "checkpoint/training_checkpoint.h"
#include "core/device.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/gpt_batches.h"
#include "dist/parallel_state.h"
#include "data/tokenizer.h"
#include "data/training_data.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_runner.h"
#include "train/evaluation.h"
#include "train/exit_signal.h"
#include "train/data_parallel.h"
#include "train/distributed_setup.h"
#include "train/flops.h"
#include "train/log_line.h"
#include "train/lr_schedule.h"
#include "train/precision_setup.h"
#include "train/memory_estimate.h"
#include "train/op_profile_report.h"
#include "train/progress_log.h"
#include "train/result_validation.h"
#include "train/resume_point.h"
#include "train/tensorboard_log.h"
#include "train/train_step.h"
#include "train/weight_hash.h"

namespace lattice {

namespace {

// The checkpoint flags' own checks (before any compute).
void check_checkpoint_flags(const TrainArgs& a) {
  auto non_negative = [](const char* flag, double v) {
    if (v < 0) LATTICE_FAIL() << "--" << flag << " must be >= 0, got " << v;
  };
  non_negative("save-interval", double(a.save_interval));
  non_negative("keep-last-n", double(a.keep_last_n));
  non_negative("exit-interval", double(a.exit_interval));
  non_negative("check-weight-hash-across-dp-replicas-interval", double(a.check_weight_hash_across_dp_replicas_interval));
  non_negative("exit-duration-in-mins", a.exit_duration_in_mins);
  if (a.save.empty() && (a.save_interval > 0 || a.keep_last_n > 0 || a.no_save_optim || a.no_save_rng || a.log_progress ||
                         a.save_retain_interval > 0))
    LATTICE_FAIL() << "--save-interval, --keep-last-n, --save-retain-interval, --no-save-optim, --no-save-rng and "
                      "--log-progress need --save DIR";
  non_negative("save-retain-interval", double(a.save_retain_interval));
  if (a.save_retain_interval > 0 && (a.save_interval <= 0 || a.save_retain_interval % a.save_interval != 0))
    LATTICE_FAIL() << "--save-retain-interval " << a.save_retain_interval << " must be a multiple of --save-interval"
                   << (a.save_interval > 0 ? " " + std::to_string(a.save_interval) : std::string(" (not given)"));
  non_negative("non-persistent-save-interval", double(a.non_persistent_save_interval));
  if (!a.non_persistent_ckpt_type.empty() && a.non_persistent_ckpt_type != "global")
    LATTICE_FAIL() << "--non-persistent-ckpt-type " << a.non_persistent_ckpt_type
                   << " is not implemented (lattice writes global non-persistent checkpoints: a directory of their own)";
  if (a.non_persistent_save_interval > 0 && a.save.empty() && a.non_persistent_global_ckpt_dir.empty())
    LATTICE_FAIL() << "--non-persistent-save-interval needs --save DIR or --non-persistent-global-ckpt-dir DIR";
  if (a.load.empty() && a.pretrained_checkpoint.empty() && (a.no_load_optim || a.no_load_rng || a.finetune))
    LATTICE_FAIL() << "--no-load-optim, --no-load-rng and --finetune need --load DIR";
  if (a.moe_upcycling_granularity < 1)
    LATTICE_FAIL() << "--moe-upcycling-granularity must be >= 1, got " << a.moe_upcycling_granularity;
  if (a.moe_upcycling_granularity != 1 && !a.moe_use_upcycling)
    LATTICE_FAIL() << "--moe-upcycling-granularity needs --moe-use-upcycling";
  if (a.moe_use_upcycling) {  // Megatron's conditions: the first run, from a dense checkpoint, saved
    if (a.load.empty() || a.save.empty() || a.num_experts <= 0)
      LATTICE_FAIL() << "--moe-use-upcycling needs --load (the dense checkpoint), --save (for the upcycled one) and "
                        "--num-experts";
    if (!a.pretrained_checkpoint.empty() || a.finetune)
      LATTICE_FAIL() << "--moe-use-upcycling takes the dense weights from --load: drop --pretrained-checkpoint and "
                        "--finetune";
    if (has_checkpoint(a.save))
      LATTICE_FAIL() << "--moe-use-upcycling: --save " << a.save
                     << " holds a checkpoint already; upcycling is the first run's (drop the flag to resume)";
  }
  if (a.ckpt_step < -1 || (a.ckpt_step >= 0 && a.load.empty() && a.pretrained_checkpoint.empty()))
    LATTICE_FAIL() << (a.ckpt_step < -1 ? "--ckpt-step must be >= 0, got " + std::to_string(a.ckpt_step)
                                        : std::string("--ckpt-step needs --load DIR or --pretrained-checkpoint DIR"));
}

// Loads the chosen checkpoint (train/resume_point.h; nothing when --load holds none: training starts
// from scratch, so `--save D --load D` auto-resumes) and returns where training continues.
TrainingProgress resume_point(const TrainArgs& args, GPTModel& model, Optimizer& optimizer,
                              OptimizerParamScheduler& scheduler, LossScaler* loss_scaler,
                              MixedPrecisionPolicy* precision) {
  const TrainingProgress fresh{0, 0, args.seed};
  if (args.moe_use_upcycling) {  // the experts from --load's dense weights; a fresh optimizer, iteration 0
    const std::string dir =
        args.ckpt_step >= 0 ? checkpoint_at_iteration(args.load, args.ckpt_step, "--ckpt-step") : args.load;
    const int64_t g = upcycle_from_dense_checkpoint(dir, model, args.moe_upcycling_granularity);
    log_info("> upcycled the dense checkpoint " + dir + " into " + std::to_string(args.num_experts) +
             " experts per MoE layer (granularity " + std::to_string(g) + ")");
    return fresh;
  }
  const CheckpointChoice choice = choose_checkpoint(args);
  if (!choice.note.empty()) log_info(choice.note);
  if (choice.dir.empty()) return fresh;
  const std::string& dir = choice.dir;
  const bool finetune = choice.finetune;
  TrainingLoadOptions o{dir, args.optimizer, !args.no_load_optim, !args.no_load_rng, finetune};
  o.loss_scaler = loss_scaler;
  o.precision = precision;
  std::optional<TrainingProgress> p = load_training_checkpoint(o, fresh, model, optimizer, scheduler);
  if (!p) {
    if (args.exit_on_missing_checkpoint)
      LATTICE_FAIL() << "--load " << args.load << ": no checkpoint (no " << kTrackerFile
                     << ") and --exit-on-missing-checkpoint";
    log_info("> no checkpoint in " + args.load + " (no " + std::string(kTrackerFile) + "): training from scratch");
    return fresh;
  }
  // Samples are read by index = consumed samples = iteration x global batch size (or the sum
  // of the --rampup-batch-size batches so far).
  if (p->consumed_train_samples != args.consumed_after(p->iteration))
    LATTICE_FAIL() << "--load " << dir << ": the checkpoint consumed " << p->consumed_train_samples
                   << " samples in " << p->iteration << " iterations, which --global-batch-size "
                   << args.global_batch_size << (args.rampup() ? " with --rampup-batch-size" : "")
                   << " does not continue (" << args.consumed_after(p->iteration)
                   << "; changing the global batch size on resume is not supported)";
  std::ostringstream os;
  os << "> loaded checkpoint " << dir << " (iteration " << p->iteration << ", consumed samples "
     << p->consumed_train_samples << (finetune ? ", --finetune: weights only" : "")
     << (args.no_load_optim ? ", --no-load-optim" : "") << (args.no_load_rng ? ", --no-load-rng" : "") << ")";
  log_info(os.str());
  return *p;
}

// Opens --metrics-file. A resumed run continues the file: lines of iterations after the
// checkpoint (logged by a run that died before saving again) and a torn last line are
// dropped, so the file reads as one uninterrupted run.
std::ofstream open_metrics(const std::string& path, int64_t resumed_iteration) {
  std::ofstream out;
  if (path.empty()) return out;
  if (resumed_iteration > 0) {
    std::ifstream in(path);
    std::string kept, line;
    while (in && std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("iteration") || !j["iteration"].is_number_integer() ||
          j["iteration"].get<int64_t>() > resumed_iteration)
        break;
      kept += line + "\n";
    }
    write_file_atomic(path, kept);
    out.open(path, std::ios::app);
  } else {
    out.open(path, std::ios::trunc);
  }
  if (!out) LATTICE_FAIL() << "--metrics-file " << path << ": cannot open for writing";
  return out;
}

// Why the loop stops early, or "" to go on.
std::string exit_reason(const TrainArgs& args, int64_t done, std::chrono::steady_clock::time_point start) {
  if (const int sig = exit_signal_received()) return sig == SIGINT ? "received SIGINT" : "received SIGTERM";
  if (args.exit_interval > 0 && done % args.exit_interval == 0)
    return "--exit-interval " + std::to_string(args.exit_interval);
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60.0;
  if (args.exit_duration_in_mins > 0 && minutes > args.exit_duration_in_mins)
    return "--exit-duration-in-mins " + std::to_string(args.exit_duration_in_mins);
  return "";
}

// The inputs of the per-rank memory estimate (--log-memory, --dry-run). fp32 today;
// --bf16 keeps a bf16 copy of the weights beside the fp32 parameters and gradients.
MemoryLayout memory_layout(const TrainArgs& args, const TransformerConfig& cfg, int dp, const PipelineLayout& pipe,
                           int64_t num_micro) {
  MemoryLayout m;
  m.config = cfg;
  m.micro_batch_size = args.micro_batch_size;
  m.seq_length = args.seq_length;
  m.tp = int(args.tensor_model_parallel_size);
  m.pp = pipe.stages;
  m.dp = dp;
  m.ep = int(args.expert_model_parallel_size);
  m.cp = int(args.context_parallel_size);
  m.sequence_parallel = args.sequence_parallel;
  m.distributed_optimizer = args.use_distributed_optimizer;
  m.dist_opt_instances = int(args.num_distributed_optimizer_instances);
  m.tp_pp_dp = args.use_tp_pp_dp_mapping;
  m.grad_reduce_in_bf16 = args.grad_reduce_in_bf16;
  m.ddp_bucket_size = args.ddp_bucket_size;
  m.ddp_num_buckets = args.ddp_num_buckets;
  m.pipeline = pipe;
  m.num_micro_batches = num_micro;
  m.optimizer = args.optimizer;
  m.muon = args.optimizer_config(cfg).muon;
  m.exp_avg_bf16 = args.exp_avg_dtype == "bf16";
  m.exp_avg_sq_bf16 = args.exp_avg_sq_dtype == "bf16";
  // bf16: the GEMMs' copy of the weights in bf16, or widened to fp32 where the CPU's gemm_bf16
  // multiplies in fp32 (model/mixed_precision.cpp); fp8's copy is bf16 patterns. The path is asked for
  // bf16 runs only (it reads LATTICE_BF16_GEMM, which an fp32 run ignores).
  if (args.bf16) {
    const bool widened =
        args.fp8_format.empty() && args.device == "cpu" && gemm_bf16_path() == Bf16GemmPath::fp32_widened;
    m.precision.weight_copy = widened ? 4 : 2;
  }
  return m;
}

// The global batch in micro-batches per data-parallel rank; a global batch they do not divide is an error (as
// Megatron asserts: the ranks would otherwise take fewer samples than the batch counts).
int64_t micro_batches_per_rank(const TrainArgs& args, int64_t dp) {
  const int64_t num_micro = args.global_batch_size / (args.micro_batch_size * dp);
  if (num_micro * args.micro_batch_size * dp != args.global_batch_size)
    LATTICE_FAIL() << "--global-batch-size " << args.global_batch_size << " is not a multiple of --micro-batch-size "
                   << args.micro_batch_size << " x data-parallel size " << dp;
  return num_micro;
}

// --rampup-batch-size: each batch of the ramp in micro-batches per rank, checked: every batch
// splits into micro-batches of every data-parallel rank, and the pipeline schedule takes it.
std::vector<int64_t> ramp_micro_batches(const TrainArgs& args, const BatchSizeRampup& ramp, const PipelineLayout& pipe,
                                        int64_t dp) {
  const int64_t unit = args.micro_batch_size * dp;
  std::vector<int64_t> out;
  for (int64_t b : ramp.batch_sizes()) {
    if (b % unit != 0)
      LATTICE_FAIL() << "--rampup-batch-size: the global batch size " << b << " is not a multiple of "
                     << "--micro-batch-size " << args.micro_batch_size << " x data-parallel size " << dp;
    check_micro_batches(pipe, b / unit);
    out.push_back(b / unit);
  }
  return out;
}

// --dry-run: the layout and each stage's schedule, without training. The data-parallel
// size is the one mpirun gives, or 1 in a single process.
int print_dry_run(const TrainArgs& args) {
  const int64_t tp = args.tensor_model_parallel_size, pp = args.pipeline_model_parallel_size;
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int64_t world = env ? std::atoll(env) : tp * pp * args.context_parallel_size;
  const ParallelLayout layout = make_layout(int(world), int(tp), int(pp), int(args.expert_model_parallel_size),
                                            int(args.context_parallel_size),
                                            int(args.num_distributed_optimizer_instances),
                                            int(args.implementation.expert_tensor_parallel_size),
                                            args.use_tp_pp_dp_mapping);
  if (env && std::getenv("OMPI_COMM_WORLD_RANK") && std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")) != 0) return 0;
  const PipelineLayout pipe = pipeline_layout_of(args);
  const int64_t num_micro = micro_batches_per_rank(args, layout.dp);
  check_micro_batches(pipe, num_micro);
  std::printf("> dry run: world %d = tp %d x %spp %d x dp %d, %lld micro-batches of %lld per rank and iteration\n",
              layout.world, layout.tp, layout.cp > 1 ? ("cp " + std::to_string(layout.cp) + " x ").c_str() : "",
              layout.pp, layout.dp, (long long)num_micro, (long long)args.micro_batch_size);
  if (layout.cp > 1)
    std::printf("> context parallelism: each sequence of %lld tokens in %d chunks of %lld, two per rank over cp %d "
                "ranks; gradients summed over dp x cp = %d ranks\n",
                (long long)args.seq_length, 2 * layout.cp, (long long)(args.seq_length / (2 * layout.cp)), layout.cp,
                layout.dp * layout.cp);
  if (layout.ep > 1 || layout.experts_whole)
    std::printf("> expert parallelism: each MoE layer's %lld experts over ep %d ranks (%lld each), expert data-parallel "
                "%d%s\n",
                (long long)args.num_experts, layout.ep, (long long)(args.num_experts / layout.ep),
                layout.expert_dp_group(),
                layout.experts_whole ? ", each expert whole (expert tensor-parallel 1, its groups over tp x dp)" : "");
  if (const std::optional<BatchSizeRampup> ramp = args.rampup()) {
    std::string sizes;
    for (int64_t m : ramp_micro_batches(args, *ramp, pipe, layout.dp))
      sizes += (sizes.empty() ? "" : ", ") + std::to_string(m);
    std::printf("> %s: %lld iterations; micro-batches per rank and iteration along the ramp: %s\n",
                ramp->describe().c_str(), (long long)args.train_iters, sizes.c_str());
  }
  for (int r = 0; r < pipe.stages; ++r) {
    std::string chunks;  // each chunk: [embedding + ] layers b-e [ + output layer and loss]
    const auto ranges = stage_layers(pipe, r);
    for (size_t v = 0; v < ranges.size(); ++v) {
      const auto [b, e] = ranges[v];
      std::string chunk;
      if (r == 0 && v == 0) chunk = "embedding";
      if (b < e)
        chunk += (chunk.empty() ? "" : " + ") +
                 (e - b == 1 ? "layer " + std::to_string(b) : "layers " + std::to_string(b) + "-" + std::to_string(e - 1));
      if (r == pipe.stages - 1 && v + 1 == ranges.size()) chunk += (chunk.empty() ? "" : " + ") + std::string("output layer and loss");
      chunks += (chunks.empty() ? "" : ", ") + chunk;
    }
    const auto ops = pipeline_schedule(pipe, num_micro, r);
    std::printf("  stage %d: %s; warmup %lld forwards, at most %d micro-batches of activations per chunk\n", r,
                chunks.c_str(), (long long)std::max<int64_t>(0, warmup_forwards(ops) - 1), max_in_flight(ops));
  }
  std::fputs(format_timeline(pipe, num_micro).c_str(), stdout);
  TransformerConfig cfg = args.transformer_config();
  if (!args.tokenizer_type.empty()) cfg.vocab_size = args.get_tokenizer()->vocab_size();
  cfg.finalize(tp);
  const MemoryLayout mem = memory_layout(args, cfg, layout.dp, pipe, num_micro);
  std::puts(format_memory_estimate(mem, estimate_all_ranks(mem, resident_bytes()),
                                   "this dry run's resident memory (binary and libraries, no MPI: a run under "
                                   "mpirun adds MPI's buffers)").c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int run_training(const TrainArgs& args) {
  // The schedule first: a bad schedule flag fails before any compute.
  OptimizerParamScheduler scheduler = get_optimizer_param_scheduler(args);
  check_checkpoint_flags(args);
  if (args.dry_run) return print_dry_run(args);
  // --exit-signal-handler: the signal only raises a flag, which the loop reads after each
  // iteration (the checkpoint is a consistent one). Before the first other thread starts:
  // every thread must inherit the blocked signals (train/exit_signal.h).
  if (args.exit_signal_handler) start_exit_signal_watcher();
  // --device first: nothing may be allocated on a device before it is chosen.
  const std::string device_line = select_rank_device(args.device);
  auto ps = ParallelState::create(int(args.tensor_model_parallel_size), int(args.pipeline_model_parallel_size),
                                  args.distributed_timeout_minutes * 60.0, int(args.expert_model_parallel_size),
                                  int(args.context_parallel_size), int(args.num_distributed_optimizer_instances),
                                  int(args.implementation.expert_tensor_parallel_size), args.use_tp_pp_dp_mapping);
  const auto job_start = std::chrono::steady_clock::now();  // --log-progress's job throughput
  if (args.log_progress && ps->world_rank() == 0) append_progress_line(args.save, ps->world_size(), "Starting job");
  set_log_info_enabled(ps->world_rank() == 0);
  std::vector<int> profile_ranks;  // --profile
  if (args.profile) profile_ranks = args.profile_rank_list();
  for (int r : profile_ranks)
    if (r >= ps->world_size())
      LATTICE_FAIL() << "--profile-ranks " << r << ": no such rank (" << ps->world_size() << " in all)";
  log_info(device_line);
  check_same_config_across_ranks(*ps, args.to_json());
  const int threads = threads_per_rank(args.num_threads, *ps);
  omp_set_num_threads(threads);
  blas_set_num_threads(threads);

  TransformerConfig cfg = args.transformer_config();
  int32_t eod = -1;
  if (!args.tokenizer_type.empty()) {
    const auto tok = args.get_tokenizer();
    cfg.vocab_size = tok->vocab_size();
    eod = resolve_eod_token(args, tok.get(), cfg.vocab_size);
  } else {
    eod = resolve_eod_token(args, nullptr, cfg.vocab_size);
  }
  cfg.finalize(args.tensor_model_parallel_size);
  const TrainingData data = make_training_data(args, cfg.vocab_size);
  if (!data.summary.empty()) log_info(data.summary.substr(0, data.summary.size() - 1));

  // Pipeline parallelism: this rank's stage holds the chunks of stage_layers and keeps
  // activations for as many micro-batches as its schedule has in flight.
  const PipelineLayout pipe = pipeline_layout_of(args);
  const int64_t num_micro = micro_batches_per_rank(args, ps->dp().size());
  check_micro_batches(pipe, num_micro);
  const int stage = ps->pp_rank();
  int in_flight = max_in_flight(pipeline_schedule(pipe, num_micro, stage));
  if (const std::optional<BatchSizeRampup> ramp = args.rampup()) {
    // Every batch of the ramp splits into micro-batches of every data-parallel rank, and the
    // activations kept fit the largest number in flight of any of them.
    for (int64_t m : ramp_micro_batches(args, *ramp, pipe, ps->dp().size()))
      in_flight = std::max(in_flight, max_in_flight(pipeline_schedule(pipe, m, stage)));
    log_info("> " + ramp->describe() + ": " + std::to_string(args.train_iters) + " iterations for " +
             std::to_string(args.train_samples) + " samples");
  }
  const ModelPlacement placement{stage_layers(pipe, stage), stage == 0, stage == pipe.stages - 1, in_flight};
  // --log-memory: the process (on a GPU, the device) before the model exists.
  const bool device_memory = kernels_on_gpu();
  const size_t baseline_bytes = device_memory ? device_used_bytes() : resident_bytes();
  GPTModel model(cfg, args.micro_batch_size, args.seq_length, TensorParallel{&ps->tp(), args.sequence_parallel},
                 placement, &ps->ep(), ContextParallel{&ps->cp()});
  PipelineRunner pipeline(model, pipe, &ps->pp(), ps->embedding());
  model.init_parameters(args.seed);
  model.set_data_parallel_group(&ps->dp());  // global_aux_loss's expert counts over the data-parallel ranks
  model.set_tensor_context_group(&ps->tp_cp());  // (whole experts: the routing statistics' group)
  // --sft: each packed conversation a document (its segment: positions from 0, attention within it).
  model.set_document_boundaries(DocumentBoundaries{eod, args.eod_mask_loss, args.reset_position_ids || args.sft,
                                                   args.reset_attention_mask || args.sft});
  std::unique_ptr<DataParallel> dp;
  // (whole experts may have copies on the tensor-parallel ranks of one data-parallel rank)
  if (ps->dp_cp().size() > 1 || ps->expert_dp().size() > 1 || args.use_distributed_optimizer) {
    DataParallelConfig dcfg;
    dcfg.distributed_optimizer = args.use_distributed_optimizer;
    dcfg.overlap_grad_reduce = args.overlap_grad_reduce;
    dcfg.overlap_param_gather = args.overlap_param_gather;
    dcfg.bucket_elements = args.ddp_bucket_elements(model.params().numel());
    dcfg.grad_reduce_in_bf16 = args.grad_reduce_in_bf16;
    dp = std::make_unique<DataParallel>(model, ps->dp(), dcfg, &ps->ep(), &ps->expert_dp_shard(), &ps->dp_cp_shard(),
                                        ps->dp_cp_replicas(), ps->expert_dp_replicas());
  }
  Optimizer optimizer(model.params(), args.optimizer_config(model.config()), dp ? dp->owned_ranges() : ElementRanges{}, &ps->tp());
  // Mixed precision (--bf16 / --fp16 / --fp8-format): the linear layers' GEMM policy, fp16's loss scaler.
  Fp8Params fp8_params;  // every rank reduces every weight's amax; the experts' over their replicas
  fp8_params.count = int64_t(model.params().infos().size());
  fp8_params.cp = &ps->cp();
  fp8_params.unquantized = fp8_unquantized_weights(model.params().infos(), args);
  if (ps->layout().ep > 1 || model.experts_whole()) {
    for (const ParamInfo& p : model.params().infos()) fp8_params.expert.push_back(p.expert);
    fp8_params.expert_dp = &ps->expert_dp();
    fp8_params.experts_whole = model.experts_whole();
  }
  const std::unique_ptr<MixedPrecisionPolicy> precision =
      make_precision_policy(args, &ps->tp(), &ps->dp_cp(), fp8_params);
  if (precision) model.set_gemm_policy(precision.get());
  model.set_attention_math(attention_math(args));
  const std::unique_ptr<LossScaler> loss_scaler = make_loss_scaler(args);

  const double flops = megatron_flops_per_iteration(cfg, args.global_batch_size, args.seq_length);
  const double peak = args.peak_tflops > 0 ? args.peak_tflops : measure_peak_tflops();
  // As Megatron: under tensor or pipeline parallelism the count is this rank's part.
  const std::string rank_part =
      ps->layout().tp * ps->layout().pp > 1
          ? " on this rank (tp " + std::to_string(ps->tp_rank()) + ", pp " + std::to_string(ps->pp_rank()) + ")"
          : "";
  char hdr[512];
  std::snprintf(hdr, sizeof hdr,
                "> lattice: %lld parameters%s (padded vocab %lld), %d threads, BLAS %s, peak %.3f "
                "TFLOP/s (%s), memory: params+grads %.1f MB, optimizer state %.1f MB, activations "
                "%.1f MB",
                (long long)model.params().parameter_elements(), rank_part.c_str(), (long long)cfg.padded_vocab_size, threads,
                blas_backend_name(), peak, args.peak_tflops > 0 ? "--peak-tflops" : "measured",
                2.0 * model.num_parameters() * 4 / 1e6, optimizer.state_bytes() / 1e6,
                model.arena_bytes() / 1e6);
  log_info(hdr);
  log_info(describe_precision(args, loss_scaler.get()));
  if (ps->world_size() > 1)
    log_info("> parallel layout: world " + std::to_string(ps->world_size()) + " = tp " +
             std::to_string(ps->layout().tp) +
             (ps->layout().cp > 1 ? " x cp " + std::to_string(ps->layout().cp) : std::string()) + " x pp " +
             std::to_string(ps->layout().pp) + " x dp " + std::to_string(ps->layout().dp) + ", " +
             std::to_string(threads) + " threads per rank" +
             (ps->layout().ep > 1 || ps->layout().experts_whole
                  ? "; experts over ep " + std::to_string(ps->layout().ep) + " x expert dp " +
                        std::to_string(ps->layout().expert_dp_group()) +
                        (ps->layout().experts_whole ? ", each expert whole (expert tensor-parallel 1)" : "")
                  : std::string()));
  MemoryFootprint mem;
  mem.parameters = model.params().parameter_elements();
  mem.param_bytes = mem.grad_bytes = size_t(model.num_parameters()) * sizeof(float);  // the buffers, padding included
  mem.optimizer_bytes = optimizer.state_bytes();
  mem.optimizer_scratch_bytes = optimizer.scratch_bytes();
  mem.owned_parameters = optimizer.state_numel();
  mem.activation_bytes = model.arena_bytes() + model.context_parallel_bytes();
  mem.tensor_parallel = ps->tp().size();
  mem.sequence_parallel = model.tensor_parallel().sp();
  // The bytes per parameter come from the estimate's one formula; the totals above are measured.
  const MemoryLayout ml = memory_layout(args, cfg, ps->dp().size(), pipe, num_micro);
  double state_per_parameter = ml.optimizer_state_bytes();
  if (args.optimizer == "muon")  // no second moment for Muon's matrices
    state_per_parameter -= 4.0 * double(muon_matrix_elements(model.params().infos())) /
                           double(std::max<int64_t>(1, mem.parameters));
  log_info(format_memory_report(mem, ml.shard_ranks(), args.use_distributed_optimizer, state_per_parameter));
  // --log-memory: every rank's estimate (a function of the layout; each rank measured its
  // own baseline), and after the first iterations each rank's measured peak beside it.
  std::vector<RankMemory> memory_ranks;
  if (args.log_memory) {
    const std::vector<double> baselines = gather_per_rank(*ps, double(baseline_bytes));
    for (int w = 0; w < ps->world_size(); ++w)
      memory_ranks.push_back(estimate_rank_memory(ml, w, size_t(baselines[size_t(w)])));
    log_info(format_memory_estimate(ml, memory_ranks,
                                    device_memory
                                        ? "each rank's device memory in use at start-up before the model: the CUDA "
                                          "context"
                                        : "each rank's resident memory (VmRSS) at start-up before the model: binary, "
                                          "libraries, oneDNN, MPI"));
  }
  bool memory_logged = false;
  auto log_memory_peaks = [&](int64_t iterations) {
    if (!args.log_memory || memory_logged) return;
    memory_logged = true;
    const double measured = double(device_memory ? device_used_bytes() : peak_resident_bytes());
    log_info(format_memory_measured(memory_ranks, gather_per_rank(*ps, measured), iterations, device_memory));
  };

  // Load before anything is written: a bad checkpoint leaves every file as it was.
  const TrainingProgress start = resume_point(args, model, optimizer, scheduler, loss_scaler.get(), precision.get());
  std::ofstream metrics = open_metrics(ps->world_rank() == 0 ? args.metrics_file : "", start.iteration);
  TensorBoardLog tensorboard(args, ps->world_rank() == 0);
  if (tensorboard.active()) log_info("> TensorBoard events: " + tensorboard.path());

  // Megatron's result checks (train/result_validation.h), their samples carried by the checkpoints.
  ResultValidator validator({!args.no_check_for_nan_in_loss_and_grad, args.check_for_spiky_loss,
                             args.check_for_large_grads, args.result_rejected_tracker_filename, ps->world_rank() == 0});
  if (args.check_for_spiky_loss || args.check_for_large_grads)
    validator.restore(start.rerun_state_machine, "--load " + args.load);
  // --iterations-to-skip and the iterations the tracker file shows rejected twice.
  const std::vector<int64_t> iterations_to_skip = args.iterations_to_skip_list();

  int64_t last_saved = -1;
  // Every data-parallel rank holds the same parameters: the ranks of data-parallel rank 0
  // (one per tensor-parallel position) contribute their parts, sent to world rank 0, which
  // writes; with expert parallelism the other ranks of their expert-parallel group add their
  // experts. With the distributed optimizer the state shards are gathered first (a full,
  // layout-free checkpoint that loads under any tensor- and data-parallel size).
  TrainingSaveOptions save_opts;
  save_opts.dir = args.save;
  save_opts.optimizer = args.optimizer;
  save_opts.save_optim = !args.no_save_optim;
  save_opts.save_rng = !args.no_save_rng;
  save_opts.keep_last_n = args.keep_last_n;
  save_opts.retain_interval = args.save_retain_interval;
  nlohmann::json saved_args = nlohmann::json::parse(args.to_json());
  saved_args.update(start.provenance);  // where the loaded checkpoint's weights came from
  save_opts.args_json = saved_args.dump();
  save_opts.write = ps->world_rank() == 0;
  save_opts.loss_scaler = loss_scaler.get();
  save_opts.precision = precision.get();
  // fp8 state of the other pipeline stages: each stage's first rank (tp 0, dp 0; the
  // state is the same on every rank of a stage) broadcasts its weights' state over world;
  // with expert parallelism so do dp ranks 1 .. ep - 1, for their experts.
  save_opts.merge_fp8 = [&](std::map<std::string, Fp8ScalingState>& states) {
    const ParallelLayout& l = ps->layout();
    if (l.pp == 1 && l.ep == 1) return;
    for (int root_index = 0; root_index < l.pp * l.ep; ++root_index) {
      const int stage = root_index / l.ep, e = root_index % l.ep;
      // (whole experts: a stage's first ep ranks hold every expert between them)
      const int root = l.experts_whole ? stage * l.tp * l.cp * l.dp + e : l.rank_of(0, 0, e, stage);
      std::string text = ps->world_rank() == root ? fp8_state_to_json(states).dump() : std::string();
      int64_t bytes = int64_t(text.size());
      ps->world().broadcast(&bytes, int64_t(sizeof bytes), root);
      text.resize(size_t(bytes));
      ps->world().broadcast(text.data(), bytes, root);
      if (ps->world_rank() != root)
        for (auto& [name, st] : fp8_state_from_json(nlohmann::json::parse(text), "fp8 state of stage " +
                                                                                   std::to_string(stage)))
          states[name] = st;
    }
  };
  save_opts.parts_comm = &ps->world();
  // Whole experts: the first expert-parallel group is a stage's first ep ranks in rank order; with
  // the tensor-parallel ranks of context- and data-parallel rank 0 those are its first max(ep, tp).
  // A part two contributors give (a copy) is stored once.
  const ParallelLayout& l = ps->layout();
  if (l.experts_whole) {
    for (int stage = 0; stage < l.pp; ++stage)
      for (int m = 0; m < std::max(l.ep, l.tp); ++m) save_opts.contributors.push_back(stage * l.tp * l.cp * l.dp + m);
  } else {
    for (const std::vector<int>& g : plan_groups(l).dp)
      if (g[0] / l.tp % l.cp == 0)  // context-parallel rank 0: the others hold the same
        for (int e = 0; e < l.ep; ++e) save_opts.contributors.push_back(g[size_t(e)]);
  }
  save_opts.experts_only = ps->dp_rank() > 0 || ps->cp_rank() > 0;
  std::sort(save_opts.contributors.begin(), save_opts.contributors.end());  // world rank 0, the writer, first
  if (dp && args.use_distributed_optimizer) save_opts.gather_state = [&](float* flat) { dp->gather_shards(flat); };
  // With --overlap-param-gather a step ends with its parameter all-gather in flight (the
  // next step's forward waits for it). Evaluations and checkpoints read the parameters, so
  // they wait for it first, as Megatron disables its forward pre-hook around them.
  auto settle_params = [&] {
    if (dp) dp->finish_param_gather();
  };
  // The model FLOPs of every iteration so far, carried by the checkpoints (--log-progress).
  double flops_so_far = start.flops_so_far;
  const double job_start_flops = flops_so_far;
  // One checkpoint of `iteration` with options o (every rank takes part), "<what> <dir>" logged.
  auto write_checkpoint = [&](const TrainingSaveOptions& o, int64_t iteration, const char* what) {
    settle_params();
    TrainingProgress p{iteration, args.consumed_after(iteration), start.seed, flops_so_far};
    if (args.check_for_spiky_loss || args.check_for_large_grads) p.rerun_state_machine = validator.state();
    const std::string dir = save_training_checkpoint(o, p, model, optimizer, scheduler);
    if (o.write) log_info(std::string("> ") + what + " " + dir);
    if (ps->world_size() > 1) ps->world().barrier();
  };
  auto save = [&](int64_t iteration) {
    write_checkpoint(save_opts, iteration, "saved checkpoint");
    last_saved = iteration;
    if (args.log_progress && ps->world_rank() == 0) {  // Megatron's throughputs per GPU since this job's start
      const int world = ps->world_size();               // and since the first job of this world size
      const double job_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();
      const double job = (flops_so_far - job_start_flops) / (std::max(job_s, 1e-9) * 1e12 * world);
      const ProgressStart first = progress_start(args.save, world);
      const double since = first.found ? std::difftime(std::time(nullptr), first.time) : job_s;
      const double cumulative =
          first.found ? (flops_so_far - first.flops) / (std::max(since, 1.0) * 1e12 * world) : job;
      append_progress_line(args.save, world,
                           saved_checkpoint_progress(iteration, job, cumulative, flops_so_far,
                                                     double(args.consumed_after(iteration)) * double(args.seq_length)));
    }
  };
  // --non-persistent-save-interval: the same checkpoint into a directory of its own, which keeps only
  // the latest (a resume takes it when it is newer than the persistent ones).
  TrainingSaveOptions non_persistent_opts = save_opts;
  non_persistent_opts.dir = non_persistent_dir(args, args.save);
  non_persistent_opts.keep_last_n = 1;
  non_persistent_opts.retain_interval = 0;
  auto save_non_persistent = [&](int64_t iteration) {
    write_checkpoint(non_persistent_opts, iteration, "saved non-persistent checkpoint");
  };

  // Megatron's valid iterator continues from one evaluation to the next; evaluations
  // happen at every multiple of --eval-interval, so a resumed run starts it here.
  const int64_t eval_samples = args.eval_iters * args.global_batch_size;
  int64_t valid_pos = (start.iteration / args.eval_interval) * eval_samples;
  // What is evaluated: the validation split, or with --multiple-validation-sets each of its datasets
  // (Megatron's "validation-<i>" in the log and TensorBoard, "val_<i>" in --metrics-file), and the test split
  // (Megatron logs it as a validation loss too, "... on test set").
  struct EvalSet {
    std::string log_name, metrics_key, tensorboard_kind;
    const SampleSource* source;
    bool whole = false;  // --full-validation: every sample from the first, not --eval-iters batches from `first`
  };
  std::vector<EvalSet> valid_sets;
  if (data.valid) valid_sets.push_back({"validation", "val", "validation", data.valid.get(), args.full_validation});
  for (size_t i = 0; i < data.valid_sets.size(); ++i) {
    const std::string n = std::to_string(i);
    valid_sets.push_back(
        {"validation-" + n, "val_" + n, "validation-" + n, data.valid_sets[i].get(), args.full_validation});
  }
  auto run_eval = [&](const std::string& prefix, const EvalSet& set, int64_t first, int64_t iteration) {
    settle_params();
    if (precision) precision->set_training(false);
    const EvalResult r =
        set.whole ? evaluate(model, *set.source, 0, set.source->size(), args.global_batch_size, args.micro_batch_size,
                             &pipeline, &ps->dp())
                  : evaluate(model, *set.source, first, args.eval_iters * args.global_batch_size,
                             args.global_batch_size, args.micro_batch_size, &pipeline, &ps->dp());
    if (precision) precision->set_training(true);
    log_info(format_evaluation(prefix, r, set.log_name));
    if (metrics.is_open()) metrics << format_eval_metrics_json(iteration, set.metrics_key, r) << "\n" << std::flush;
    tensorboard.evaluation(set.tensorboard_kind, iteration, args.consumed_after(iteration), r);
  };

  StepConfig step_cfg{args.micro_batch_size, args.global_batch_size, args.seq_length, args.clip_grad, start.seed,
                      loss_scaler.get(), precision.get(), test_inject_inf_iterations()};
  step_cfg.per_token_loss = args.calculate_per_token_loss;
  step_cfg.validator = &validator;
  step_cfg.log_num_zeros_in_grad = args.log_num_zeros_in_grad;
  step_cfg.log_params_norm = args.log_params_norm;
  step_cfg.moe_per_layer_logging = args.moe_per_layer_logging;
  int64_t interval_skipped = 0, interval_nan = 0, interval_samples = 0;
  int64_t consumed = args.consumed_after(start.iteration);
  const auto train_start = std::chrono::steady_clock::now();
  double interval_loss = 0, interval_ms = 0, interval_balance = 0, interval_seq_balance = 0, interval_global_balance = 0,
         interval_z = 0;
  std::vector<double> interval_layer_balance, interval_layer_z;  // --moe-per-layer-logging: [num_layers] sums
  std::vector<double> interval_mtp;  // --mtp-num-layers: [depths] sums
  int64_t interval_iters = 0;
  double last_norm = 0;
  StepResult last;  // the interval's last step (its zeros count and parameter norm are logged)
  double pipeline_seconds = 0, pipeline_compute = 0;  // this stage's schedule time, computing part
  const bool profile_here = std::count(profile_ranks.begin(), profile_ranks.end(), ps->world_rank()) > 0;
  OpProfileWindow op_profile = profile_here
                                   ? OpProfileWindow(args.profile_step_start, args.profile_step_end, ps->world_rank())
                                   : OpProfileWindow(args.profile_ops);
  // --skip-train (Megatron's): no step and no checkpoint; the evaluations below at the loaded iteration.
  const int64_t end_iteration = args.skip_train ? start.iteration : args.train_iters;
  if (args.moe_use_upcycling) save(start.iteration);  // as Megatron: the upcycled model first
  for (int64_t it = start.iteration; it < end_iteration; ++it) {
    // --rampup-batch-size: this step's global batch, from the samples consumed so far.
    const int64_t batch = args.batch_size_at(consumed);
    if (std::binary_search(iterations_to_skip.begin(), iterations_to_skip.end(), it)) {
      // As Megatron: the batch's samples are consumed, nothing else happens (no update, no scheduler
      // step, no log line, evaluation or checkpoint at this iteration).
      consumed += batch;
      log_info("> iteration " + std::to_string(it + 1) + " skipped (step index " + std::to_string(it) +
               " of --iterations-to-skip" +
               (args.result_rejected_tracker_filename.empty() ? "" : " or --result-rejected-tracker-filename") +
               "): its " + std::to_string(batch) + " samples consumed without a step");
      continue;
    }
    Timer timer;
    op_profile.before_step(it);
    StepConfig cfg_now = step_cfg;
    cfg_now.global_batch_size = batch;
    cfg_now.first_sample = consumed;
    StepResult r = train_step(model, optimizer, *data.train, cfg_now, it, scheduler, dp.get(), &pipeline);
    consumed += batch;
    flops_so_far += flops * double(batch) / double(args.global_batch_size);
    interval_samples += batch;
    // Megatron steps the schedule by the samples consumed, and not after a skipped update.
    if (!r.skipped) scheduler.step(batch);
    const double step_ms = timer.ms();
    op_profile.after_step(step_ms);
    interval_ms += step_ms;
    pipeline_seconds += pipeline.last_seconds();
    pipeline_compute += pipeline.last_compute_seconds();
    // As Megatron: the loss is averaged over the applied iterations; a skipped one whose
    // loss is inf/nan counts as a nan iteration.
    if (r.skipped) {
      ++interval_skipped;
      if (!std::isfinite(r.lm_loss)) ++interval_nan;
    } else {
      interval_loss += r.lm_loss;
      interval_balance += r.load_balancing_loss;
      interval_seq_balance += r.seq_load_balancing_loss;
      interval_global_balance += r.global_load_balancing_loss;
      interval_z += r.z_loss;
      // --moe-per-layer-logging: each layer's sum over the applied iterations (-1 stays for a dense layer).
      auto add = [](std::vector<double>& sum, const std::vector<double>& v) {
        if (sum.empty()) sum.assign(v.size(), 0.0);
        for (size_t k = 0; k < v.size(); ++k) sum[k] = v[k] < 0 ? -1.0 : sum[k] + v[k];
      };
      add(interval_layer_balance, r.layer_load_balancing_loss);
      add(interval_layer_z, r.layer_z_loss);
      add(interval_mtp, r.mtp_losses);
    }
    last_norm = r.grad_norm;
    last = r;
    ++interval_iters;
    const int64_t done = it + 1;
    tensorboard.iteration({done, consumed, batch, ps->world_size(),
                           scheduler.get_lr(), r.lm_loss, loss_scaler ? loss_scaler->scale() : 1.0, r.grad_norm,
                           r.skipped, double(r.num_zeros_in_grad), r.params_norm, moe_scalars(args, r)});
    if (done % args.log_interval == 0 || done == args.train_iters) {
      LogLine l{};
      l.iteration = done;
      l.train_iters = args.train_iters;
      l.consumed_samples = consumed;
      l.global_batch_size = batch;
      l.elapsed_ms = interval_ms / double(interval_iters);
      // The FLOPs grow with the batch: the interval's mean batch against the global one. As
      // Megatron's throughput per GPU, the iteration's FLOPs over every rank's time.
      const double mean_batch = double(interval_samples) / double(interval_iters);
      l.tflops_per_gpu = flops * mean_batch / double(args.global_batch_size) / (l.elapsed_ms / 1e3) / 1e12 /
                         double(ps->world_size());
      l.learning_rate = scheduler.get_lr();  // after the step, as Megatron logs it
      l.lm_loss = interval_loss / double(std::max<int64_t>(1, interval_iters - interval_skipped));
      const double applied = double(std::max<int64_t>(1, interval_iters - interval_skipped));
      if (last.load_balancing_loss >= 0 && args.logs_micro_batch_balance()) l.load_balancing_loss = interval_balance / applied;
      if (last.seq_load_balancing_loss >= 0) l.seq_load_balancing_loss = interval_seq_balance / applied;
      if (last.global_load_balancing_loss >= 0) l.global_load_balancing_loss = interval_global_balance / applied;
      if (last.z_loss >= 0) l.z_loss = interval_z / double(std::max<int64_t>(1, interval_iters - interval_skipped));
      for (double v : interval_layer_balance) l.layer_load_balancing_loss.push_back(v < 0 ? -1.0 : v / applied);
      for (double v : interval_layer_z) l.layer_z_loss.push_back(v < 0 ? -1.0 : v / applied);
      for (double v : interval_mtp) l.mtp_losses.push_back(v / applied);
      l.loss_scale = loss_scaler ? loss_scaler->scale() : 1.0;
      l.skipped_iterations = interval_skipped;
      l.nan_iterations = interval_nan;
      l.grad_norm = last_norm;
      l.num_zeros_in_grad = double(last.num_zeros_in_grad);
      l.params_norm = last.params_norm;
      l.tokens_per_sec = mean_batch * double(args.seq_length) / (l.elapsed_ms / 1e3);
      l.mfu_percent = 100.0 * l.tflops_per_gpu / peak;
      log_info(format_log_line(l));
      tensorboard.iteration_time(done, l.elapsed_ms / 1e3);
      if (args.log_comm) {
        log_info(format_comm_report(ps->total_stats(), interval_iters,
                                    dp ? dp->grad_sync().exposed_seconds() : 0.0));
        ps->reset_stats();
        if (pipe.stages > 1) {
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "> pipeline bubble on stage %d (measured, idle / schedule time): %.3f; theory %.3f",
                        ps->pp_rank(), 1.0 - pipeline_compute / std::max(1e-12, pipeline_seconds),
                        theoretical_bubble(pipe, num_micro));
          log_info(buf);
        }
      }
      pipeline_seconds = pipeline_compute = 0;
      if (metrics.is_open()) metrics << format_metrics_json(l) << "\n" << std::flush;
      interval_loss = interval_ms = interval_balance = interval_seq_balance = interval_global_balance = interval_z = 0;
      interval_layer_balance.clear();
      interval_layer_z.clear();
      interval_mtp.clear();
      interval_iters = interval_skipped = interval_nan = interval_samples = 0;
    }
    if (done - start.iteration == 3 || done == args.train_iters) log_memory_peaks(done - start.iteration);
    if (args.check_weight_hash_across_dp_replicas_interval > 0 &&
        done % args.check_weight_hash_across_dp_replicas_interval == 0) {
      settle_params();  // the distributed optimizer's gathered parameters
      apply_test_replica_perturbation(model.params(), ps->world().rank());
      check_weight_hashes_across_dp_replicas(model.params(), ps->dp_cp(), ps->expert_dp(), ps->world(), done);
      log_info("> weight hashes match across data-parallel replicas after iteration " + std::to_string(done));
    }
    if (!valid_sets.empty() && done % args.eval_interval == 0) {
      for (const EvalSet& set : valid_sets) run_eval(eval_prefix(done), set, valid_pos, done);
      valid_pos += eval_samples;
    }
    if (!args.save.empty() && args.save_interval > 0 && done % args.save_interval == 0) save(done);
    else if (args.non_persistent_save_interval > 0 && done % args.non_persistent_save_interval == 0)
      save_non_persistent(done);
    std::string reason = exit_reason(args, done, train_start);
    // Ranks see a signal or the clock at different moments: they agree on exiting after
    // the same iteration (one double per iteration), or the others would wait forever.
    if (ps->world_size() > 1 && (args.exit_signal_handler || args.exit_duration_in_mins > 0)) {
      double exiting = reason.empty() ? 0.0 : 1.0;
      ps->world().all_reduce(&exiting, 1, ReduceOp::max);
      if (exiting > 0 && reason.empty()) reason = "another rank is exiting";
    }
    if (!reason.empty()) {
      if (!args.save.empty() && last_saved != done) save(done);
      log_memory_peaks(done - start.iteration);
      op_profile.log_report();
      log_info("> exiting after iteration " + std::to_string(done) + ": " + reason);
      return 0;
    }
  }
  op_profile.log_report();
  if (!args.save.empty() && end_iteration > start.iteration && last_saved != end_iteration) save(end_iteration);
  for (const EvalSet& set : valid_sets) run_eval(eval_prefix(end_iteration, "validation"), set, valid_pos, end_iteration);
  if (data.test) run_eval(eval_prefix(end_iteration, "test"), {"validation", "test", "test", data.test.get()}, 0,
                          end_iteration);
  return 0;
}

}  // namespace lattice
