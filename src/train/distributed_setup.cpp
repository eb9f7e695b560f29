#include "train/distributed_setup.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "dist/mpi_comm.h"

namespace lattice {

int threads_per_rank(int64_t num_threads_flag, const ParallelState& ps) {
  if (num_threads_flag > 0) return int(num_threads_flag);
  if (std::getenv("OMP_NUM_THREADS") != nullptr || !ps.uses_mpi()) return omp_get_max_threads();
  const int local = mpi_local_size();
  return std::max(1, omp_get_num_procs() / std::max(1, local));
}

void check_same_config_across_ranks(ParallelState& ps, const std::string& args_json) {
  Comm& world = ps.world();
  if (world.size() == 1) return;
  int64_t len = int64_t(args_json.size());
  world.broadcast(&len, sizeof len, 0);
  std::string root(static_cast<size_t>(len), '\0');
  if (world.rank() == 0) root = args_json;
  world.broadcast(root.data(), len, 0);
  std::string diff;
  if (root != args_json) {
    auto mine = nlohmann::json::parse(args_json), theirs = nlohmann::json::parse(root);
    for (auto it = theirs.begin(); it != theirs.end(); ++it)
      if (!mine.contains(it.key()) || mine[it.key()] != it.value()) {
        diff = "rank " + std::to_string(world.rank()) + " runs --" + it.key() + " " +
               (mine.contains(it.key()) ? mine[it.key()].dump() : "(unset)") + " but rank 0 runs " +
               it.value().dump() + ": every rank must get the same flags";
        break;
      }
    if (diff.empty()) diff = "rank " + std::to_string(world.rank()) + "'s arguments differ from rank 0's";
  }
  double bad = diff.empty() ? 0 : 1;
  world.all_reduce(&bad, 1, ReduceOp::max);
  if (!diff.empty()) abort_job(diff);
  if (bad > 0) world.barrier();  // the differing rank aborts the job; wait for it
}

std::string format_memory_report(const MemoryFootprint& m, int dp, bool dist_opt) {
  char buf[512];
  const double per_param =
      double(m.param_bytes + m.grad_bytes + m.optimizer_bytes) / double(std::max<int64_t>(1, m.parameters));
  std::snprintf(buf, sizeof buf,
                "> memory per rank: parameters %.1f MB, gradients %.1f MB, optimizer state %.1f MB "
                "(%lld of %lld parameters%s), activations %.1f MB per micro-batch; %.2f bytes per "
                "parameter (fp32 expects %.2f: %s, d = %d)",
                m.param_bytes / 1e6, m.grad_bytes / 1e6, m.optimizer_bytes / 1e6,
                (long long)m.owned_parameters, (long long)m.parameters,
                dist_opt ? ", distributed optimizer" : "", m.activation_bytes / 1e6, per_param,
                dist_opt ? 8.0 + 8.0 / dp : 16.0, dist_opt ? "8 + 8/d" : "16", dp);
  std::string s = buf;
  if (m.tensor_parallel > 1) {
    std::snprintf(buf, sizeof buf, "; tensor parallel %d: 1/%d of every layer's weights%s", m.tensor_parallel,
                  m.tensor_parallel,
                  m.sequence_parallel ? ", activations on 1/T of the tokens (sequence parallel)" : "");
    s += buf;
  }
  return s;
}

std::string format_comm_report(const CommStats& d, int64_t iterations, double exposed) {
  std::string s = "> communication per iteration:";
  char buf[160];
  for (int op = 0; op < kNumCommOps; ++op) {
    if (d.calls[op] == 0) continue;
    std::snprintf(buf, sizeof buf, " %s %.3f MB in %.1f ms (%lld calls) |", comm_op_name(CommOp(op)),
                  double(d.bytes[op]) / 1e6 / double(iterations), d.seconds[op] * 1e3 / double(iterations),
                  (long long)(d.calls[op] / uint64_t(iterations)));
    s += buf;
  }
  std::snprintf(buf, sizeof buf, " gradient sync not hidden by backward: %.1f ms |", exposed * 1e3);
  return s + buf;
}

}  // namespace lattice
