#include "train/loss_plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lattice {
namespace {

struct Point {
  double x, y;  // iteration, loss
};

struct LossCurves {
  std::vector<Point> lm, val;
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

// An axis range widened to round tick values: lo, lo + step, ..., hi (Heckbert's nice numbers).
struct Axis {
  double lo, hi, step;
  int decimals;  // for the tick labels
};

double nice_number(double x, bool round) {
  double e = std::floor(std::log10(x));
  double f = x / std::pow(10.0, e);
  double nf = round ? (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) : (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10);
  return nf * std::pow(10.0, e);
}

Axis make_axis(double lo, double hi, int ticks, double min_step) {
  if (hi - lo <= 0) {
    double pad = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  double step = std::max(nice_number(nice_number(hi - lo, false) / (ticks - 1), true), min_step);
  Axis a{std::floor(lo / step) * step, std::ceil(hi / step) * step, step, 0};
  a.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return a;
}

int tick_count(const Axis& a) { return static_cast<int>(std::lround((a.hi - a.lo) / a.step)) + 1; }

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v == 0 ? 0.0 : v);  // no "-0"
  return buf;
}

// The chart's frame: where the plot area sits inside the picture.
constexpr double kWidth = 720, kHeight = 440;
constexpr double kLeft = 70, kRight = 20, kTop = 44, kBottom = 52;

struct Frame {
  Axis x, y;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight); }
  double py(double v) const { return kHeight - kBottom - (v - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom); }
};

void write_axes(std::ostream& os, const Frame& f) {
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
  os << "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (int i = 0; i < tick_count(f.y); ++i) {
    double y = f.py(f.y.lo + i * f.y.step);
    os << "<line x1=\"" << fixed(x0, 1) << "\" y1=\"" << fixed(y, 1) << "\" x2=\"" << fixed(x1, 1)
       << "\" y2=\"" << fixed(y, 1) << "\"/>\n";
  }
  for (int i = 0; i < tick_count(f.x); ++i) {
    double x = f.px(f.x.lo + i * f.x.step);
    os << "<line x1=\"" << fixed(x, 1) << "\" y1=\"" << fixed(y0, 1) << "\" x2=\"" << fixed(x, 1)
       << "\" y2=\"" << fixed(y1, 1) << "\"/>\n";
  }
  os << "</g>\n<g stroke=\"#333\" stroke-width=\"1\">\n";
  os << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x1 << "\" y2=\"" << y0 << "\"/>\n";
  os << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y1 << "\"/>\n";
  os << "</g>\n<g fill=\"#333\">\n";
  for (int i = 0; i < tick_count(f.y); ++i) {
    double v = f.y.lo + i * f.y.step;
    os << "<text x=\"" << x0 - 6 << "\" y=\"" << fixed(f.py(v) + 4, 1) << "\" text-anchor=\"end\">"
       << fixed(v, f.y.decimals) << "</text>\n";
  }
  for (int i = 0; i < tick_count(f.x); ++i) {
    double v = f.x.lo + i * f.x.step;
    os << "<text x=\"" << fixed(f.px(v), 1) << "\" y=\"" << y0 + 18 << "\" text-anchor=\"middle\">"
       << fixed(v, f.x.decimals) << "</text>\n";
  }
  os << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << kHeight - 12 << "\" text-anchor=\"middle\">iteration</text>\n";
  os << "<text x=\"18\" y=\"" << (y0 + y1) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
     << (y0 + y1) / 2 << ")\">loss</text>\n";
  os << "</g>\n";
}

// A curve: a polyline through its points, plus markers when the points are sparse.
void write_curve(std::ostream& os, const Frame& f, const std::vector<Point>& pts, const char* name,
                 const char* color, bool markers) {
  os << "<polyline class=\"" << name << "\" fill=\"none\" stroke=\"" << color
     << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
  for (size_t i = 0; i < pts.size(); ++i)
    os << (i ? " " : "") << fixed(f.px(pts[i].x), 1) << "," << fixed(f.py(pts[i].y), 1);
  os << "\"/>\n";
  if (!markers) return;
  for (const Point& p : pts)
    os << "<circle cx=\"" << fixed(f.px(p.x), 1) << "\" cy=\"" << fixed(f.py(p.y), 1) << "\" r=\"3\" fill=\""
       << color << "\"/>\n";
}

void write_legend(std::ostream& os) {
  const double x = kWidth - kRight - 110, y = kTop + 8;
  os << "<g font-size=\"12\" fill=\"#333\">\n"
     << "<rect x=\"" << x - 6 << "\" y=\"" << y - 4 << "\" width=\"122\" height=\"40\" fill=\"white\" "
     << "fill-opacity=\"0.85\"/>\n"
     << "<line x1=\"" << x << "\" y1=\"" << y + 6 << "\" x2=\"" << x + 20 << "\" y2=\"" << y + 6
     << "\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n"
     << "<text x=\"" << x + 26 << "\" y=\"" << y + 10 << "\">lm loss</text>\n"
     << "<line x1=\"" << x << "\" y1=\"" << y + 24 << "\" x2=\"" << x + 20 << "\" y2=\"" << y + 24
     << "\" stroke=\"#d62728\" stroke-width=\"2\"/>\n"
     << "<text x=\"" << x + 26 << "\" y=\"" << y + 28 << "\">validation loss</text>\n"
     << "</g>\n";
}

std::string render_svg(const LossCurves& c) {
  double xmin = c.lm.front().x, xmax = xmin, ymin = c.lm.front().y, ymax = ymin;
  for (const auto* pts : {&c.lm, &c.val})
    for (const Point& p : *pts) {
      xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x);
      ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
    }
  Frame f{make_axis(xmin, xmax, 8, 1.0), make_axis(ymin, ymax, 8, 0.0)};
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
     << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << kWidth / 2 << "\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" fill=\"#111\">lm loss</text>\n";
  write_axes(os, f);
  write_curve(os, f, c.lm, "lm_loss", "#1f77b4", c.lm.size() == 1);
  if (!c.val.empty()) {
    write_curve(os, f, c.val, "val_loss", "#d62728", true);
    write_legend(os);
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace

void write_loss_plot_svg(const std::string& metrics_jsonl, const std::string& svg_path) {
  const std::string svg = render_svg(read_loss_curves(metrics_jsonl));
  const std::string tmp = svg_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) LATTICE_FAIL() << svg_path << ": cannot write plot";
    out << svg;
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      LATTICE_FAIL() << svg_path << ": cannot write plot";
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, svg_path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    LATTICE_FAIL() << svg_path << ": cannot write plot (" << ec.message() << ")";
  }
}

}  // namespace lattice
