// `lattice schedule`: the learning-rate and weight-decay schedule a `lattice train` command
// line would use, as CSV on stdout (and an SVG chart with --plot), before spending compute.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/subcommands.h"
#include "core/error.h"
#include "train/arguments.h"
#include "train/lr_schedule.h"
#include "train/schedule_report.h"

namespace lattice {

int cmd_schedule(int argc, char** argv) {
  std::vector<char*> train_argv(argv, argv + 2);
  std::string plot;
  bool plot_seen = false;
  for (int i = 2; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok == "--help" || tok == "-h") {
      std::fputs("usage: lattice schedule [--plot FILE.svg] <the flags of lattice train>\n"
                 "Prints iteration,consumed_samples,lr,weight_decay for iterations 0..--train-iters\n"
                 "(values after that many samples, shortest round-trip decimals). See docs/schedules.md.\n",
                 stdout);
      return 0;
    }
    if (tok == "--plot" || tok.rfind("--plot=", 0) == 0) {
      if (plot_seen) LATTICE_FAIL() << "--plot given twice";
      plot_seen = true;
      if (tok == "--plot") {
        if (i + 1 >= argc || std::strncmp(argv[i + 1], "--", 2) == 0) LATTICE_FAIL() << "--plot needs a file name";
        plot = argv[++i];
      } else {
        plot = tok.substr(7);
      }
      if (plot.empty()) LATTICE_FAIL() << "--plot needs a file name";
      continue;
    }
    train_argv.push_back(argv[i]);
  }
  const TrainArgs args = parse_train_args(int(train_argv.size()), train_argv.data(), 2);
  const std::vector<ScheduleRow> rows = schedule_rows(args);
  if (!plot.empty()) write_schedule_plot_svg(rows, plot);
  const std::string csv = format_schedule_csv(rows);
  if (std::fwrite(csv.data(), 1, csv.size(), stdout) != csv.size() || std::fflush(stdout) != 0)
    LATTICE_FAIL() << "stdout: write failed";
  if (!plot.empty()) std::fprintf(stderr, "wrote %s\n", plot.c_str());
  return 0;
}

}  // namespace lattice
