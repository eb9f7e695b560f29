// The trainer's distributed plumbing: threads per rank, the start-up check that every
// rank runs the same configuration, Megatron-style memory report, and the per-step
// communication report of --log-comm.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/parallel_state.h"
#include "train/memory_estimate.h"

namespace lattice {

// --device: selects this process's device before anything is allocated (with cuda the
// GPU of its node-local rank, OMPI_COMM_WORLD_LOCAL_RANK, or the CPU emulation) and
// returns the line the trainer logs ("> device: ..."). Fails with set_device's reason,
// naming --device, when no GPU can be used.
std::string select_rank_device(const std::string& device_flag);

// Threads for this rank: --num-threads, else OMP_NUM_THREADS, else the node's cores
// divided among the ranks on the node.
int threads_per_rank(int64_t num_threads_flag, const ParallelState& ps);

// Compares this rank's arguments (JSON) with rank 0's; on any difference the job ends
// with a one-line error naming the rank and the first differing field.
void check_same_config_across_ranks(ParallelState& ps, const std::string& args_json);

struct MemoryFootprint {
  int64_t parameters = 0;          // on this rank
  int64_t owned_parameters = 0;    // whose optimizer state this rank keeps
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  size_t optimizer_scratch_bytes = 0;  // of optimizer_bytes, scratch rather than state (Muon's)
  int tensor_parallel = 1;         // T: weights (and, with sequence parallelism, activations) split T ways
  bool sequence_parallel = false;
};
// "> memory per rank: ... bytes per parameter ..." (Megatron's report, with the bytes
// per parameter of the distributed optimizer: 8 + 8/d for fp32). optimizer_state_bytes: per owned
// parameter (8 Adam, 4 with bf16 moments, 4 SGD; Muon's average: 4 for its matrices' elements, 8 for the others').
std::string format_memory_report(const MemoryFootprint& m, int dp_size, bool distributed_optimizer,
                                 double optimizer_state_bytes = 8);

// --log-memory: one value per world rank, known to every rank (each rank's value summed
// into its own slot over the world group).
std::vector<double> gather_per_rank(ParallelState& ps, double value);

// --log-memory and --dry-run: the bytes-per-parameter formula, then one line per rank
// with its estimate ("  rank R (tp T, pp P, dp D): ... -> peak X MB"). baseline_note says
// where the baseline was measured.
std::string format_memory_estimate(const MemoryLayout& layout, const std::vector<RankMemory>& ranks,
                                   const std::string& baseline_note);
// --log-memory after the first iterations: per rank "  rank R: peak resident X MB,
// estimate Y MB (+Z%)", peak_resident[R] in bytes (VmHWM).
// With `device` (--device cuda on a GPU) the values are each rank's device memory in
// use (device_used_bytes) and the lines say so: "  rank R: device memory X MB, ...".
std::string format_memory_measured(const std::vector<RankMemory>& ranks, const std::vector<double>& peak_resident,
                                   int64_t iterations, bool device = false);

// One line with the bytes and seconds of each collective since the last report.
std::string format_comm_report(const CommStats& delta, int64_t iterations, double exposed_grad_sync_seconds);

}  // namespace lattice
