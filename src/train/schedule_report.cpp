#include "train/schedule_report.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "core/error.h"
#include "train/svg_chart.h"

namespace lattice {

std::string shortest_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  LATTICE_CHECK(ec == std::errc()) << "to_chars failed";
  return std::string(buf, end);
}

std::string format_schedule_csv(const std::vector<ScheduleRow>& rows) {
  const bool decoupled = !rows.empty() && rows.front().decoupled_lr.has_value();
  std::ostringstream os;
  os << "iteration,consumed_samples,lr,weight_decay" << (decoupled ? ",decoupled_lr" : "") << "\n";
  for (const ScheduleRow& r : rows) {
    os << r.iteration << "," << r.consumed_samples << "," << shortest_double(r.lr) << ","
       << shortest_double(r.weight_decay);
    if (decoupled) os << "," << shortest_double(r.decoupled_lr.value());
    os << "\n";
  }
  return os.str();
}

namespace {

// At most ~2 x kBuckets points: each bucket of consecutive points keeps its first, lowest,
// highest and last point (in order), so warmup peaks and WSD corners survive.
constexpr size_t kBuckets = 1000;

std::vector<ChartPoint> thin(const std::vector<ChartPoint>& pts) {
  if (pts.size() <= 4 * kBuckets) return pts;
  std::vector<ChartPoint> out;
  const size_t per = (pts.size() + kBuckets - 1) / kBuckets;
  for (size_t b = 0; b < pts.size(); b += per) {
    const size_t e = std::min(pts.size(), b + per);
    size_t lo = b, hi = b;
    for (size_t i = b; i < e; ++i) {
      if (pts[i].y < pts[lo].y) lo = i;
      if (pts[i].y > pts[hi].y) hi = i;
    }
    size_t keep[4] = {b, std::min(lo, hi), std::max(lo, hi), e - 1};
    for (size_t k = 0; k < 4; ++k)
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(pts[keep[k]]);
  }
  return out;
}

}  // namespace

void write_schedule_plot_svg(const std::vector<ScheduleRow>& rows, const std::string& svg_path) {
  LATTICE_CHECK(!rows.empty()) << "write_schedule_plot_svg: no rows";
  std::vector<ChartPoint> lr, dlr, wd;
  for (const ScheduleRow& r : rows) {
    lr.push_back({double(r.iteration), r.lr});
    wd.push_back({double(r.iteration), r.weight_decay});
    if (r.decoupled_lr) dlr.push_back({double(r.iteration), *r.decoupled_lr});
  }
  const bool single = rows.size() == 1;
  LineChart lr_chart{"learning rate", "iteration", "learning rate", {}, !dlr.empty()};
  lr_chart.series.push_back({"lr", "learning rate", "#1f77b4", thin(lr), single});
  if (!dlr.empty()) lr_chart.series.push_back({"decoupled_lr", "decoupled lr", "#ff7f0e", thin(dlr), single});
  LineChart wd_chart{"weight decay", "iteration", "weight decay", {}, false};
  wd_chart.series.push_back({"weight_decay", "weight decay", "#2ca02c", thin(wd), single});
  write_file_atomically(svg_path, render_svg_charts({lr_chart, wd_chart}), "plot");
}

}  // namespace lattice
