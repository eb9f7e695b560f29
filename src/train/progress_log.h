// Megatron's --log-progress: SAVE/progress.txt, one tab-separated line per event, appended by world
// rank 0 and kept across the jobs that continue a run:
//   <YYYY-MM-DD HH:MM:SS>\tJob ID: <$SLURM_JOB_ID>\t# GPUs: <world size>\tStarting job
//   <...>\tJob ID: ..\t# GPUs: ..\tSaved checkpoint\tIteration: I\tJob throughput: X TFLOP/s/GPU\t
//     Cumulative throughput: Y TFLOP/s/GPU\tFloating-point operations: Z\tTokens (in billions): T
// Job throughput: this job's model FLOPs over its time and ranks; cumulative: since the first job of
// the latest run of jobs with this world size started (its FLOPs then: the last saved checkpoint's
// before it), so restarts and queueing count against it.
#pragma once
#include <cstdint>
#include <ctime>
#include <string>

namespace lattice {

// Appends "<now>\tJob ID: ..\t# GPUs: world\t<text>" to dir/progress.txt (creating dir).
void append_progress_line(const std::string& dir, int world, const std::string& text);

// The "Saved checkpoint" event's text.
std::string saved_checkpoint_progress(int64_t iteration, double job_tflops_per_gpu, double cumulative_tflops_per_gpu,
                                      double flops, double tokens);

// From dir/progress.txt: when the first job of the latest run of "Starting job" lines with this world
// size started, and the FLOPs of the last "Saved checkpoint" before it. found false without such a line
// (lines that do not parse are skipped).
struct ProgressStart {
  bool found = false;
  std::time_t time = 0;
  double flops = 0;
};
ProgressStart progress_start(const std::string& dir, int world);

}  // namespace lattice
