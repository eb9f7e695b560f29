// OptimizerParamScheduler against reference/megatron.md's worked examples and against an
// independent Python implementation of Megatron's schedule (tests/fixtures/sched), bit for
// bit; every constructor check; parameter groups; saved state and its load rules.
#include <gtest/gtest.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/opt_param_scheduler.h"
#include "train/lr_schedule.h"

namespace lattice {
namespace {

// `lattice train` flags: a tiny model plus the schedule flags under test.
TrainArgs train_args(const std::string& flags) {
  std::vector<std::string> words = {"lattice", "schedule", "--num-layers", "1", "--hidden-size", "8",
                                    "--num-attention-heads", "1", "--seq-length", "4", "--micro-batch-size",
                                    "1", "--mock-data", "--vocab-size", "16"};
  std::istringstream in(flags);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(int(argv.size()), argv.data(), 2);
}

double parse_double(const std::string& s) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  EXPECT_TRUE(ec == std::errc() && end == s.data() + s.size()) << s;
  return v;
}

// Bit equality (a and b are never NaN here).
bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// True when v, rounded to as many significant digits as `example` has, reads as `example`
// (megatron.md writes 1.65e-4 for Megatron's 0.00016499999999999997).
bool matches_to_last_digit(double v, const std::string& example) {
  std::string mantissa = example.substr(0, example.find_first_of("eE"));
  int digits = 0;
  bool leading = true;
  for (char c : mantissa) {
    if (c < '0' || c > '9') continue;
    if (leading && c == '0') continue;
    leading = false;
    ++digits;
  }
  char a[64], b[64];
  std::snprintf(a, sizeof a, "%.*e", digits - 1, v);
  std::snprintf(b, sizeof b, "%.*e", digits - 1, parse_double(example));
  return std::string(a) == b;
}

OptimizerParamScheduler at(const std::string& flags, int64_t iteration) {
  TrainArgs a = train_args(flags);
  OptimizerParamScheduler s = get_optimizer_param_scheduler(a);
  s.step(iteration * a.global_batch_size);
  return s;
}

const std::string kExample =
    "--global-batch-size 256 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 100 --lr-decay-iters 10000 "
    "--train-iters 10000 ";

struct WorkedExample {
  std::string flags;
  int64_t iteration;
  std::string example;   // as megatron.md writes it
  std::string megatron;  // Python's repr of Megatron's double
  bool weight_decay;
};

// Every worked example of reference/megatron.md.
const std::vector<WorkedExample>& worked_examples() {
  static const std::vector<WorkedExample> v = {
      {"--lr-decay-style constant", 50, "1.5e-4", "0.00015", false},
      {"--lr-decay-style linear", 50, "1.5e-4", "0.00015", false},
      {"--lr-decay-style cosine", 50, "1.5e-4", "0.00015", false},
      {"--lr-decay-style inverse-square-root", 50, "1.5e-4", "0.00015", false},
      {"--lr-decay-style WSD --lr-wsd-decay-iters 2000", 50, "1.5e-4", "0.00015", false},
      {"--lr-decay-style cosine", 5050, "1.65e-4", "0.00016499999999999997", false},
      {"--lr-decay-style linear", 2575, "2.325e-4", "0.00023249999999999996", false},
      {"--lr-decay-style inverse-square-root", 400, "1.5e-4", "0.00015", false},
      {"--lr-decay-style inverse-square-root", 2500, "6e-5", "5.9999999999999995e-05", false},
      {"--lr-decay-style WSD --lr-wsd-decay-iters 2000 --lr-wsd-decay-style exponential", 8500,
       "2.140840642370058e-4", "0.0002140840642370058", false},
      {"--lr-decay-style constant --lr-warmup-init 1e-5", 25, "8.25e-5", "8.249999999999999e-05", false},
      {"--weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.1", 2500, "0.025",
       "0.025", true},
      {"--weight-decay-incr-style cosine --start-weight-decay 0 --end-weight-decay 0.1", 2500,
       "0.014644660940672627", "0.014644660940672627", true},
  };
  return v;
}

TEST(SchedWorkedExamples, MatchMegatronBitForBitAndTheReferenceToItsLastDigit) {
  for (const WorkedExample& e : worked_examples()) {
    OptimizerParamScheduler s = at(kExample + e.flags, e.iteration);
    const double v = e.weight_decay ? s.get_wd() : s.get_lr();
    EXPECT_TRUE(same_double(v, parse_double(e.megatron)))
        << e.flags << " iter " << e.iteration << ": got " << v << " want " << e.megatron;
    EXPECT_TRUE(matches_to_last_digit(v, e.example)) << e.flags << " iter " << e.iteration << ": " << v;
  }
}

TEST(SchedWorkedExamples, DigitCheckCanFail) {
  EXPECT_FALSE(matches_to_last_digit(1.64e-4, "1.65e-4"));
  EXPECT_FALSE(matches_to_last_digit(0.014644660940672629, "0.014644660940672627"));
  EXPECT_TRUE(matches_to_last_digit(0.00016499999999999997, "1.65e-4"));
}

// Python's Megatron schedule for every style, at ~270 iterations each (fixture + script).
TEST(SchedReference, EveryStyleMatchesMegatronBitForBit) {
  std::ifstream in(std::string(LATTICE_SOURCE_DIR) + "/tests/fixtures/sched/reference.txt");
  ASSERT_TRUE(in) << "missing tests/fixtures/sched/reference.txt";
  std::string line, name;
  std::vector<ScheduleRow> rows;
  int cases = 0, checked = 0;
  std::map<std::string, bool> seen_style;
  while (std::getline(in, line)) {
    if (line.rfind("case ", 0) == 0) {
      std::istringstream ls(line.substr(5));
      ls >> name;
      std::string flags;
      std::getline(ls, flags);
      rows = schedule_rows(train_args(flags));
      ++cases;
      continue;
    }
    std::istringstream ls(line);
    int64_t it;
    std::string lr, wd, dlr;
    ls >> it >> lr >> wd >> dlr;
    ASSERT_LT(size_t(it), rows.size()) << name;
    const ScheduleRow& r = rows[size_t(it)];
    ASSERT_EQ(r.iteration, it);
    EXPECT_TRUE(same_double(r.lr, parse_double(lr))) << name << " iter " << it << ": lr " << r.lr << " want " << lr;
    EXPECT_TRUE(same_double(r.weight_decay, parse_double(wd))) << name << " iter " << it << ": wd " << wd;
    ASSERT_EQ(r.decoupled_lr.has_value(), !dlr.empty()) << name;
    if (!dlr.empty())
      EXPECT_TRUE(same_double(*r.decoupled_lr, parse_double(dlr))) << name << " iter " << it << ": " << dlr;
    ++checked;
  }
  EXPECT_EQ(cases, 18);
  EXPECT_GT(checked, 4000);
}

OptimizerParamSchedulerOptions valid_options() {
  OptimizerParamSchedulerOptions o;
  o.max_lr = 3e-4;
  o.min_lr = 3e-5;
  o.lr_warmup_steps = 25600;
  o.lr_decay_steps = 2560000;
  o.lr_decay_style = "cosine";
  o.start_wd = o.end_wd = 0.01;
  o.wd_incr_steps = 2560000;
  return o;
}

std::string constructor_error(const std::function<void(OptimizerParamSchedulerOptions&)>& change) {
  OptimizerParamSchedulerOptions o = valid_options();
  change(o);
  try {
    OptimizerParamScheduler s(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SchedConstructor, EveryCheckIsAnErrorNamingTheFlag) {
  EXPECT_EQ(constructor_error([](auto&) {}), "");
  struct Case {
    std::function<void(OptimizerParamSchedulerOptions&)> change;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](auto& o) { o.min_lr = -1e-5; }, "--min-lr must be >= 0"},
      {[](auto& o) { o.max_lr = 1e-5; }, "--lr (1e-05) must be >= --min-lr (3e-05)"},
      {[](auto& o) { o.init_lr = 1e-3; }, "--lr-warmup-init (0.001) must be <= --lr (0.0003)"},
      {[](auto& o) { o.lr_decay_steps = 0; }, "learning-rate decay must be positive"},
      {[](auto& o) { o.lr_warmup_steps = 2560000; }, "must be shorter than the decay"},
      {[](auto& o) { o.lr_warmup_steps = -1; }, "warmup must be >= 0"},
      {[](auto& o) { o.lr_decay_style = "WSD"; }, "--lr-decay-style WSD needs --lr-wsd-decay-iters"},
      {[](auto& o) { o.lr_decay_style = "WSD"; o.wsd_decay_steps = 0; }, "--lr-wsd-decay-iters/-samples must be positive"},
      {[](auto& o) { o.lr_decay_style = "WSD"; o.wsd_decay_steps = 10; o.lr_wsd_decay_style = "step"; },
       "--lr-wsd-decay-style must be exponential, linear, cosine or minus_sqrt, got 'step'"},
      {[](auto& o) { o.lr_decay_style = "Cosine"; }, "--lr-decay-style must be constant, linear, cosine"},
      {[](auto& o) { o.start_wd = -0.1; o.wd_incr_style = "linear"; }, "--start-weight-decay must be >= 0"},
      {[](auto& o) { o.start_wd = 0.2; o.end_wd = 0.1; o.wd_incr_style = "linear"; },
       "--end-weight-decay (0.1) must be >= --start-weight-decay (0.2)"},
      {[](auto& o) { o.wd_incr_style = "exp"; }, "--weight-decay-incr-style must be constant, linear or cosine"},
      {[](auto& o) { o.start_wd = 0; }, "constant needs equal start and end weight decay"},
      {[](auto& o) { o.start_wd = 0; o.wd_incr_style = "linear"; o.wd_incr_steps = 0; },
       "needs a positive number of training samples"},
      {[](auto& o) { o.override_opt_param_scheduler = o.use_checkpoint_opt_param_scheduler = true; },
       "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are exclusive"},
      {[](auto& o) { o.decoupled_min_lr = 1e-5; }, "--decoupled-min-lr needs --decoupled-lr"},
      {[](auto& o) { o.decoupled_lr = 1e-5; }, "--decoupled-lr (1e-05) must be >= its minimum (3e-05"},
      {[](auto& o) { o.decoupled_lr = 1e-3; o.decoupled_min_lr = -1; }, "--decoupled-min-lr must be >= 0"},
      {[](auto& o) { o.decoupled_lr = 1e-4; o.init_lr = 2e-4; }, "--lr-warmup-init (0.0002) must be <= --decoupled-lr"},
  };
  for (const Case& c : cases) {
    const std::string msg = constructor_error(c.change);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "got '" << msg << "', want '" << c.expect << "'";
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(SchedSteps, CountSamplesAndNeverGoBack) {
  OptimizerParamScheduler s(valid_options());
  EXPECT_EQ(s.num_steps(), 0);
  EXPECT_EQ(s.get_lr(), 0.0);  // warmup from init_lr 0
  s.step(256);
  s.step(256);
  EXPECT_EQ(s.num_steps(), 512);
  EXPECT_TRUE(same_double(s.get_lr(), 0.0 + (3e-4 - 0.0) * 512.0 / 25600.0));
  EXPECT_THROW(s.step(-1), Error);
  // Past the decay: min_lr for decaying styles, max_lr for constant.
  s.step(3000000);
  EXPECT_EQ(s.get_lr(), 3e-5);
  OptimizerParamSchedulerOptions c = valid_options();
  c.lr_decay_style = "constant";
  OptimizerParamScheduler k(c);
  k.step(3000000);
  EXPECT_EQ(k.get_lr(), 3e-4);
}

ParamInfo param(const std::string& name, bool weight_decay) {
  ParamInfo p;
  p.name = name;
  p.weight_decay = weight_decay;
  return p;
}

TEST(SchedParamGroups, DecoupledLrForEmbeddingAndOutputAndWdMultZeroForBiases) {
  OptimizerParamSchedulerOptions o = valid_options();
  o.lr_decay_style = "linear";
  o.decoupled_lr = 1e-3;
  o.decoupled_min_lr = 1e-4;
  o.start_wd = 0;
  o.end_wd = 0.1;
  o.wd_incr_style = "linear";
  OptimizerParamScheduler s(o);
  s.step(1280000);
  const double lr = s.get_lr(), wd = s.get_wd();
  const double dlr = s.get_decoupled_lr().value();
  EXPECT_GT(lr, 3e-5);
  EXPECT_LT(lr, 3e-4);
  EXPECT_GT(dlr, 1e-4);
  EXPECT_LT(dlr, 1e-3);
  EXPECT_GT(wd, 0);
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    EXPECT_EQ(s.lr_for(param(name, true)), dlr) << name;
    EXPECT_EQ(s.wd_for(param(name, true)), wd) << name;
    EXPECT_TRUE(s.param_group(param(name, true)).is_decoupled_lr);
  }
  for (const char* name : {"embedding.position_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight"}) {
    EXPECT_EQ(s.lr_for(param(name, true)), lr) << name;
    EXPECT_EQ(s.wd_for(param(name, true)), wd) << name;
  }
  EXPECT_EQ(s.lr_for(param("decoder.layers.0.mlp.linear_fc1.bias", false)), lr);
  EXPECT_EQ(s.wd_for(param("decoder.layers.0.mlp.linear_fc1.bias", false)), 0.0);
  // Without --decoupled-lr the embedding is in the default group.
  OptimizerParamScheduler plain(valid_options());
  EXPECT_FALSE(plain.get_decoupled_lr().has_value());
  EXPECT_EQ(plain.lr_for(param("embedding.word_embeddings.weight", true)), plain.get_lr());
}

TEST(SchedState, JsonRoundTripKeepsEveryFieldExactly) {
  OptimizerParamSchedulerOptions o = valid_options();
  o.lr_warmup_steps = 0.013 * 480000;  // fractional (--lr-warmup-fraction)
  o.lr_decay_steps = 480000;
  OptimizerParamScheduler s(o);
  s.step(4800);
  const OptimizerParamSchedulerState st = s.state();
  const nlohmann::json j = nlohmann::json::parse(st.to_json().dump());
  for (const char* f : {"max_lr", "lr_warmup_steps", "num_steps", "lr_decay_style", "lr_decay_steps", "min_lr",
                        "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"})
    EXPECT_TRUE(j.contains(f)) << f;
  const auto back = OptimizerParamSchedulerState::from_json(j, "ckpt");
  EXPECT_TRUE(same_double(back.lr_warmup_steps, o.lr_warmup_steps));
  EXPECT_EQ(back.num_steps, 4800);
  EXPECT_EQ(back.lr_decay_style, "cosine");
  OptimizerParamScheduler fresh(o);
  fresh.load_state(back, "ckpt");
  EXPECT_EQ(fresh.num_steps(), 4800);
  EXPECT_TRUE(same_double(fresh.get_lr(), s.get_lr()));
}

std::string from_json_error(nlohmann::json j) {
  try {
    OptimizerParamSchedulerState::from_json(j, "iter_0000010/scheduler.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SchedState, CorruptedStateNamesFileAndField) {
  OptimizerParamScheduler s(valid_options());
  nlohmann::json good = s.state().to_json();
  EXPECT_EQ(from_json_error(good), "");
  nlohmann::json missing = good;
  missing.erase("lr_decay_steps");
  EXPECT_NE(from_json_error(missing).find("iter_0000010/scheduler.json: learning-rate scheduler state lacks field lr_decay_steps"),
            std::string::npos);
  nlohmann::json wrong = good;
  wrong["max_lr"] = "3e-4";
  EXPECT_NE(from_json_error(wrong).find("field max_lr is not a number"), std::string::npos);
  wrong = good;
  wrong["num_steps"] = 1.5;
  EXPECT_NE(from_json_error(wrong).find("field num_steps is not an integer"), std::string::npos);
  EXPECT_NE(from_json_error(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
}

// A checkpoint written with decay 10000 iterations, loaded with flags saying 20000.
struct LoadCase {
  OptimizerParamSchedulerState saved;
  OptimizerParamSchedulerOptions flags;
};

LoadCase mismatched() {
  OptimizerParamScheduler writer(valid_options());
  writer.step(256 * 500);
  LoadCase c{writer.state(), valid_options()};
  c.flags.lr_decay_steps = 2 * 2560000;
  c.flags.max_lr = 6e-4;
  return c;
}

TEST(SchedState, MismatchWithoutEitherFlagIsAnErrorNamingTheFieldAndChangesNothing) {
  LoadCase c = mismatched();
  OptimizerParamScheduler s(c.flags);
  std::string msg;
  try {
    s.load_state(c.saved, "ckpt/iter_0000500");
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("ckpt/iter_0000500: learning-rate scheduler field max_lr is 0.0003 in the checkpoint but "
                     "0.0006 from the flags"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--override-opt_param-scheduler"), std::string::npos);
  EXPECT_EQ(s.num_steps(), 0);
  EXPECT_EQ(s.options().max_lr, 6e-4);
  // Only the decay differs: the error names lr_decay_steps.
  c.flags.max_lr = 3e-4;
  OptimizerParamScheduler t(c.flags);
  try {
    t.load_state(c.saved, "ckpt");
    msg.clear();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("field lr_decay_steps is 2560000 in the checkpoint but 5120000"), std::string::npos) << msg;
  // A different style too.
  c.flags.lr_decay_steps = 2560000;
  c.flags.lr_decay_style = "linear";
  OptimizerParamScheduler u(c.flags);
  EXPECT_THROW(u.load_state(c.saved, "ckpt"), Error);
  // Same flags: loads.
  OptimizerParamScheduler v(valid_options());
  v.load_state(c.saved, "ckpt");
  EXPECT_EQ(v.num_steps(), 256 * 500);
}

TEST(SchedState, OverrideKeepsTheFlagsIncludingGroupLrs) {
  LoadCase c = mismatched();
  c.flags.override_opt_param_scheduler = true;
  c.flags.decoupled_lr = 1e-3;
  OptimizerParamScheduler s(c.flags);
  s.load_state(c.saved, "ckpt");
  EXPECT_EQ(s.num_steps(), 256 * 500);  // the position always comes from the checkpoint
  EXPECT_EQ(s.options().max_lr, 6e-4);
  EXPECT_EQ(s.options().lr_decay_steps, 2 * 2560000);
  OptimizerParamScheduler expect(c.flags);
  expect.step(256 * 500);
  EXPECT_TRUE(same_double(s.get_lr(), expect.get_lr()));
  EXPECT_TRUE(same_double(s.lr_for(param("output_layer.weight", true)), *expect.get_decoupled_lr()));
}

TEST(SchedState, UseCheckpointTakesTheCheckpointsValues) {
  LoadCase c = mismatched();
  c.flags.use_checkpoint_opt_param_scheduler = true;
  OptimizerParamScheduler s(c.flags);
  s.load_state(c.saved, "ckpt");
  EXPECT_EQ(s.options().max_lr, 3e-4);
  EXPECT_EQ(s.options().lr_decay_steps, 2560000);
  OptimizerParamScheduler expect(valid_options());
  expect.step(256 * 500);
  EXPECT_TRUE(same_double(s.get_lr(), expect.get_lr()));
}

TEST(SchedState, CheckpointValuesThatBreakTheScheduleAreRejected) {
  LoadCase c = mismatched();
  c.flags.use_checkpoint_opt_param_scheduler = true;
  c.flags.max_lr = 3e-4;
  c.saved.min_lr = 1e-3;  // above the flags' --lr... and the checkpoint's max_lr
  OptimizerParamScheduler s(c.flags);
  std::string msg;
  try {
    s.load_state(c.saved, "ckpt");
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("ckpt: the checkpoint's learning-rate schedule does not hold with these flags: --lr (0.0003) "
                     "must be >= --min-lr (0.001)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(s.num_steps(), 0);
  c.saved.min_lr = 3e-5;
  c.saved.num_steps = -5;
  EXPECT_THROW(s.load_state(c.saved, "ckpt"), Error);
}

}  // namespace
}  // namespace lattice
