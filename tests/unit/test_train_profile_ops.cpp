// --profile-ops and --profile on the trainer's side: the flags, the table (train/op_profile_report.h)
// and the profile windows: the steps after the warm-up one, or Megatron's --profile-step-start/end
// window on the ranks of --profile-ranks, never the time between steps; --dataloader-type.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
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
  const auto l = lines_of(format_op_profile(ops, "> heading:", 2, 50.0));
  ASSERT_EQ(l.size(), 6u) << format_op_profile(ops, "> heading:", 2, 50.0);
  EXPECT_EQ(l[0], "> heading:");
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
  const auto l = lines_of(format_op_profile({{name, 3, 1.5}}, "x", 1, 2.0));
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[2], "  " + name + "          3.0        1.500        100.0%");
  EXPECT_EQ(l[1].find("calls/iter"), l[2].find("3.0") - 7);  // columns line up
}

TEST(OpProfileWindow, SkipsTheWarmUpStepAndTheTimeBetweenSteps) {
  std::vector<float> x(512, 0.5f);
  auto gelu = [&] { gelu_forward(x.data(), x.data(), int64_t(x.size()), GeluKind::erf); };
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(true);
    for (int step = 0; step < 3; ++step) {
      w.before_step(100 + step);  // a resumed run: its own first step is the warm-up
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
      w.before_step(step);
      EXPECT_FALSE(op_profiler_enabled());
      w.after_step(1.0);
    }
    w.log_report();
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

TEST(OpProfileWindow, OneIterationProfiledOrNone) {
  std::vector<float> x(64, 0.5f);
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(true);
    w.before_step(0);
    w.after_step(1.0);
    w.log_report();
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "> op profile (--profile-ops): no iteration profiled (the first one is warm-up: train 2 or more)\n");
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(true);
    for (int step = 0; step < 2; ++step) {
      w.before_step(step);
      gelu_forward(x.data(), x.data(), int64_t(x.size()), GeluKind::erf);
      w.after_step(1.0);
    }
    w.log_report();
  }
  const auto l = lines_of(testing::internal::GetCapturedStdout());
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "> op profile (--profile-ops) over 1 iteration after the first, wall time of each kernel call on the "
                  "host:");
  op_profiler_reset();
}

// --profile: the steps that start with 2 to 3 iterations done (iterations 3 and 4), the first
// step included when the window starts at 0, nothing outside; the rank logs its own table even
// where log_info is off (a rank other than 0).
TEST(OpProfileWindow, ProfileStepWindowOnThisRank) {
  std::vector<float> x(64, 0.5f);
  auto steps = [&](OpProfileWindow& w, int64_t from, int64_t to) {
    for (int64_t it = from; it < to; ++it) {
      w.before_step(it);
      for (int64_t k = 0; k <= it; ++k) gelu_forward(x.data(), x.data(), int64_t(x.size()), GeluKind::erf);
      w.after_step(double(it + 1));
    }
  };
  set_log_info_enabled(false);
  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(2, 4, 3);
    steps(w, 0, 6);
    EXPECT_FALSE(op_profiler_enabled());
    w.log_report();
  }
  auto l = lines_of(testing::internal::GetCapturedStdout());
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "> op profile (--profile) of rank 3 over iterations 3 to 4, wall time of each kernel call on the host:");
  // 3 + 4 calls over 2 iterations; 3 + 4 ms measured.
  EXPECT_EQ(l[2].substr(0, 40), "  gelu_forward                      3.5 ");
  EXPECT_NE(l[3].find(" ms of 3.500 ms measured"), std::string::npos) << l[3];
  op_profiler_reset();

  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(0, 1, 0);
    steps(w, 0, 3);
    w.log_report();
  }
  l = lines_of(testing::internal::GetCapturedStdout());
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "> op profile (--profile) of rank 0 over iteration 1, wall time of each kernel call on the host:");
  EXPECT_EQ(l[2].substr(0, 40), "  gelu_forward                      1.0 ");
  op_profiler_reset();

  testing::internal::CaptureStdout();
  {
    OpProfileWindow w(10, 12, 1);  // a run that resumes at 3 and trains to 6
    steps(w, 3, 6);
    w.log_report();
  }
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "> op profile (--profile) of rank 1: no iteration profiled (--profile-step-start 10 and "
            "--profile-step-end 12 select iterations 11 to 12, which this run did not train)\n");
  set_log_info_enabled(true);
  op_profiler_reset();
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

std::string parse_error(std::vector<std::string> extra) {
  try {
    parse(extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(TrainArgsProfile, MegatronsWindowFlags) {
  const TrainArgs d = parse({"--train-iters", "3"});
  EXPECT_FALSE(d.profile);
  EXPECT_EQ(d.profile_step_start, 10);  // Megatron's defaults
  EXPECT_EQ(d.profile_step_end, 12);
  EXPECT_EQ(d.profile_rank_list(), std::vector<int>{0});
  const TrainArgs a = parse({"--train-iters", "3", "--profile", "--profile-step-start", "0", "--profile-step-end", "2",
                             "--profile-ranks", "1", "3"});
  EXPECT_TRUE(a.profile);
  EXPECT_EQ(a.profile_step_start, 0);
  EXPECT_EQ(a.profile_step_end, 2);
  EXPECT_EQ(a.profile_rank_list(), (std::vector<int>{1, 3}));
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--profile-step-start", "2", "--profile-step-end", "2"}),
            "--profile-step-start 2 and --profile-step-end 2 select no step (0 <= start < end)");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--profile-step-start", "-1"}),
            "--profile-step-start -1 and --profile-step-end 12 select no step (0 <= start < end)");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--profile-ranks", "0", "x"}),
            "--profile-ranks: invalid value 'x'");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--profile-ranks", "-2"}),
            "--profile-ranks: -2 is not a rank (0 or more)");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--profile-ops"}),
            "--profile and --profile-ops choose different steps to profile: give one");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--profile", "--use-pytorch-profiler"}),
            "--use-pytorch-profiler: lattice has no PyTorch profiler; --profile logs lattice's op table over the same "
            "steps");
}

TEST(TrainArgsDataloaderType, SingleOnly) {
  EXPECT_EQ(parse({"--train-iters", "3"}).implementation.dataloader_type, "single");
  EXPECT_EQ(parse({"--train-iters", "3", "--dataloader-type", "single"}).implementation.dataloader_type, "single");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--dataloader-type", "cyclic"}),
            "--dataloader-type cyclic is not implemented: lattice reads the samples in the dataset's order (single)");
  EXPECT_EQ(parse_error({"--train-iters", "3", "--dataloader-type", "random"}),
            "--dataloader-type random must be single, cyclic or external");
}

}  // namespace
}  // namespace lattice
