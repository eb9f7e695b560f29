#include "train/loss_plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test (ctest runs tests in parallel processes).
class LossPlot : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("lattice_loss_plot_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_metrics(const std::string& text) {
    std::string path = (dir_ / "metrics.jsonl").string();
    std::ofstream(path) << text;
    return path;
  }
  std::string svg_path() const { return (dir_ / "loss.svg").string(); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The number of "x,y" pairs in the points of the polyline with the given class.
  static int polyline_points(const std::string& svg, const std::string& cls) {
    std::smatch m;
    if (!std::regex_search(svg, m, std::regex("<polyline class=\"" + cls + "\"[^>]*points=\"([^\"]*)\"")))
      return -1;
    std::istringstream pts(m[1].str());
    std::string pair;
    int n = 0;
    while (pts >> pair) {
      EXPECT_TRUE(std::regex_match(pair, std::regex("-?[0-9.]+,-?[0-9.]+"))) << pair;
      ++n;
    }
    return n;
  }
  // The message of the lattice::Error that f throws ("" when it throws none).
  template <typename F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(LossPlot, WritesSvgWithOnePointPerLoggedIteration) {
  std::string metrics;
  for (int it = 20; it <= 600; it += 20)
    metrics += R"({"iteration": )" + std::to_string(it) + R"(, "lm_loss": )" + std::to_string(5.6 - it / 200.0) +
               R"(, "lr": 0.001, "tokens_per_sec": 1234.5})" + "\n";
  write_loss_plot_svg(write_metrics(metrics), svg_path());
  std::string svg = read(svg_path());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find(">lm loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">iteration</text>"), std::string::npos);
  EXPECT_EQ(polyline_points(svg, "lm_loss"), 30);
  EXPECT_EQ(polyline_points(svg, "val_loss"), -1);
  EXPECT_FALSE(fs::exists(svg_path() + ".tmp"));
}

TEST_F(LossPlot, TickLabelsAreRoundNumbersCoveringTheData) {
  write_loss_plot_svg(write_metrics("{\"iteration\": 1, \"lm_loss\": 5.55}\n{\"iteration\": 600, \"lm_loss\": 2.31}\n"),
                      svg_path());
  std::string svg = read(svg_path());
  for (const char* label : {">0</text>", ">600</text>", ">2</text>", ">6</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
}

TEST_F(LossPlot, PlotsValidationLossAndSkipsOtherLines) {
  write_metrics(
      "{\"event\": \"start\", \"world_size\": 1}\n"
      "\n"
      "{\"iteration\": 10, \"lm_loss\": 4.0}\n"
      "{\"iteration\": 20, \"lm_loss\": 3.5, \"val_loss\": 3.7}\n"
      "{\"iteration\": 30, \"lm_loss\": null}\n"
      "{\"iteration\": 40, \"lm_loss\": 3.0}\n"
      "{\"iteration\": 40, \"val_loss\": 3.2}\n");
  write_loss_plot_svg((dir_ / "metrics.jsonl").string(), svg_path());
  std::string svg = read(svg_path());
  EXPECT_EQ(polyline_points(svg, "lm_loss"), 3);
  EXPECT_EQ(polyline_points(svg, "val_loss"), 2);
  EXPECT_NE(svg.find("validation loss"), std::string::npos);
}

// --multiple-validation-sets' val_<i>_loss keys: a curve per set, in the sets' order; keys that
// only look alike (val_x_loss, val_1_ppl) are not losses.
TEST_F(LossPlot, PlotsEachValidationSet) {
  write_metrics(
      "{\"iteration\": 10, \"lm_loss\": 4.0}\n"
      "{\"iteration\": 20, \"val_10_loss\": 3.9, \"val_10_ppl\": 49.4}\n"
      "{\"iteration\": 20, \"val_2_loss\": 3.6, \"val_x_loss\": 1.0}\n"
      "{\"iteration\": 20, \"lm_loss\": 3.5}\n"
      "{\"iteration\": 40, \"val_2_loss\": 3.1}\n"
      "{\"iteration\": 40, \"val_10_loss\": 3.3}\n"
      "{\"iteration\": 40, \"val_10_loss\": null, \"lm_loss\": 3.0}\n");
  write_loss_plot_svg((dir_ / "metrics.jsonl").string(), svg_path());
  const std::string svg = read(svg_path());
  EXPECT_EQ(polyline_points(svg, "lm_loss"), 3);
  EXPECT_EQ(polyline_points(svg, "val_2_loss"), 2);
  EXPECT_EQ(polyline_points(svg, "val_10_loss"), 2);
  EXPECT_EQ(polyline_points(svg, "val_x_loss"), -1);
  EXPECT_EQ(polyline_points(svg, "val_loss"), -1);
  EXPECT_LT(svg.find("validation-2 loss"), svg.find("validation-10 loss"));
}

TEST_F(LossPlot, SinglePointIsDrawn) {
  write_loss_plot_svg(write_metrics("{\"iteration\": 1, \"lm_loss\": 5.5}\n"), svg_path());
  std::string svg = read(svg_path());
  EXPECT_EQ(polyline_points(svg, "lm_loss"), 1);
  EXPECT_NE(svg.find("<circle"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST_F(LossPlot, MissingFileNamesTheFile) {
  std::string missing = (dir_ / "nope.jsonl").string();
  std::string msg = error_of([&] { write_loss_plot_svg(missing, svg_path()); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(svg_path()));
}

TEST_F(LossPlot, NoLossValuesIsAnError) {
  std::string path = write_metrics("{\"event\": \"start\"}\n\n");
  std::string msg = error_of([&] { write_loss_plot_svg(path, svg_path()); });
  EXPECT_NE(msg.find("no \"lm_loss\""), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { write_loss_plot_svg(write_metrics(""), svg_path()); }), "");
}

TEST_F(LossPlot, BadJsonLineNamesTheLine) {
  std::string path = write_metrics("{\"iteration\": 1, \"lm_loss\": 5.5}\n\n{\"iteration\": 3, \"lm_loss\": \n");
  std::string msg = error_of([&] { write_loss_plot_svg(path, svg_path()); });
  EXPECT_NE(msg.find(path + ": line 3: invalid JSON"), std::string::npos) << msg;
}

TEST_F(LossPlot, WrongTypesAreErrors) {
  EXPECT_NE(error_of([&] { write_loss_plot_svg(write_metrics("[1, 2]\n"), svg_path()); })
                .find("line 1: expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_loss_plot_svg(write_metrics("{\"iteration\": 1, \"lm_loss\": \"x\"}\n"), svg_path()); })
                .find("line 1: \"lm_loss\" is not a number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_loss_plot_svg(write_metrics("{\"lm_loss\": 2.5}\n"), svg_path()); })
                .find("line 1: a loss without \"iteration\""),
            std::string::npos);
}

TEST_F(LossPlot, FailureLeavesExistingPlotUntouched) {
  std::ofstream(svg_path()) << "old plot";
  EXPECT_NE(error_of([&] { write_loss_plot_svg(write_metrics("not json\n"), svg_path()); }), "");
  EXPECT_EQ(read(svg_path()), "old plot");
}

TEST_F(LossPlot, UnwritableOutputIsAnError) {
  std::string path = write_metrics("{\"iteration\": 1, \"lm_loss\": 5.5}\n");
  std::string out = (dir_ / "no_such_dir" / "loss.svg").string();
  EXPECT_NE(error_of([&] { write_loss_plot_svg(path, out); }).find(out), std::string::npos);
}

}  // namespace
}  // namespace lattice
