// --profile-ops on the trainer's side: the flag, the table (train/op_profile_report.h)
// and the profile window that skips the warm-up step and the time between steps.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/op_profiler.h"
#include "kernels/activation.h"
#include "train/arguments.h"
#include "train/op_profile_report.h"

namespace lattice {
namespace {

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(OpProfileTable, RowsPerIterationLongestFirstAndTheRemainder) {
  // Two iterations of 25 ms each; 20 ms of ops per iteration.
  const std::vector<OpProfileEntry> ops = {
      {"layernorm_forward", 8, 6.0}, {"gemm_f32", 20, 30.0}, {"gelu_forward", 4, 4.0}};
  const auto l = lines_of(format_op_profile(ops, 2, 50.0, "wall time"));
  ASSERT_EQ(l.size(), 6u) << format_op_profile(ops, 2, 50.0, "wall time");
  EXPECT_EQ(l[0], "> op profile (--profile-ops) over 2 iterations after the first, wall time:");
  EXPECT_EQ(l[1], "  op                         calls/iter      ms/iter  % of op time");
  EXPECT_EQ(l[2], "  gemm_f32                         10.0       15.000         75.0%");
  EXPECT_EQ(l[3], "  layernorm_forward                 4.0        3.000         15.0%");
  EXPECT_EQ(l[4], "  gelu_forward                      2.0        2.000         10.0%");
  EXPECT_EQ(l[5],
            "> op time per iteration 20.000 ms of 25.000 ms measured (80.0%); outside the ops (communication, host "
            "work, launch gaps): 5.000 ms");
}

TEST(OpProfileTable, LongNamesWidenTheColumn) {
  const std::string name = "a_kernel_with_a_name_longer_than_the_column";
  const auto l = lines_of(format_op_profile({{name, 3, 1.5}}, 1, 2.0, "x"));
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[2], "  " + name + "          3.0        1.500        100.0%");
  EXPECT_EQ(l[1].find("calls/iter"), l[2].find("3.0") - 7);  // columns line up
}

TEST(OpProfileTable, NoIterationProfiled) {
  EXPECT_EQ(format_op_profile({}, 0, 0.0, "x"),
            "> op profile (--profile-ops): no iteration profiled (the first one is warm-up: train 2 or more)");
}

TEST(OpProfileWindow, SkipsTheWarmUpStepAndTheTimeBetweenSteps) {
  std::vector<float> x(512, 0.5f);
  auto gelu = [&] { gelu_forward(x.data(), x.data(), int64_t(x.size()), GeluKind::erf); };
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(true);
    for (int step = 0; step < 3; ++step) {
      w.before_step();
      gelu();
      gelu();
      w.after_step(10.0);
      gelu();  // between steps (logging, evaluation): not profiled
    }
    EXPECT_FALSE(op_profiler_enabled());
    w.log_report();
  }
  const auto l = lines_of(testing::internal::GetCapturedStdout());
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "> op profile (--profile-ops) over 2 iterations after the first, wall time of each kernel call on "
                  "the host:");
  EXPECT_EQ(l[2].substr(0, 40), "  gelu_forward                      2.0 ");
  EXPECT_NE(l[3].find(" ms of 10.000 ms measured"), std::string::npos) << l[3];
  op_profiler_reset();
}

TEST(OpProfileWindow, OffLogsNothingAndNeverProfiles) {
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(false);
    for (int step = 0; step < 3; ++step) {
      w.before_step();
      EXPECT_FALSE(op_profiler_enabled());
      w.after_step(1.0);
    }
    w.log_report();
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

TrainArgs parse(std::vector<std::string> extra) {
  std::vector<std::string> words = {"lattice", "train", "--num-layers", "2", "--hidden-size", "64",
                                    "--num-attention-heads", "4", "--seq-length", "16",
                                    "--micro-batch-size", "2", "--mock-data", "--vocab-size", "100"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_train_args(int(argv.size()), argv.data(), 2);
}

TEST(TrainArgsProfileOps, FlagOffByDefaultAndNeedsTwoIterations) {
  EXPECT_FALSE(parse({"--train-iters", "3"}).profile_ops);
  EXPECT_TRUE(parse({"--train-iters", "3", "--profile-ops"}).profile_ops);
  try {
    parse({"--train-iters", "1", "--profile-ops"});
    FAIL() << "--profile-ops with one iteration was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--profile-ops needs 2 or more iterations (the first is warm-up), got 1");
  }
  EXPECT_NE(train_help().find("--profile-ops"), std::string::npos);
}

}  // namespace
}  // namespace lattice
