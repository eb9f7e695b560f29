#include "train/lr_schedule.h"

#include "core/error.h"

namespace lattice {
namespace {

// Megatron's arguments.py: start/end weight decay only with an increasing style.
void weight_decay_range(const TrainArgs& a, OptimizerParamSchedulerOptions& o) {
  const std::string& style = a.weight_decay_incr_style;
  if (style == "constant") {
    if (a.start_weight_decay)
      LATTICE_FAIL() << "--start-weight-decay needs --weight-decay-incr-style linear or cosine "
                        "(the constant style uses --weight-decay)";
    if (a.end_weight_decay)
      LATTICE_FAIL() << "--end-weight-decay needs --weight-decay-incr-style linear or cosine "
                        "(the constant style uses --weight-decay)";
    o.start_wd = o.end_wd = a.weight_decay;
    return;
  }
  if ((style == "linear" || style == "cosine") && (!a.start_weight_decay || !a.end_weight_decay))
    LATTICE_FAIL() << "--weight-decay-incr-style " << style
                   << " needs --start-weight-decay and --end-weight-decay";
  o.start_wd = a.start_weight_decay.value_or(0);
  o.end_wd = a.end_weight_decay.value_or(0);
}

void only_with(bool used, const char* flag, const char* mode, const char* instead) {
  if (used)
    LATTICE_FAIL() << "--" << flag << " needs " << mode << " training; use --" << instead;
}

}  // namespace

OptimizerParamScheduler get_optimizer_param_scheduler(const TrainArgs& a) {
  OptimizerParamSchedulerOptions o;
  o.init_lr = a.lr_warmup_init;
  o.max_lr = a.lr;
  o.min_lr = a.min_lr;
  o.lr_decay_style = a.lr_decay_style;
  o.lr_wsd_decay_style = a.lr_wsd_decay_style;
  o.wd_incr_style = a.weight_decay_incr_style;
  o.use_checkpoint_opt_param_scheduler = a.use_checkpoint_opt_param_scheduler;
  o.override_opt_param_scheduler = a.override_opt_param_scheduler;
  o.decoupled_lr = a.decoupled_lr;
  o.decoupled_min_lr = a.decoupled_min_lr;
  weight_decay_range(a, o);
  const int64_t gbs = a.global_batch_size;
  if (a.train_samples > 0) {  // sample-based: every length is in samples
    only_with(a.lr_decay_iters != 0, "lr-decay-iters", "iteration-based (--train-iters)", "lr-decay-samples");
    only_with(a.lr_warmup_iters != 0, "lr-warmup-iters", "iteration-based (--train-iters)", "lr-warmup-samples");
    only_with(a.lr_wsd_decay_iters != 0, "lr-wsd-decay-iters", "iteration-based (--train-iters)",
              "lr-wsd-decay-samples");
    if (a.lr_warmup_fraction != 0 && a.lr_warmup_samples != 0)
      LATTICE_FAIL() << "--lr-warmup-fraction and --lr-warmup-samples are exclusive";
    o.lr_decay_steps = a.lr_decay_samples != 0 ? a.lr_decay_samples : a.train_samples;
    o.wd_incr_steps = a.train_samples;
    if (a.lr_wsd_decay_samples != 0) o.wsd_decay_steps = a.lr_wsd_decay_samples;
    o.lr_warmup_steps = a.lr_warmup_fraction != 0 ? a.lr_warmup_fraction * double(o.lr_decay_steps)
                                                  : double(a.lr_warmup_samples);
  } else {  // iteration-based: lengths in iterations x global batch size
    only_with(a.lr_decay_samples != 0, "lr-decay-samples", "sample-based (--train-samples)", "lr-decay-iters");
    only_with(a.lr_warmup_samples != 0, "lr-warmup-samples", "sample-based (--train-samples)", "lr-warmup-iters");
    only_with(a.lr_wsd_decay_samples != 0, "lr-wsd-decay-samples", "sample-based (--train-samples)",
              "lr-wsd-decay-iters");
    if (a.lr_warmup_fraction != 0 && a.lr_warmup_iters != 0)
      LATTICE_FAIL() << "--lr-warmup-fraction and --lr-warmup-iters are exclusive";
    o.lr_decay_steps = (a.lr_decay_iters != 0 ? a.lr_decay_iters : a.train_iters) * gbs;
    o.wd_incr_steps = a.train_iters * gbs;
    if (a.lr_wsd_decay_iters != 0) o.wsd_decay_steps = a.lr_wsd_decay_iters * gbs;
    o.lr_warmup_steps = a.lr_warmup_fraction != 0 ? a.lr_warmup_fraction * double(o.lr_decay_steps)
                                                  : double(a.lr_warmup_iters * gbs);
  }
  return OptimizerParamScheduler(o);
}

std::vector<ScheduleRow> schedule_rows(const TrainArgs& args) {
  OptimizerParamScheduler sched = get_optimizer_param_scheduler(args);
  std::vector<ScheduleRow> rows;
  rows.reserve(size_t(args.train_iters) + 1);
  int64_t consumed = 0;
  for (int64_t it = 0; it <= args.train_iters; ++it) {
    rows.push_back({it, sched.num_steps(), sched.get_lr(), sched.get_wd(), sched.get_decoupled_lr()});
    const int64_t batch = args.batch_size_at(consumed);  // --rampup-batch-size: the step's own batch
    sched.step(batch);
    consumed += batch;
  }
  return rows;
}

}  // namespace lattice
