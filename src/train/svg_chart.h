// A small SVG line chart (what `lattice plot` and `lattice schedule --plot` draw): round
// tick values (Heckbert's nice numbers), one polyline per series, an optional legend.
// Several charts stack vertically in one picture.
#pragma once
#include <string>
#include <vector>

namespace lattice {

struct ChartPoint {
  double x, y;
};

struct ChartSeries {
  std::string css_class;  // the polyline's class attribute, e.g. lm_loss
  std::string label;      // legend text
  std::string color;      // stroke colour, e.g. #1f77b4
  std::vector<ChartPoint> points;  // at least one, all finite
  bool markers = false;   // circles at the points (for sparse series)
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;  // at least one non-empty
  bool legend = false;
};

// The SVG document of the charts, one below the other.
std::string render_svg_charts(const std::vector<LineChart>& charts);

// Writes text to path through path.tmp and a rename, so a failure leaves an existing file
// untouched. Throws lattice::Error "<path>: cannot write <what>".
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace lattice
