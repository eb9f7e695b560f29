// Which checkpoint a training run starts from (Megatron's --load, --pretrained-checkpoint, --ckpt-step
// and the non-persistent checkpoints), decided from the flags and what the directories hold, before
// anything is loaded.
#pragma once
#include <string>

#include "train/arguments.h"

namespace lattice {

// Where non-persistent checkpoints go and are read from: --non-persistent-global-ckpt-dir, else
// `base` (--save, or --load when reading)/non_persistent.
std::string non_persistent_dir(const TrainArgs& args, const std::string& base);

struct CheckpointChoice {
  std::string dir;        // the checkpoint directory (or one iteration's) to load; empty: none, start fresh
  bool finetune = false;  // its weights only (--finetune, or --pretrained-checkpoint taken)
  std::string note;       // a line for the log when the choice is not plain --load's latest (empty: none)
};

// --load's latest checkpoint, or when --load holds none: --pretrained-checkpoint P's, as --finetune (so
// `--load D --save D --pretrained-checkpoint P` starts from P once, then resumes from D); with non-persistent
// checkpoints the newer of --load's and its non-persistent one; with --ckpt-step N the iteration-N
// checkpoint of the chosen directory. An empty dir when there is nothing to load (--load empty, or
// without a checkpoint: the load reports it). Fails in one line on a --pretrained-checkpoint without a
// checkpoint, and on a --ckpt-step the directory does not hold.
CheckpointChoice choose_checkpoint(const TrainArgs& args);

}  // namespace lattice
