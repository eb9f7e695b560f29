// What `lattice schedule` prints and draws: the schedule as CSV with every value as the
// shortest decimal that round-trips the double, and as an SVG chart.
#pragma once
#include <string>
#include <vector>

#include "train/lr_schedule.h"

namespace lattice {

// The shortest decimal that parses back to exactly v (std::to_chars: fixed or scientific,
// whichever is shorter, fixed on a tie; exponents have at least two digits): 0.00015, 6e-05,
// 0.0002140840642370058, 0.1, 0.
std::string shortest_double(double v);

// "iteration,consumed_samples,lr,weight_decay" (plus ",decoupled_lr" when the rows carry it),
// then one line per row.
std::string format_schedule_csv(const std::vector<ScheduleRow>& rows);

// Learning rate (and decoupled learning rate) over iterations, with the weight decay in a
// second chart below. Long schedules keep each bucket's extremes, so no corner is lost.
// Written through a temporary file; throws lattice::Error naming svg_path.
void write_schedule_plot_svg(const std::vector<ScheduleRow>& rows, const std::string& svg_path);

}  // namespace lattice
