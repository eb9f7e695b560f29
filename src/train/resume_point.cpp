#include "train/resume_point.h"

#include <optional>

#include "checkpoint/checkpoint.h"
#include "core/error.h"

namespace lattice {

std::string non_persistent_dir(const TrainArgs& args, const std::string& base) {
  return args.non_persistent_global_ckpt_dir.empty() ? base + "/non_persistent" : args.non_persistent_global_ckpt_dir;
}

CheckpointChoice choose_checkpoint(const TrainArgs& args) {
  CheckpointChoice c{args.load, args.finetune, ""};
  if (!args.pretrained_checkpoint.empty() && (c.dir.empty() || !has_checkpoint(c.dir))) {
    if (!has_checkpoint(args.pretrained_checkpoint))
      LATTICE_FAIL() << "--pretrained-checkpoint " << args.pretrained_checkpoint << ": no checkpoint (no " << kTrackerFile
                     << " or " << kCheckpointIndexFile << ")" << (c.dir.empty() ? "" : " and none in --load " + c.dir);
    c.note = "> " + (c.dir.empty() ? std::string("no --load") : "no checkpoint in --load " + c.dir) +
             ": fine-tuning from --pretrained-checkpoint " + args.pretrained_checkpoint + " (its weights only)";
    c.dir = args.pretrained_checkpoint;
    c.finetune = true;
  }
  if (c.dir.empty()) return c;
  // Non-persistent checkpoints (Megatron's global kind): the newer of --load's and its non-persistent one.
  if (c.dir == args.load && args.ckpt_step < 0 && args.non_persistent()) {
    const std::string np = non_persistent_dir(args, args.load);
    // -1: no checkpoint, or a release one (no iteration)
    const int64_t np_it = has_checkpoint(np) ? read_latest_iteration(np).value_or(-1) : -1;
    const int64_t it = has_checkpoint(c.dir) ? read_latest_iteration(c.dir).value_or(-1) : -1;
    if (np_it >= 0 && np_it > it) {
      c.note = "> the non-persistent checkpoint " + np + " (iteration " + std::to_string(np_it) +
               ") is newer than --load's" + (it >= 0 ? " (iteration " + std::to_string(it) + ")" : std::string());
      c.dir = np;
    }
  }
  if (args.ckpt_step >= 0 && has_checkpoint(c.dir))
    c.dir = checkpoint_at_iteration(c.dir, args.ckpt_step, "--ckpt-step");
  else if (args.ckpt_step >= 0)
    LATTICE_FAIL() << "--ckpt-step " << args.ckpt_step << ": " << c.dir << " holds no checkpoint (no " << kTrackerFile
                   << ")";
  return c;
}

}  // namespace lattice
