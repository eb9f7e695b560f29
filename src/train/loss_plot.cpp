#include "train/loss_plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/svg_chart.h"

namespace lattice {
namespace {

struct LossCurves {
  std::vector<ChartPoint> lm, val;  // (iteration, loss)
};

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

// The number under key, or nothing when it is absent, null or not finite (a skipped step).
std::optional<double> number_field(const nlohmann::json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) LATTICE_FAIL() << where << ": \"" << key << "\" is not a number";
  double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

LossCurves read_loss_curves(const std::string& path) {
  std::ifstream in(path);
  if (!in) LATTICE_FAIL() << path << ": cannot open metrics file";
  LossCurves curves;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (is_blank(line)) continue;
    const std::string where = path + ": line " + std::to_string(line_no);
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      LATTICE_FAIL() << where << ": invalid JSON at byte " << e.byte;
    }
    if (!obj.is_object()) LATTICE_FAIL() << where << ": expected a JSON object";
    std::optional<double> lm = number_field(obj, "lm_loss", where);
    std::optional<double> val = number_field(obj, "val_loss", where);
    if (!lm && !val) continue;
    std::optional<double> iter = number_field(obj, "iteration", where);
    if (!iter) LATTICE_FAIL() << where << ": a loss without \"iteration\"";
    if (lm) curves.lm.push_back({*iter, *lm});
    if (val) curves.val.push_back({*iter, *val});
  }
  if (in.bad()) LATTICE_FAIL() << path << ": read error";
  if (curves.lm.empty()) LATTICE_FAIL() << path << ": no \"lm_loss\" values to plot";
  return curves;
}

std::string render_svg(const LossCurves& c) {
  LineChart chart{"lm loss", "iteration", "loss", {}, !c.val.empty()};
  chart.series.push_back({"lm_loss", "lm loss", "#1f77b4", c.lm, c.lm.size() == 1});
  if (!c.val.empty()) chart.series.push_back({"val_loss", "validation loss", "#d62728", c.val, true});
  return render_svg_charts({chart});
}

}  // namespace

void write_loss_plot_svg(const std::string& metrics_jsonl, const std::string& svg_path) {
  write_file_atomically(svg_path, render_svg(read_loss_curves(metrics_jsonl)), "plot");
}

}  // namespace lattice
