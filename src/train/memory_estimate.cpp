#include "train/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/layout_only_comm.h"
#include "model/gpt_model.h"
#include "optim/grad_sync.h"
#include "optim/param_buffer.h"

#if LATTICE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lattice {

namespace {

// Elements of real parameters inside `ranges` (the optimizer keeps state for these; the
// alignment padding between parameters has none).
int64_t parameters_in(const ParamBuffer& pb, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t n = 0;
  for (auto [rb, re] : ranges)
    for (const ParamInfo& p : pb.infos()) n += std::max<int64_t>(0, std::min(re, p.offset + p.numel) - std::max(rb, p.offset));
  return n;
}

// Children of `rank` in the binomial reduction tree over p ranks rooted at 0 (round r:
// a rank divisible by 2^r receives from rank + 2^(r-1)).
int binomial_children(int rank, int p) {
  int children = 0;
  for (int r = 1; (1 << (r - 1)) < p; ++r) {
    if (rank % (1 << r) != 0) break;
    if (rank + (1 << (r - 1)) < p) ++children;
  }
  return children;
}

int ceil_log2(int p) {
  int r = 0;
  while ((1 << r) < p) ++r;
  return r;
}

// Copies of the gradient buffer the DP group's collective keeps on `rank` (see RankMemory).
int comm_staging_copies(int rank, int dp, bool reduce_scatter) {
  if (dp <= 1) return 0;
  const int k = binomial_children(rank, dp);
  if (reduce_scatter) return std::min(k, 2);
  return (k > 0 || ceil_log2(dp) % 2 == 1) ? 1 : 0;
}

size_t status_field_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t len = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, len, field) == 0 && line.size() > len && line[len] == ':') {
      unsigned long long kb = 0;
      if (std::sscanf(line.c_str() + len + 1, "%llu", &kb) == 1) return size_t(kb) * 1024;  // "VmRSS:  1234 kB"
    }
  return 0;
}

}  // namespace

RankMemory estimate_rank_memory(const MemoryLayout& m, int world_rank, size_t baseline_bytes) {
  LATTICE_CHECK(m.config.padded_vocab_size > 0) << "memory estimate: TransformerConfig::finalize() not called";
  LATTICE_CHECK(m.pipeline.stages == m.pp) << "memory estimate: pipeline layout of " << m.pipeline.stages
                                            << " stages for pp " << m.pp;
  RankMemory r;
  r.world_rank = world_rank;
  r.tp_rank = world_rank % m.tp;
  r.cp_rank = (world_rank / m.tp) % m.cp;
  r.dp_rank = m.tp_pp_dp ? world_rank / (m.tp * m.cp * m.pp) : (world_rank / (m.tp * m.cp)) % m.dp;
  r.pp_rank = m.tp_pp_dp ? (world_rank / (m.tp * m.cp)) % m.pp : world_rank / (m.tp * m.cp * m.dp);
  // The gradients are summed (and with the distributed optimizer sharded) over dp x cp; with several
  // distributed-optimizer instances reduce-scattered over an instance's consecutive part of it.
  LATTICE_CHECK(m.dist_opt_instances >= 1 && m.dp * m.cp % m.dist_opt_instances == 0)
      << "memory estimate: " << m.dist_opt_instances << " distributed-optimizer instances for dp x cp " << m.dp * m.cp;
  const int grad_ranks = m.shard_ranks(), grad_rank = (r.dp_rank * m.cp + r.cp_rank) % grad_ranks;
  r.baseline_bytes = baseline_bytes;

  ModelPlacement place{stage_layers(m.pipeline, r.pp_rank), r.pp_rank == 0, r.pp_rank == m.pp - 1, 1};
  place.slots = max_in_flight(pipeline_schedule(m.pipeline, m.num_micro_batches, r.pp_rank));
  // The experts' gradients: over the expert data-parallel group, every ep-th data-parallel rank at
  // every context-parallel rank (dp / ep x cp ranks; dp x cp without expert parallelism). Whole experts
  // (--expert-tensor-parallel-size 1): every ep-th rank of the stage's tp x cp x dp, in rank order.
  const bool whole = m.config.experts_whole(m.tp);
  const int expert_ranks = whole ? m.tp * m.cp * m.dp : m.dp;  // the ranks the experts are spread over
  const int expert_place = whole ? r.tp_rank + m.tp * (r.cp_rank + m.cp * r.dp_rank) : r.dp_rank;
  LATTICE_CHECK(m.ep >= 1 && expert_ranks % m.ep == 0) << "memory estimate: expert parallelism " << m.ep << " for "
                                                       << expert_ranks << " ranks";
  const int expert_dp_ranks = expert_ranks / m.ep * (whole ? 1 : m.cp) / m.dist_opt_instances;
  const int ep_rank = expert_place % m.ep;
  const int expert_dp_rank = (whole ? expert_place / m.ep : expert_place / m.ep * m.cp + r.cp_rank) % expert_dp_ranks;
  LayoutOnlyComm tp_group(r.tp_rank, m.tp);
  const ParamBuffer pb = GPTModel::parameter_registry(m.config, TensorParallel{&tp_group, false}, place, ep_rank, m.ep);
  r.buffer_elements = pb.numel();
  r.parameters = parameters_in(pb, {{0, pb.numel()}});
  if (m.distributed_optimizer) {
    // The model's gradient buckets, reduce-scattered: this DP rank owns its even share of each.
    const int64_t bucket = m.ddp_num_buckets > 0   ? std::max<int64_t>(1, pb.numel() / m.ddp_num_buckets)
                           : m.ddp_bucket_size > 0 ? m.ddp_bucket_size
                                                   : default_bucket_elements(grad_ranks);
    std::vector<std::pair<int64_t, int64_t>> owned;
    for (const Bucket& b : make_buckets(pb, bucket, grad_ranks, expert_dp_ranks)) {
      const int rank = b.expert ? expert_dp_rank : grad_rank;  // the experts' over the expert data-parallel group
      const int64_t s = b.shard_begin(rank);
      owned.emplace_back(s, s + b.shard_counts[size_t(rank)]);
      r.grad_staging_bytes += size_t(b.shard_counts[size_t(rank)]) * (m.grad_reduce_in_bf16 ? 2 : 4);
    }
    r.owned_parameters = parameters_in(pb, owned);
  } else {
    r.owned_parameters = r.parameters;
  }
  const PrecisionBytes& p = m.precision;
  r.param_bytes = size_t(r.buffer_elements) * size_t(p.main_params);
  r.weight_copy_bytes = size_t(r.buffer_elements) * size_t(p.weight_copy);
  r.grad_bytes = size_t(r.buffer_elements) * size_t(p.grads);
  r.optimizer_bytes = size_t(r.owned_parameters) * size_t(m.optimizer_state_bytes());
  if (m.optimizer == "muon") {  // no second moment for Muon's matrices (every parameter owned); its scratch
    r.optimizer_bytes -= size_t(muon_matrix_elements(pb.infos())) * sizeof(float);
    const MuonWorkspaceSize ws = muon_workspace_size(pb.infos(), m.muon, m.tp);
    if (ws.elements > 0) r.optimizer_bytes += ws.bytes();
  }
  // --grad-reduce-in-bf16: the buckets' bf16 copy (GradSync), which is also what MPI copies.
  const bool bf16_reduce = m.grad_reduce_in_bf16 && (grad_ranks > 1 || m.distributed_optimizer);
  if (bf16_reduce) r.grad_staging_bytes += size_t(r.buffer_elements) * 2;
  r.comm_staging_bytes = size_t(comm_staging_copies(grad_rank, grad_ranks, m.distributed_optimizer)) *
                         size_t(r.buffer_elements) * size_t(bf16_reduce ? 2 : p.grads);
  // The tied word embedding's gradient, all-reduced in place between the first and last
  // stage (a group of 2: one copy on both), at another moment than the DP reduction.
  if (m.pp > 1 && !m.config.untie_embeddings_and_output_weights && (place.pre_process || place.post_process))
    r.comm_staging_bytes = std::max(r.comm_staging_bytes, size_t(m.config.padded_vocab_size / m.tp) *
                                                              size_t(m.config.hidden_size) * size_t(p.grads));

  LayoutOnlyComm group(r.tp_rank, m.tp);
  const TensorParallel tp{m.tp > 1 ? &group : nullptr, m.sequence_parallel};
  const int64_t B = m.micro_batch_size, T = m.seq_length / m.cp;
  r.activation_slots = place.slots;
  // With context parallelism the gathered keys and values and their staging as well.
  r.activation_bytes = GPTModel::activation_bytes(m.config, B, T, tp, place, m.ep, m.cp) +
                       GPTModel::context_parallel_bytes(m.config, B, m.seq_length, m.tp, m.cp);
  ModelPlacement one = place, two = place;
  one.slots = 1;
  two.slots = 2;
  r.activation_bytes_per_micro_batch =
      GPTModel::activation_bytes(m.config, B, T, tp, two, m.ep, m.cp) -
      GPTModel::activation_bytes(m.config, B, T, tp, one, m.ep, m.cp);
  return r;
}

std::vector<RankMemory> estimate_all_ranks(const MemoryLayout& m, size_t baseline_bytes) {
  std::vector<RankMemory> all;
  for (int w = 0; w < m.tp * m.cp * m.pp * m.dp; ++w) all.push_back(estimate_rank_memory(m, w, baseline_bytes));
  return all;
}

size_t resident_bytes() { return status_field_bytes("VmRSS"); }
size_t peak_resident_bytes() { return status_field_bytes("VmHWM"); }

size_t device_used_bytes() {
#if LATTICE_WITH_CUDA
  if (!kernels_on_gpu()) return 0;
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  LATTICE_CHECK(err == cudaSuccess) << "cudaMemGetInfo: " << cudaGetErrorString(err);
  return total_bytes - free_bytes;
#else
  return 0;
#endif
}

}  // namespace lattice
