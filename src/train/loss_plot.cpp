#include "train/loss_plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/svg_chart.h"

namespace lattice {
namespace {

struct LossCurves {
  std::vector<ChartPoint> lm;  // (iteration, loss)
  // "val", or "val_<i>" (--multiple-validation-sets' set i) -> (iteration, loss); numbered sets in order
  std::map<int64_t, std::vector<ChartPoint>> val;  // key -1: "val"
};

// The validation set a metrics key names: -1 for "val_loss", i for "val_<i>_loss"; nothing otherwise.
std::optional<int64_t> validation_set_of(const std::string& key) {
  if (key == "val_loss") return -1;
  const std::string head = "val_", tail = "_loss";
  if (key.size() <= head.size() + tail.size() || key.compare(0, head.size(), head) != 0 ||
      key.compare(key.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  const std::string digits = key.substr(head.size(), key.size() - head.size() - tail.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::stoll(digits);
}

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
    std::map<int64_t, double> val;
    for (auto it = obj.begin(); it != obj.end(); ++it)
      if (const std::optional<int64_t> set = validation_set_of(it.key()))
        if (const std::optional<double> v = number_field(obj, it.key().c_str(), where)) val[*set] = *v;
    if (!lm && val.empty()) continue;
    std::optional<double> iter = number_field(obj, "iteration", where);
    if (!iter) LATTICE_FAIL() << where << ": a loss without \"iteration\"";
    if (lm) curves.lm.push_back({*iter, *lm});
    for (const auto& [set, v] : val) curves.val[set].push_back({*iter, v});
  }
  if (in.bad()) LATTICE_FAIL() << path << ": read error";
  if (curves.lm.empty()) LATTICE_FAIL() << path << ": no \"lm_loss\" values to plot";
  return curves;
}

std::string render_svg(const LossCurves& c) {
  LineChart chart{"lm loss", "iteration", "loss", {}, !c.val.empty()};
  chart.series.push_back({"lm_loss", "lm loss", "#1f77b4", c.lm, c.lm.size() == 1});
  static const char* colors[] = {"#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  size_t k = 0;
  for (const auto& [set, points] : c.val) {
    const std::string n = std::to_string(set);
    chart.series.push_back({set < 0 ? "val_loss" : "val_" + n + "_loss",
                            set < 0 ? "validation loss" : "validation-" + n + " loss", colors[k++ % 7], points, true});
  }
  return render_svg_charts({chart});
}

}  // namespace

void write_loss_plot_svg(const std::string& metrics_jsonl, const std::string& svg_path) {
  write_file_atomically(svg_path, render_svg(read_loss_curves(metrics_jsonl)), "plot");
}

}  // namespace lattice
