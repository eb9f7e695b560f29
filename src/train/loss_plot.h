// The loss curve of a run as an SVG line chart (what `lattice plot` writes).
#pragma once
#include <string>

namespace lattice {

// Reads a metrics file (JSON lines; a line with "lm_loss" must have "iteration", "val_loss" and
// --multiple-validation-sets' "val_<i>_loss" are optional, other lines and null losses are
// skipped) and writes an SVG chart of lm loss (and each validation loss where present) against
// iteration to svg_path.
// Throws lattice::Error naming the file (and line) when it is missing, malformed or holds no loss;
// svg_path is written through a temporary file, so a failure leaves an existing plot untouched.
void write_loss_plot_svg(const std::string& metrics_jsonl, const std::string& svg_path);

}  // namespace lattice
