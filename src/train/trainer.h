// The trainer: `lattice train` after argument parsing.
#pragma once
#include "train/arguments.h"

namespace lattice {

// Trains as the arguments say; returns the process exit code.
int run_training(const TrainArgs& args);

}  // namespace lattice
