#include "train/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace lattice {
namespace {

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

// One chart's frame: where the plot area sits inside its 720 x 440 tile.
constexpr double kWidth = 720, kHeight = 440;
constexpr double kLeft = 70, kRight = 20, kTop = 44, kBottom = 52;

struct Frame {
  Axis x, y;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight); }
  double py(double v) const { return kHeight - kBottom - (v - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom); }
};

void write_axes(std::ostream& os, const Frame& f, const LineChart& c) {
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
  os << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << kHeight - 12 << "\" text-anchor=\"middle\">" << c.x_label
     << "</text>\n";
  os << "<text x=\"18\" y=\"" << (y0 + y1) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
     << (y0 + y1) / 2 << ")\">" << c.y_label << "</text>\n";
  os << "</g>\n";
}

// A series: a polyline through its points, plus markers when asked (sparse series).
void write_series(std::ostream& os, const Frame& f, const ChartSeries& s) {
  os << "<polyline class=\"" << s.css_class << "\" fill=\"none\" stroke=\"" << s.color
     << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
  for (size_t i = 0; i < s.points.size(); ++i)
    os << (i ? " " : "") << fixed(f.px(s.points[i].x), 1) << "," << fixed(f.py(s.points[i].y), 1);
  os << "\"/>\n";
  if (!s.markers) return;
  for (const ChartPoint& p : s.points)
    os << "<circle cx=\"" << fixed(f.px(p.x), 1) << "\" cy=\"" << fixed(f.py(p.y), 1) << "\" r=\"3\" fill=\""
       << s.color << "\"/>\n";
}

void write_legend(std::ostream& os, const std::vector<ChartSeries>& series) {
  const double x = kWidth - kRight - 110, y = kTop + 8;
  os << "<g font-size=\"12\" fill=\"#333\">\n"
     << "<rect x=\"" << x - 6 << "\" y=\"" << y - 4 << "\" width=\"122\" height=\"" << 18 * series.size() + 4
     << "\" fill=\"white\" fill-opacity=\"0.85\"/>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const double row = y + 18.0 * double(i);
    os << "<line x1=\"" << x << "\" y1=\"" << row + 6 << "\" x2=\"" << x + 20 << "\" y2=\"" << row + 6
       << "\" stroke=\"" << series[i].color << "\" stroke-width=\"2\"/>\n"
       << "<text x=\"" << x + 26 << "\" y=\"" << row + 10 << "\">" << series[i].label << "</text>\n";
  }
  os << "</g>\n";
}

void write_chart(std::ostream& os, const LineChart& c) {
  bool first = true;
  double xmin = 0, xmax = 0, ymin = 0, ymax = 0;
  for (const ChartSeries& s : c.series)
    for (const ChartPoint& p : s.points) {
      LATTICE_CHECK(std::isfinite(p.x) && std::isfinite(p.y)) << "chart '" << c.title << "': a point is not finite";
      if (first) xmin = xmax = p.x, ymin = ymax = p.y, first = false;
      xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x);
      ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
    }
  LATTICE_CHECK(!first) << "chart '" << c.title << "' has no points";
  Frame f{make_axis(xmin, xmax, 8, 1.0), make_axis(ymin, ymax, 8, 0.0)};
  os << "<text x=\"" << kWidth / 2 << "\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" fill=\"#111\">"
     << c.title << "</text>\n";
  write_axes(os, f, c);
  for (const ChartSeries& s : c.series) write_series(os, f, s);
  if (c.legend) write_legend(os, c.series);
}

}  // namespace

std::string render_svg_charts(const std::vector<LineChart>& charts) {
  LATTICE_CHECK(!charts.empty()) << "render_svg_charts: no charts";
  const double height = kHeight * double(charts.size());
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
     << "\" viewBox=\"0 0 " << kWidth << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < charts.size(); ++i) {
    if (i) os << "<g transform=\"translate(0 " << kHeight * double(i) << ")\">\n";
    write_chart(os, charts[i]);
    if (i) os << "</g>\n";
  }
  os << "</svg>\n";
  return os.str();
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) LATTICE_FAIL() << path << ": cannot write " << what;
    out << text;
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      LATTICE_FAIL() << path << ": cannot write " << what;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    LATTICE_FAIL() << path << ": cannot write " << what << " (" << ec.message() << ")";
  }
}

}  // namespace lattice
