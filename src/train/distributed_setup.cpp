#include "train/distributed_setup.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/device.h"
#include "core/error.h"
#include "dist/mpi_comm.h"

namespace lattice {

std::string select_rank_device(const std::string& device_flag) {
  const Device d = parse_device(device_flag.c_str());
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  set_device(d, local ? std::atoi(local) : 0);
  if (d == Device::cpu) return "> device: cpu";
  if (cuda_emulated()) return "> device: cuda (emulated on the CPU)";
  return "> device: cuda " + std::to_string(cuda::current_device()) + ": " + cuda::device_description();
}

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

std::string format_memory_report(const MemoryFootprint& m, int dp, bool dist_opt, double opt) {
  char buf[512];
  char opt_text[32];
  std::snprintf(opt_text, sizeof opt_text, "%.3g", opt);
  const std::string expects_text = "8 + " + std::string(opt_text) + (dist_opt ? "/d" : "");
  const double per_param = double(m.param_bytes + m.grad_bytes + m.optimizer_bytes - m.optimizer_scratch_bytes) /
                           double(std::max<int64_t>(1, m.parameters));
  std::snprintf(buf, sizeof buf,
                "> memory per rank: parameters %.1f MB, gradients %.1f MB, optimizer state %.1f MB "
                "(%lld of %lld parameters%s), activations %.1f MB per micro-batch; %.2f bytes per "
                "parameter (fp32 expects %.2f: %s, d = %d)",
                m.param_bytes / 1e6, m.grad_bytes / 1e6, m.optimizer_bytes / 1e6,
                (long long)m.owned_parameters, (long long)m.parameters,
                dist_opt ? ", distributed optimizer" : "", m.activation_bytes / 1e6, per_param,
                dist_opt ? 8.0 + opt / dp : 8.0 + opt, expects_text.c_str(), dp);
  std::string s = buf;
  if (m.optimizer_scratch_bytes > 0) {
    std::snprintf(buf, sizeof buf, "; the optimizer state includes Muon's scratch, %.1f MB",
                  m.optimizer_scratch_bytes / 1e6);
    s += buf;
  }
  if (m.tensor_parallel > 1) {
    std::snprintf(buf, sizeof buf, "; tensor parallel %d: 1/%d of every layer's weights%s", m.tensor_parallel,
                  m.tensor_parallel,
                  m.sequence_parallel ? ", activations on 1/T of the tokens (sequence parallel)" : "");
    s += buf;
  }
  return s;
}

std::vector<double> gather_per_rank(ParallelState& ps, double value) {
  std::vector<double> v(static_cast<size_t>(ps.world_size()), 0.0);
  v[size_t(ps.world_rank())] = value;
  if (ps.world_size() > 1) ps.world().all_reduce(v.data(), int64_t(v.size()), ReduceOp::sum);
  return v;
}

namespace {

double mb(size_t bytes) { return double(bytes) / 1e6; }

// "4 weights + 4 gradients + 8 Adam = 16" or, sharded, "8 + (8 Adam + 4 staging)/d".
std::string bytes_per_parameter(const MemoryLayout& m) {
  const PrecisionBytes& p = m.precision;
  const int opt = m.optimizer_state_bytes();
  const char* name = m.optimizer == "sgd" ? "SGD" : m.optimizer == "muon" ? "Adam (4 Muon)" : "Adam";
  std::string whole = std::to_string(p.main_params) + " main parameters";
  if (p.weight_copy > 0) whole += " + " + std::to_string(p.weight_copy) + " weight copy";
  whole += " + " + std::to_string(p.grads) + " gradients";
  const int fixed = p.main_params + p.weight_copy + p.grads;
  char buf[256];
  if (m.distributed_optimizer)
    std::snprintf(buf, sizeof buf, "%s + (%d %s + 4 gradient staging)/d = %d + %d/d bytes per parameter, d = %d",
                  whole.c_str(), opt, name, fixed, opt + 4, m.shard_ranks());
  else
    std::snprintf(buf, sizeof buf, "%s + %d %s = %d bytes per parameter", whole.c_str(), opt, name, fixed + opt);
  return buf;
}

}  // namespace

std::string format_memory_estimate(const MemoryLayout& m, const std::vector<RankMemory>& ranks,
                                   const std::string& baseline_note) {
  std::string s = "> memory estimate per rank (MB): model state " + bytes_per_parameter(m) +
                  "; activations = micro-batches in flight x one micro-batch + shared scratch; baseline = " +
                  baseline_note + "\n";
  char buf[640];
  for (const RankMemory& r : ranks) {
    const std::string cp = m.cp > 1 ? ", cp " + std::to_string(r.cp_rank) : std::string();
    std::snprintf(buf, sizeof buf,
                  "  rank %d (tp %d%s, pp %d, dp %d): %.2fM parameters | parameters %.1f, ", r.world_rank, r.tp_rank,
                  cp.c_str(), r.pp_rank, r.dp_rank, double(r.parameters) / 1e6, mb(r.param_bytes));
    s += buf;
    if (r.weight_copy_bytes > 0) {
      std::snprintf(buf, sizeof buf, "weight copy %.1f, ", mb(r.weight_copy_bytes));
      s += buf;
    }
    std::snprintf(buf, sizeof buf, "gradients %.1f, optimizer state %.1f (%.2fM owned)", mb(r.grad_bytes),
                  mb(r.optimizer_bytes), double(r.owned_parameters) / 1e6);
    s += buf;
    if (r.grad_staging_bytes > 0) {
      std::snprintf(buf, sizeof buf, ", gradient staging %.1f", mb(r.grad_staging_bytes));
      s += buf;
    }
    if (r.comm_staging_bytes > 0) {
      std::snprintf(buf, sizeof buf, ", MPI reduction copies %.1f", mb(r.comm_staging_bytes));
      s += buf;
    }
    const size_t scratch = r.activation_bytes - size_t(r.activation_slots) * r.activation_bytes_per_micro_batch;
    std::snprintf(buf, sizeof buf, " | activations %.1f (%d x %.1f + %.1f) | baseline %.1f | peak %.1f MB\n",
                  mb(r.activation_bytes), r.activation_slots, mb(r.activation_bytes_per_micro_batch), mb(scratch),
                  mb(r.baseline_bytes), mb(r.peak_bytes()));
    s += buf;
  }
  s.pop_back();  // the last newline
  return s;
}

std::string format_memory_measured(const std::vector<RankMemory>& ranks, const std::vector<double>& peak,
                                   int64_t iterations, bool device) {
  std::string s = "> memory after " + std::to_string(iterations) + " iteration(s): " +
                  (device ? "device memory in use (cudaMemGetInfo)" : "peak resident memory (VmHWM)") +
                  " of each rank beside its estimate\n";
  char buf[200];
  for (const RankMemory& r : ranks) {
    const double got = peak[size_t(r.world_rank)], want = double(r.peak_bytes());
    std::snprintf(buf, sizeof buf, "  rank %d: %s %.1f MB, estimate %.1f MB (%+.1f%%)\n", r.world_rank,
                  device ? "device memory" : "peak resident", got / 1e6, want / 1e6, 100.0 * (got - want) / want);
    s += buf;
  }
  s.pop_back();  // the last newline
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
