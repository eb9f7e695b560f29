#include "optim/opt_param_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "core/error.h"

// Megatron's schedule is Python: every * and + rounds on its own. A fused multiply-add
// (GCC contracts a + b * c by default, and -march=native has FMA) changes the last bit,
// so contraction is off for the code below (tests/unit/test_sched_scheduler.cpp catches it).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace lattice {
namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}

// Python's `x ** 0.5` on a float is C's pow(x, 0.5); sqrt could differ in the last bit.
double py_sqrt(double x) { return std::pow(x, 0.5); }

}  // namespace

OptimizerParamScheduler::OptimizerParamScheduler(const OptimizerParamSchedulerOptions& options)
    : opt_(options) {
  check();
}

// Megatron's constructor asserts, in its order, plus the choices argparse enforces and the
// checks that keep every division below away from zero.
void OptimizerParamScheduler::check() const {
  const auto& o = opt_;
  if (!(o.min_lr >= 0)) LATTICE_FAIL() << "--min-lr must be >= 0, got " << o.min_lr;
  if (!(o.max_lr >= o.min_lr))
    LATTICE_FAIL() << "--lr (" << o.max_lr << ") must be >= --min-lr (" << o.min_lr << ")";
  if (!(o.init_lr <= o.max_lr))
    LATTICE_FAIL() << "--lr-warmup-init (" << o.init_lr << ") must be <= --lr (" << o.max_lr << ")";
  if (!(o.lr_decay_steps > 0))
    LATTICE_FAIL() << "the learning-rate decay must be positive (--lr-decay-iters/--lr-decay-samples or "
                      "--train-iters give "
                   << o.lr_decay_steps << " samples)";
  if (!(o.lr_warmup_steps >= 0))
    LATTICE_FAIL() << "the learning-rate warmup must be >= 0 samples, got " << o.lr_warmup_steps;
  if (!(o.lr_warmup_steps < double(o.lr_decay_steps)))
    LATTICE_FAIL() << "the warmup (" << o.lr_warmup_steps << " samples, --lr-warmup-iters/-samples/-fraction) "
                   << "must be shorter than the decay (" << o.lr_decay_steps
                   << " samples, --lr-decay-iters/-samples or --train-iters)";
  if (!one_of(o.lr_decay_style, {"constant", "linear", "cosine", "inverse-square-root", "WSD"}))
    LATTICE_FAIL() << "--lr-decay-style must be constant, linear, cosine, inverse-square-root or WSD, got '"
                   << o.lr_decay_style << "'";
  if (o.lr_decay_style == "WSD") {
    if (!o.wsd_decay_steps)
      LATTICE_FAIL() << "--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)";
    if (!(*o.wsd_decay_steps > 0))
      LATTICE_FAIL() << "--lr-wsd-decay-iters/-samples must be positive, got " << *o.wsd_decay_steps
                     << " samples";
    if (!one_of(o.lr_wsd_decay_style, {"exponential", "linear", "cosine", "minus_sqrt"}))
      LATTICE_FAIL() << "--lr-wsd-decay-style must be exponential, linear, cosine or minus_sqrt, got '"
                     << o.lr_wsd_decay_style << "'";
  }
  if (!(o.start_wd >= 0)) LATTICE_FAIL() << "--start-weight-decay must be >= 0, got " << o.start_wd;
  if (!(o.end_wd >= o.start_wd))
    LATTICE_FAIL() << "--end-weight-decay (" << o.end_wd << ") must be >= --start-weight-decay ("
                   << o.start_wd << ")";
  if (!one_of(o.wd_incr_style, {"constant", "linear", "cosine"}))
    LATTICE_FAIL() << "--weight-decay-incr-style must be constant, linear or cosine, got '"
                   << o.wd_incr_style << "'";
  if (o.wd_incr_style == "constant" && o.start_wd != o.end_wd)
    LATTICE_FAIL() << "--weight-decay-incr-style constant needs equal start and end weight decay (got "
                   << o.start_wd << " and " << o.end_wd << ")";
  if (o.wd_incr_style != "constant" && !(o.wd_incr_steps > 0))
    LATTICE_FAIL() << "--weight-decay-incr-style " << o.wd_incr_style
                   << " needs a positive number of training samples, got " << o.wd_incr_steps;
  if (o.override_opt_param_scheduler && o.use_checkpoint_opt_param_scheduler)
    LATTICE_FAIL() << "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are exclusive";
  if (o.decoupled_min_lr && !o.decoupled_lr)
    LATTICE_FAIL() << "--decoupled-min-lr needs --decoupled-lr";
  if (o.decoupled_lr) {
    const double dmin = o.decoupled_min_lr.value_or(o.min_lr);
    if (!(dmin >= 0)) LATTICE_FAIL() << "--decoupled-min-lr must be >= 0, got " << dmin;
    if (!(*o.decoupled_lr >= dmin))
      LATTICE_FAIL() << "--decoupled-lr (" << *o.decoupled_lr << ") must be >= its minimum ("
                     << dmin << ", --decoupled-min-lr or --min-lr)";
    if (!(o.init_lr <= *o.decoupled_lr))
      LATTICE_FAIL() << "--lr-warmup-init (" << o.init_lr << ") must be <= --decoupled-lr ("
                     << *o.decoupled_lr << ")";
  }
}

void OptimizerParamScheduler::step(int64_t increment) {
  LATTICE_CHECK(increment >= 0) << "OptimizerParamScheduler::step: negative increment " << increment;
  num_steps_ += increment;
}

double OptimizerParamScheduler::get_lr(const ParamGroup& group) const {
  const double max_lr = group.max_lr, min_lr = group.min_lr;
  const double n = double(num_steps_), W = opt_.lr_warmup_steps, D = double(opt_.lr_decay_steps);
  // Linear warmup from init_lr.
  if (W > 0 && n <= W) return opt_.init_lr + (max_lr - opt_.init_lr) * n / W;
  // Constant never reaches min_lr.
  if (opt_.lr_decay_style == "constant") return max_lr;
  if (n > D) return min_lr;
  if (opt_.lr_decay_style == "inverse-square-root") {
    const double lr = max_lr * py_sqrt(std::max(W, 1.0)) / py_sqrt(std::max(n, 1.0));
    return std::max(min_lr, lr);
  }
  const double decay_ratio = (n - W) / (D - W);
  LATTICE_CHECK(decay_ratio >= 0.0 && decay_ratio <= 1.0) << "decay ratio " << decay_ratio;
  const double delta_lr = max_lr - min_lr;
  double coeff = 0;
  if (opt_.lr_decay_style == "linear") {
    coeff = 1.0 - decay_ratio;
  } else if (opt_.lr_decay_style == "cosine") {
    coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
  } else {  // WSD: stable at max_lr, then anneal over the last wsd_decay_steps samples
    const double wsd_steps = double(*opt_.wsd_decay_steps);
    const double anneal_start = D - wsd_steps;
    if (n <= anneal_start) {
      coeff = 1.0;
    } else {
      const double q = (n - anneal_start) / wsd_steps;
      const std::string& s = opt_.lr_wsd_decay_style;
      if (s == "linear") coeff = 1.0 - q;
      else if (s == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * q) + 1.0);
      else if (s == "exponential") coeff = 2.0 * std::pow(0.5, q) - 1.0;
      else coeff = 1.0 - std::sqrt(q);  // minus_sqrt (Megatron: math.sqrt)
    }
  }
  return min_lr + coeff * delta_lr;
}

double OptimizerParamScheduler::get_wd() const {
  if (num_steps_ > opt_.wd_incr_steps) return opt_.end_wd;
  if (opt_.wd_incr_style == "constant") return opt_.end_wd;
  const double incr_ratio = double(num_steps_) / double(opt_.wd_incr_steps);
  const double delta_wd = opt_.end_wd - opt_.start_wd;
  const double coeff = opt_.wd_incr_style == "linear"
                           ? incr_ratio
                           : 0.5 * (std::cos(std::numbers::pi * (1 - incr_ratio)) + 1.0);
  return opt_.start_wd + coeff * delta_wd;
}

std::optional<double> OptimizerParamScheduler::get_decoupled_lr() const {
  if (!opt_.decoupled_lr) return std::nullopt;
  ParamGroup g = default_group();
  g.is_decoupled_lr = true;
  g.max_lr = *opt_.decoupled_lr;
  g.min_lr = opt_.decoupled_min_lr.value_or(opt_.min_lr);
  return get_lr(g) * g.lr_mult;
}

ParamGroup OptimizerParamScheduler::default_group() const {
  ParamGroup g;
  g.max_lr = opt_.max_lr;
  g.min_lr = opt_.min_lr;
  return g;
}

bool OptimizerParamScheduler::is_embedding_or_output_parameter(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

ParamGroup OptimizerParamScheduler::param_group(const ParamInfo& p) const {
  ParamGroup g = default_group();
  g.wd_mult = p.weight_decay ? 1.0 : 0.0;
  if (opt_.decoupled_lr && is_embedding_or_output_parameter(p.name)) {
    g.is_decoupled_lr = true;
    g.max_lr = *opt_.decoupled_lr;
    g.min_lr = opt_.decoupled_min_lr.value_or(opt_.min_lr);
  }
  return g;
}

double OptimizerParamScheduler::lr_for(const ParamInfo& p) const {
  const ParamGroup g = param_group(p);
  return get_lr(g) * g.lr_mult;
}

double OptimizerParamScheduler::wd_for(const ParamInfo& p) const {
  return get_wd() * param_group(p).wd_mult;
}

OptimizerParamSchedulerState OptimizerParamScheduler::state() const {
  OptimizerParamSchedulerState s;
  s.max_lr = opt_.max_lr;
  s.lr_warmup_steps = opt_.lr_warmup_steps;
  s.num_steps = num_steps_;
  s.lr_decay_style = opt_.lr_decay_style;
  s.lr_decay_steps = opt_.lr_decay_steps;
  s.min_lr = opt_.min_lr;
  s.start_wd = opt_.start_wd;
  s.end_wd = opt_.end_wd;
  s.wd_incr_style = opt_.wd_incr_style;
  s.wd_incr_steps = opt_.wd_incr_steps;
  return s;
}

namespace {

// Megatron's _check_and_set for one field.
template <class T>
T check_and_set(const OptimizerParamSchedulerOptions& o, const T& flags_value, const T& saved_value,
                const char* name, const std::string& where) {
  if (o.override_opt_param_scheduler) return flags_value;
  if (!o.use_checkpoint_opt_param_scheduler && !(flags_value == saved_value)) {
    std::ostringstream msg;
    msg << where << ": learning-rate scheduler field " << name << " is " << nlohmann::json(saved_value).dump()
        << " in the checkpoint but " << nlohmann::json(flags_value).dump()
        << " from the flags (pass --override-opt_param-scheduler to keep the flags' value or "
           "--use-checkpoint-opt_param-scheduler to take the checkpoint's)";
    LATTICE_FAIL() << msg.str();
  }
  return saved_value;
}

}  // namespace

void OptimizerParamScheduler::load_state(const OptimizerParamSchedulerState& saved, const std::string& where) {
  // Decide every field first, so a mismatch leaves this scheduler unchanged.
  OptimizerParamSchedulerOptions o = opt_;
  o.max_lr = check_and_set(opt_, opt_.max_lr, saved.max_lr, "max_lr", where);
  o.min_lr = check_and_set(opt_, opt_.min_lr, saved.min_lr, "min_lr", where);
  o.lr_warmup_steps = check_and_set(opt_, opt_.lr_warmup_steps, saved.lr_warmup_steps, "lr_warmup_steps", where);
  o.lr_decay_steps = check_and_set(opt_, opt_.lr_decay_steps, saved.lr_decay_steps, "lr_decay_steps", where);
  o.lr_decay_style = check_and_set(opt_, opt_.lr_decay_style, saved.lr_decay_style, "lr_decay_style", where);
  o.start_wd = check_and_set(opt_, opt_.start_wd, saved.start_wd, "start_wd", where);
  o.end_wd = check_and_set(opt_, opt_.end_wd, saved.end_wd, "end_wd", where);
  o.wd_incr_steps = check_and_set(opt_, opt_.wd_incr_steps, saved.wd_incr_steps, "wd_incr_steps", where);
  o.wd_incr_style = check_and_set(opt_, opt_.wd_incr_style, saved.wd_incr_style, "wd_incr_style", where);
  if (saved.num_steps < 0)
    LATTICE_FAIL() << where << ": learning-rate scheduler field num_steps is negative (" << saved.num_steps << ")";
  // Checkpoint values mixed with the flags' must still make a valid schedule.
  try {
    OptimizerParamScheduler merged(o);
  } catch (const Error& e) {
    LATTICE_FAIL() << where << ": the checkpoint's learning-rate schedule does not hold with these flags: "
                   << e.what();
  }
  opt_ = o;
  num_steps_ = saved.num_steps;
}

nlohmann::json OptimizerParamSchedulerState::to_json() const {
  return {{"max_lr", max_lr},           {"lr_warmup_steps", lr_warmup_steps},
          {"num_steps", num_steps},     {"lr_decay_style", lr_decay_style},
          {"lr_decay_steps", lr_decay_steps}, {"min_lr", min_lr},
          {"start_wd", start_wd},       {"end_wd", end_wd},
          {"wd_incr_style", wd_incr_style}, {"wd_incr_steps", wd_incr_steps}};
}

OptimizerParamSchedulerState OptimizerParamSchedulerState::from_json(const nlohmann::json& j,
                                                                     const std::string& where) {
  if (!j.is_object()) LATTICE_FAIL() << where << ": learning-rate scheduler state is not a JSON object";
  auto field = [&](const char* name) -> const nlohmann::json& {
    auto it = j.find(name);
    if (it == j.end()) LATTICE_FAIL() << where << ": learning-rate scheduler state lacks field " << name;
    return *it;
  };
  auto number = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_number()) LATTICE_FAIL() << where << ": learning-rate scheduler field " << name << " is not a number";
    return v.get<double>();
  };
  auto integer = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_number_integer())
      LATTICE_FAIL() << where << ": learning-rate scheduler field " << name << " is not an integer";
    return v.get<int64_t>();
  };
  auto text = [&](const char* name) {
    const auto& v = field(name);
    if (!v.is_string()) LATTICE_FAIL() << where << ": learning-rate scheduler field " << name << " is not a string";
    return v.get<std::string>();
  };
  OptimizerParamSchedulerState s;
  s.max_lr = number("max_lr");
  s.lr_warmup_steps = number("lr_warmup_steps");
  s.num_steps = integer("num_steps");
  s.lr_decay_style = text("lr_decay_style");
  s.lr_decay_steps = integer("lr_decay_steps");
  s.min_lr = number("min_lr");
  s.start_wd = number("start_wd");
  s.end_wd = number("end_wd");
  s.wd_incr_style = text("wd_incr_style");
  s.wd_incr_steps = integer("wd_incr_steps");
  return s;
}

}  // namespace lattice
