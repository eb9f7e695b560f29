// Megatron's result checks (train/result_validation.h): the large-value tracker's sampling and
// threshold, the validator's decisions, messages and tracker lines, its checkpointed state, and the
// tracker file's skip rule.
#include "train/result_validation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"
#include "train/train_step.h"
#include "test_util.h"

namespace lattice {
namespace {

using test_util::error_of;

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

TEST(LargeValueTracker, SamplesTheFirstValuesThenRejectsTenTimesTheirLargestMagnitude) {
  LargeValueTracker t(10.0, 3);
  EXPECT_FALSE(t.is_unexpectedly_large(1.0));
  EXPECT_FALSE(t.is_unexpectedly_large(-4.0));  // magnitudes: the largest is 4
  EXPECT_FALSE(t.is_unexpectedly_large(1000.0));  // still a sample: never rejected, and now the largest
  EXPECT_EQ(t.count(), 3);
  EXPECT_EQ(t.max(), 1000.0);
  EXPECT_FALSE(t.is_unexpectedly_large(9999.0));
  EXPECT_TRUE(t.is_unexpectedly_large(10000.0));   // >= 10 x 1000
  EXPECT_TRUE(t.is_unexpectedly_large(-10000.0));  // by magnitude
  EXPECT_EQ(t.max(), 1000.0);  // rejected values are not sampled
}

TEST(LargeValueTracker, NanAndInfAreNeitherSampledNorRejected) {
  LargeValueTracker t(10.0, 2);
  EXPECT_FALSE(t.is_unexpectedly_large(std::nan("")));
  EXPECT_FALSE(t.is_unexpectedly_large(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(t.count(), 0);
  t.is_unexpectedly_large(2.0);
  t.is_unexpectedly_large(1.0);
  EXPECT_FALSE(t.is_unexpectedly_large(std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(t.is_unexpectedly_large(20.0));
}

StepResult step(double loss, double norm, std::vector<double> micro = {}) {
  StepResult r;
  r.lm_loss = loss;
  r.grad_norm = norm;
  r.micro_batch_loss_sums = std::move(micro);
  return r;
}

TEST(ResultValidator, SpikyLossNamesTheIterationAndMicroBatchInGlobalOrder) {
  ResultValidationConfig c;
  c.check_for_spiky_loss = true;
  ResultValidator v(c);
  EXPECT_TRUE(v.needs_micro_batch_losses());
  for (int64_t it = 0; it < 25; ++it) v.validate(step(3, 1, {60, 61, 70, 62}), it);  // 100 samples, largest 70
  v.validate(step(3, 1, {600, 699, 10, 1}), 25);
  const std::string e = error_of([&] { v.validate(step(3, 1, {10, 20, 700, 7000}), 26); });
  EXPECT_NE(e.find("iteration 27: micro-batch 2's loss (the sum of its token losses) 700 is 10 or more times the "
                   "largest of the first 100 micro-batches' (70) (--check-for-spiky-loss)"),
            std::string::npos)
      << e;
}

TEST(ResultValidator, LargeGradsAfterOneHundredSteps) {
  ResultValidationConfig c;
  c.check_for_large_grads = true;
  ResultValidator v(c);
  EXPECT_FALSE(v.needs_micro_batch_losses());
  for (int64_t it = 0; it < 100; ++it) v.validate(step(3, it == 50 ? 5.0 : 1.0), it);
  v.validate(step(3, 49.9), 100);
  const std::string e = error_of([&] { v.validate(step(3, 50.0), 101); });
  EXPECT_NE(e.find("iteration 102: the gradient norm 50 is 10 or more times the largest of the first 100 steps' (5) "
                   "(--check-for-large-grads)"),
            std::string::npos)
      << e;
}

TEST(ResultValidator, NonFiniteLossOrNormUnlessTheCheckIsOff) {
  ResultValidationConfig c;
  c.check_for_nan = true;
  ResultValidator v(c);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(error_of([&] { v.validate(step(std::nan(""), std::nan("")), 1); }),
            "iteration 2: the loss is not finite (loss nan, gradient norm nan); stopped before its update "
            "(--no-check-for-nan-in-loss-and-grad trains on)");
  EXPECT_NE(error_of([&] { v.validate(step(3, inf), 4); }).find("iteration 5: the gradient norm is not finite (loss 3, gradient norm inf)"),
            std::string::npos);
  StepResult skipped = step(std::nan(""), std::nan(""));
  skipped.skipped = true;  // an fp16 overflow: nothing was updated, nothing is checked
  EXPECT_EQ(error_of([&] { v.validate(skipped, 1); }), "");
  ResultValidator off({});
  EXPECT_EQ(error_of([&] { off.validate(step(std::nan(""), inf, {1e30}), 1); }), "");
}

TEST(ResultValidator, RejectionsAppendMegatronsTrackerLine) {
  const std::string tracker = test_util::temp_dir() + "/tracker.txt";
  ResultValidationConfig c;
  c.check_for_nan = c.check_for_large_grads = true;
  c.tracker_file = tracker;
  c.write_tracker = true;
  ResultValidator v(c);
  EXPECT_TRUE(std::filesystem::exists(tracker));  // created at start, as Megatron checks it takes appends
  EXPECT_NE(error_of([&] { v.validate(step(std::nan(""), 1), 7); }), "");
  for (int64_t it = 0; it < 100; ++it) v.validate(step(3, 2), it);
  EXPECT_NE(error_of([&] { v.validate(step(3, 25), 100); }), "");
  const std::string text = read_all(tracker);
  const std::regex line(
      R"(ts=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} node=\S+ device=0 jobID=\S+ rank=0 iteration=(\d+) status=rerun_disabled result=(\S+) message='([^']*)')");
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 2u) << text;
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, line)) << lines[0];
  EXPECT_EQ(m[1].str(), "7");
  EXPECT_EQ(m[2].str(), "nan");
  EXPECT_EQ(m[3].str(), "found NaN in the loss");
  ASSERT_TRUE(std::regex_match(lines[1], m, line)) << lines[1];
  EXPECT_EQ(m[1].str(), "100");
  EXPECT_EQ(m[2].str(), "25");
  EXPECT_EQ(m[3].str(), "found unexpected large grads");
  // Only the writing rank appends.
  ResultValidationConfig quiet = c;
  quiet.write_tracker = false;
  ResultValidator other(quiet);
  EXPECT_NE(error_of([&] { other.validate(step(std::nan(""), 1), 8); }), "");
  EXPECT_EQ(read_all(tracker), text);
}

TEST(ResultValidator, UnwritableTrackerFileIsNamed) {
  ResultValidationConfig c;
  c.tracker_file = "/nonexistent-dir/tracker.txt";
  c.write_tracker = true;
  EXPECT_NE(error_of([&] { ResultValidator v(c); }).find("--result-rejected-tracker-filename /nonexistent-dir/tracker.txt: cannot be appended to"),
            std::string::npos);
}

TEST(ResultValidator, StateRestoresTheSamplesAndRejectsDamage) {
  ResultValidationConfig c;
  c.check_for_spiky_loss = c.check_for_large_grads = true;
  ResultValidator a(c);
  for (int64_t it = 0; it < 60; ++it) a.validate(step(3, 1 + it % 3, {50, 40}), it);  // loss full, grads 60 of 100
  ResultValidator b(c);
  b.restore(a.state(), "ck");
  EXPECT_EQ(b.state(), a.state());
  // b continues as a does: 40 more gradient samples, then the check.
  for (int64_t it = 60; it < 100; ++it) b.validate(step(3, 2, {}), it);
  EXPECT_NE(error_of([&] { b.validate(step(3, 30, {}), 100); }).find("the gradient norm 30"), std::string::npos);
  ResultValidator fresh(c);
  fresh.restore(nullptr, "ck");  // a checkpoint without samples
  EXPECT_EQ(fresh.state()["large_value_counts"]["loss"], 0);

  nlohmann::json bad = a.state();
  bad["max_values"]["loss"] = -1.0;
  EXPECT_EQ(error_of([&] { fresh.restore(bad, "ck/iter_0000060"); }),
            "ck/iter_0000060: rerun_state_machine: 'loss' needs a count >= 0 and a finite maximum >= 0");
  bad = a.state();
  bad["large_value_counts"]["grads"] = "sixty";
  EXPECT_NE(error_of([&] { fresh.restore(bad, "ck"); }).find("'grads' needs a count"), std::string::npos);
  EXPECT_NE(error_of([&] { fresh.restore(nlohmann::json::object(), "ck"); }).find("needs large_value_counts and max_values"),
            std::string::npos);
}

TEST(TrackerFile, SkipsIterationsRejectedTwiceOnOneRankOrReproducedOnASecondRerun) {
  const std::string dir = test_util::temp_dir();
  EXPECT_TRUE(iterations_to_skip_from_tracker_file(dir + "/missing.txt").empty());
  const std::string path = dir + "/t.txt";
  std::ofstream(path) << "ts=2026-01-01 00:00:00.1 node=a device=0 jobID=1 rank=0 iteration=4 status=rerun_disabled result=nan message='x'\n"
                         "ts=2026-01-01 00:00:00.2 node=a device=0 jobID=2 rank=0 iteration=4 status=RerunValidationStatus.RERUN_DISABLED result=nan message='x y'\n"
                         "ts=2026-01-01 00:00:00.3 node=a device=0 jobID=3 rank=0 iteration=9 status=rerun_disabled result=1 message='x'\n"
                         "ts=2026-01-01 00:00:00.4 node=a device=1 jobID=3 rank=1 iteration=9 status=rerun_disabled result=1 message='x'\n"
                         "\n"
                         "ts=2026-01-01 00:00:00.5 node=b device=0 jobID=4 rank=3 iteration=12 status=second_rerun_reproducible result=1 message='x'\n"
                         "ts=2026-01-01 00:00:00.6 node=b device=0 jobID=4 rank=3 iteration=13 status=first_rerun_reproducible result=1 message='x'\n";
  EXPECT_EQ(iterations_to_skip_from_tracker_file(path), (std::vector<int64_t>{4, 12}));
  std::ofstream(path, std::ios::app) << "rank=0 iteration=5\n";
  EXPECT_NE(error_of([&] { iterations_to_skip_from_tracker_file(path); }).find(path + " line 8: not a result-rejected record"),
            std::string::npos);
}

}  // namespace
}  // namespace lattice
