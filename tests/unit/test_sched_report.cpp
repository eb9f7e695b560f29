// The schedule of a `lattice train` command line: Megatron's flag rules
// (get_optimizer_param_scheduler), the rows `lattice schedule` prints, their CSV with
// shortest round-trip decimals, and the SVG chart.
#include <gtest/gtest.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/lr_schedule.h"
#include "train/schedule_report.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

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

std::string builder_error(const std::string& flags, TrainArgs* edit = nullptr) {
  try {
    TrainArgs a = train_args(flags);
    if (edit) {
      edit->num_layers = a.num_layers;
      a = *edit;
    }
    get_optimizer_param_scheduler(a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kBase = "--global-batch-size 8 --train-iters 100 --lr 1e-3 --min-lr 1e-4 ";

TEST(SchedFlags, MegatronFlagRulesAreErrorsNamingTheFlags) {
  EXPECT_EQ(builder_error(std::string(kBase)), "");
  struct Case {
    std::string flags, expect;
  };
  const std::vector<Case> cases = {
      {"--lr-warmup-fraction 0.1 --lr-warmup-iters 10", "--lr-warmup-fraction and --lr-warmup-iters are exclusive"},
      {"--lr-decay-samples 800", "--lr-decay-samples needs sample-based (--train-samples) training; use --lr-decay-iters"},
      {"--lr-warmup-samples 80", "--lr-warmup-samples needs sample-based (--train-samples) training"},
      {"--lr-wsd-decay-samples 80 --lr-decay-style WSD", "--lr-wsd-decay-samples needs sample-based"},
      {"--start-weight-decay 0", "--start-weight-decay needs --weight-decay-incr-style linear or cosine"},
      {"--end-weight-decay 0.1", "--end-weight-decay needs --weight-decay-incr-style linear or cosine"},
      {"--weight-decay-incr-style linear --end-weight-decay 0.1",
       "--weight-decay-incr-style linear needs --start-weight-decay and --end-weight-decay"},
      {"--weight-decay-incr-style cosine", "--weight-decay-incr-style cosine needs --start-weight-decay"},
      {"--weight-decay-incr-style square", "--weight-decay-incr-style must be constant, linear or cosine"},
      {"--lr-decay-style WSD", "--lr-decay-style WSD needs --lr-wsd-decay-iters"},
      {"--lr-warmup-iters 100", "must be shorter than the decay (800 samples"},
      {"--lr-warmup-iters 20 --lr-decay-iters 10", "must be shorter than the decay (80 samples"},
      {"--lr-warmup-fraction 1.0", "must be shorter than the decay"},
      {"--lr-warmup-fraction -0.1", "warmup must be >= 0"},
      {"--lr-decay-iters -5", "learning-rate decay must be positive"},
      {"--lr-warmup-init 0.01", "--lr-warmup-init (0.01) must be <= --lr (0.001)"},
      {"--decoupled-min-lr 1e-5", "--decoupled-min-lr needs --decoupled-lr"},
      {"--lr-decay-style linearly", "--lr-decay-style must be constant, linear, cosine, inverse-square-root or WSD"},
  };
  for (const Case& c : cases) {
    const std::string msg = builder_error(kBase + c.flags);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.flags << ": got '" << msg << "'";
  }
  // --lr below --min-lr fails too (the issue: --lr defaults to 0).
  EXPECT_NE(builder_error("--global-batch-size 8 --train-iters 100 --min-lr 1e-4").find("--lr (0) must be >= --min-lr"),
            std::string::npos);
}

// Sample-based training (once --train-samples parses): every length in samples.
TEST(SchedFlags, SampleBasedLengthsAreSamples) {
  TrainArgs a = train_args(kBase);
  a.train_iters = 0;
  a.train_samples = 1000;
  a.lr_decay_style = "WSD";
  a.lr_wsd_decay_samples = 300;
  a.lr_warmup_samples = 100;
  OptimizerParamScheduler s = get_optimizer_param_scheduler(a);
  EXPECT_EQ(s.options().lr_decay_steps, 1000);
  EXPECT_EQ(s.options().wd_incr_steps, 1000);
  EXPECT_EQ(s.options().lr_warmup_steps, 100.0);
  EXPECT_EQ(s.options().wsd_decay_steps.value(), 300);
  a.lr_decay_samples = 900;
  a.lr_warmup_samples = 0;
  a.lr_warmup_fraction = 0.25;
  s = get_optimizer_param_scheduler(a);
  EXPECT_EQ(s.options().lr_decay_steps, 900);
  EXPECT_EQ(s.options().lr_warmup_steps, 225.0);
  a.lr_decay_iters = 10;
  EXPECT_NE(builder_error(kBase, &a).find("--lr-decay-iters needs iteration-based (--train-iters) training"),
            std::string::npos);
  a.lr_decay_iters = 0;
  a.lr_warmup_samples = 5;
  EXPECT_NE(builder_error(kBase, &a).find("--lr-warmup-fraction and --lr-warmup-samples are exclusive"),
            std::string::npos);
}

TEST(SchedFlags, IterationBasedLengthsAreIterationsTimesGlobalBatch) {
  OptimizerParamScheduler s = get_optimizer_param_scheduler(
      train_args(std::string(kBase) + "--lr-decay-iters 80 --lr-warmup-iters 5 --lr-decay-style WSD "
                                      "--lr-wsd-decay-iters 20"));
  EXPECT_EQ(s.options().lr_decay_steps, 640);
  EXPECT_EQ(s.options().wd_incr_steps, 800);
  EXPECT_EQ(s.options().lr_warmup_steps, 40.0);
  EXPECT_EQ(s.options().wsd_decay_steps.value(), 160);
  s = get_optimizer_param_scheduler(train_args(std::string(kBase) + "--lr-warmup-fraction 0.1"));
  EXPECT_EQ(s.options().lr_decay_steps, 800);  // --train-iters when --lr-decay-iters is unset
  EXPECT_EQ(s.options().lr_warmup_steps, 0.1 * 800);
  EXPECT_EQ(s.options().start_wd, 0.01);     // constant style: --weight-decay
  EXPECT_EQ(s.options().end_wd, 0.01);
}

TEST(SchedRows, OneRowPerIterationIncludingZeroAndTheLast) {
  const std::vector<ScheduleRow> rows =
      schedule_rows(train_args(std::string(kBase) + "--lr-warmup-iters 10 --lr-decay-style cosine"));
  ASSERT_EQ(rows.size(), 101u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].iteration, int64_t(i));
    EXPECT_EQ(rows[i].consumed_samples, int64_t(i) * 8);
    EXPECT_FALSE(rows[i].decoupled_lr.has_value());
  }
  EXPECT_EQ(rows[0].lr, 0.0);
  EXPECT_EQ(rows[10].lr, 1e-3);  // the end of the warmup is max_lr
  EXPECT_EQ(rows[100].lr, 1e-4);  // the end of the decay is min_lr
  for (size_t i = 11; i < rows.size(); ++i) EXPECT_LT(rows[i].lr, rows[i - 1].lr) << i;
}

TEST(SchedCsv, ShortestRoundTripDecimals) {
  EXPECT_EQ(shortest_double(0.00015), "0.00015");
  EXPECT_EQ(shortest_double(2.140840642370058e-4), "0.0002140840642370058");
  EXPECT_EQ(shortest_double(5.9999999999999995e-05), "5.9999999999999995e-05");
  EXPECT_EQ(shortest_double(6e-05), "6e-05");
  EXPECT_EQ(shortest_double(0.1), "0.1");
  EXPECT_EQ(shortest_double(0.0), "0");
  EXPECT_EQ(shortest_double(0.014644660940672627), "0.014644660940672627");
  // Every printed value parses back to the same double.
  for (double v : {1e-3 / 3, 3e-4 * 0.7, 1.0 / 7, 6.02e23, 1e-300}) {
    const std::string s = shortest_double(v);
    double back = 0;
    std::from_chars(s.data(), s.data() + s.size(), back);
    EXPECT_EQ(back, v) << s;
  }
}

TEST(SchedCsv, HeaderAndRows) {
  std::vector<ScheduleRow> rows = {{0, 0, 0.0, 0.01, std::nullopt}, {1, 256, 3e-6, 0.01, std::nullopt}};
  EXPECT_EQ(format_schedule_csv(rows),
            "iteration,consumed_samples,lr,weight_decay\n0,0,0,0.01\n1,256,3e-06,0.01\n");
  rows[0].decoupled_lr = 0.0;
  rows[1].decoupled_lr = 1e-5;
  EXPECT_EQ(format_schedule_csv(rows),
            "iteration,consumed_samples,lr,weight_decay,decoupled_lr\n0,0,0,0.01,0\n1,256,3e-06,0.01,1e-05\n");
}

class SchedPlot : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice_sched_plot_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The (x, y) pairs of the polyline with the given class (empty when there is none).
  static std::vector<std::pair<double, double>> points(const std::string& svg, const std::string& cls) {
    std::vector<std::pair<double, double>> out;
    size_t at = svg.find("<polyline class=\"" + cls + "\"");
    if (at == std::string::npos) return out;
    const size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
    std::istringstream pts(svg.substr(begin, end - begin));
    for (std::string pair; pts >> pair;) {
      const size_t comma = pair.find(',');
      out.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
    }
    return out;
  }
  fs::path dir_;
};

TEST_F(SchedPlot, DrawsLrAndWeightDecay) {
  const auto rows = schedule_rows(train_args(
      std::string(kBase) + "--lr-warmup-iters 10 --decoupled-lr 2e-3 --weight-decay-incr-style linear "
                           "--start-weight-decay 0 --end-weight-decay 0.1"));
  const fs::path svg = dir_ / "s.svg";
  write_schedule_plot_svg(rows, svg.string());
  const std::string text = read(svg);
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  EXPECT_NE(text.find(">learning rate</text>"), std::string::npos);
  EXPECT_NE(text.find(">weight decay</text>"), std::string::npos);
  EXPECT_NE(text.find("decoupled lr"), std::string::npos);  // legend
  const auto lr = points(text, "lr");
  ASSERT_EQ(lr.size(), 101u);
  // The peak (iteration 10) is the highest point on screen (smallest y).
  size_t top = 0;
  for (size_t i = 0; i < lr.size(); ++i)
    if (lr[i].second < lr[top].second) top = i;
  EXPECT_EQ(top, 10u);
  EXPECT_EQ(points(text, "decoupled_lr").size(), 101u);
  const auto wd = points(text, "weight_decay");
  ASSERT_EQ(wd.size(), 101u);
  EXPECT_GT(wd.front().second, wd.back().second);  // increasing weight decay goes up the screen
  EXPECT_FALSE(fs::exists(svg.string() + ".tmp"));
}

TEST_F(SchedPlot, LongSchedulesAreThinnedButKeepASpike) {
  std::vector<ScheduleRow> rows;
  for (int64_t i = 0; i <= 50000; ++i) rows.push_back({i, i, i == 12345 ? 1.0 : 0.0, 0.01, std::nullopt});
  const fs::path svg = dir_ / "s.svg";
  write_schedule_plot_svg(rows, svg.string());
  const auto lr = points(read(svg), "lr");
  EXPECT_LE(lr.size(), 4000u);
  EXPECT_GE(lr.size(), 1000u);
  // x: 70 + 12345 / 50000 * 630 = 225.5; y: the top of the plot area (44).
  bool spike = false;
  for (auto& p : lr) spike |= std::abs(p.first - 225.5) < 1e-9 && std::abs(p.second - 44.0) < 1e-9;
  EXPECT_TRUE(spike);
}

TEST_F(SchedPlot, UnwritablePathIsAnErrorAndExistingFileUntouched) {
  const auto rows = schedule_rows(train_args(kBase));
  const std::string bad = (dir_ / "no" / "such" / "dir.svg").string();
  try {
    write_schedule_plot_svg(rows, bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lattice
