#include "dist/parallel_state.h"

#include <initializer_list>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "dist/mpi_comm.h"
#include "dist/nccl_comm.h"

namespace lattice {

ParallelLayout make_layout(int world, int tp, int pp, int ep, int cp, int dist_opt_instances, int etp,
                           bool tp_pp_dp) {
  if (tp < 1) LATTICE_FAIL() << "--tensor-model-parallel-size must be >= 1, got " << tp;
  if (cp < 1) LATTICE_FAIL() << "--context-parallel-size must be >= 1, got " << cp;
  if (ep < 1) LATTICE_FAIL() << "--expert-model-parallel-size must be >= 1, got " << ep;
  if (pp < 1) LATTICE_FAIL() << "--pipeline-model-parallel-size must be >= 1, got " << pp;
  if (world % (tp * cp * pp) != 0)
    LATTICE_FAIL() << "world size " << world << " is not divisible by --tensor-model-parallel-size " << tp
                   << (cp > 1 ? " x --context-parallel-size " + std::to_string(cp) : std::string())
                   << " x --pipeline-model-parallel-size " << pp << " (start a multiple of " << tp * cp * pp
                   << " processes, e.g. mpirun -np " << tp * cp * pp << ")";
  const int dp = world / (tp * cp * pp);
  if (etp != 0 && etp != 1 && etp != tp)
    LATTICE_FAIL() << "--expert-tensor-parallel-size " << etp << " is neither 1 nor --tensor-model-parallel-size " << tp;
  const bool whole = etp == 1 && tp > 1;  // the experts whole: ep groups over the stage's tp x cp x dp ranks
  if (whole && (tp * cp * dp) % ep != 0)
    LATTICE_FAIL() << "--expert-model-parallel-size " << ep << " does not divide tensor " << tp
                   << (cp > 1 ? " x context-parallel " + std::to_string(cp) : std::string()) << " x data-parallel "
                   << dp << ": with --expert-tensor-parallel-size 1 the experts are split over those ranks";
  if (!whole && dp % ep != 0)
    LATTICE_FAIL() << "--expert-model-parallel-size " << ep << " does not divide the data-parallel size " << dp
                   << " (world " << world << " / (tensor " << tp << " x pipeline " << pp
                   << ")): the experts are split over data-parallel ranks";
  ParallelLayout l{world, tp, pp, dp, ep, cp, dist_opt_instances};
  l.experts_whole = whole;
  l.tp_pp_dp = tp_pp_dp;
  if (tp_pp_dp && (cp > 1 || ep > 1 || whole))  // (Megatron asserts cp x ep <= 1 with it)
    LATTICE_FAIL() << "--use-tp-pp-dp-mapping does not go with "
                   << (cp > 1   ? "--context-parallel-size " + std::to_string(cp)
                       : ep > 1 ? "--expert-model-parallel-size " + std::to_string(ep)
                                : std::string("--expert-tensor-parallel-size 1 under tensor parallelism"))
                   << " (the tp-pp-dp rank order has no context- or expert-parallel axis)";
  if (dist_opt_instances < 1)
    LATTICE_FAIL() << "--num-distributed-optimizer-instances must be >= 1, got " << dist_opt_instances;
  // An instance is a run of whole data-parallel ranks (each with all its context-parallel ranks) that
  // holds whole copies of the model, every expert included: the instances divide dp and the copies of
  // each expert (dp / ep per context-parallel rank; whole experts: tp cp dp / ep).
  const int copies = whole ? l.expert_dp_group() : l.expert_dp();
  if (dp % dist_opt_instances != 0 || copies % dist_opt_instances != 0)
    LATTICE_FAIL() << "--num-distributed-optimizer-instances " << dist_opt_instances << " does not divide the "
                   << (dp % dist_opt_instances != 0
                           ? "data-parallel size " + std::to_string(dp)
                           : "expert data-parallel size " + std::to_string(copies) + " (" +
                                 (whole ? "tensor x context x data-parallel " + std::to_string(tp * cp * dp)
                                        : "data-parallel " + std::to_string(dp)) +
                                 " / --expert-model-parallel-size " + std::to_string(ep) + ")")
                   << ": each instance is an equal run of data-parallel ranks holding every weight";
  return l;
}

namespace {

// A rank's coordinates, in rank order (tp fastest).
enum Axis { kTp, kCp, kDp, kPp };
struct Coords {
  int at[4];
};
Coords coords_of(const ParallelLayout& l, int rank) {
  if (l.tp_pp_dp) return {{rank % l.tp, rank / l.tp % l.cp, rank / (l.tp * l.cp * l.pp), rank / (l.tp * l.cp) % l.pp}};
  return {{rank % l.tp, rank / l.tp % l.cp, rank / (l.tp * l.cp) % l.dp, rank / (l.tp * l.cp * l.dp)}};
}

// The groups of ranks that share every coordinate but those in `vary`: each in increasing rank
// order, the groups in the order of their first rank.
std::vector<std::vector<int>> groups_varying(const ParallelLayout& l, std::initializer_list<Axis> vary) {
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(size_t(l.world), -1);  // by the group's first rank
  for (int r = 0; r < l.world; ++r) {
    Coords c = coords_of(l, r);
    for (Axis a : vary) c.at[a] = 0;
    const int first = l.rank_of(c.at[kTp], c.at[kCp], c.at[kDp], c.at[kPp]);
    if (group_of[size_t(first)] < 0) {
      group_of[size_t(first)] = int(groups.size());
      groups.emplace_back();
    }
    groups[size_t(group_of[size_t(first)])].push_back(r);
  }
  return groups;
}

// Each group cut into `parts` runs of consecutive members (shards), and the groups of the members at the
// same place in each run (replicas).
void split_groups(const std::vector<std::vector<int>>& groups, int parts, std::vector<std::vector<int>>& shards,
                  std::vector<std::vector<int>>& replicas) {
  for (const std::vector<int>& g : groups) {
    const size_t run = g.size() / size_t(parts);
    for (size_t i = 0; i < size_t(parts); ++i) shards.emplace_back(g.begin() + long(i * run), g.begin() + long((i + 1) * run));
    for (size_t j = 0; j < run; ++j) {
      replicas.emplace_back();
      for (size_t i = 0; i < size_t(parts); ++i) replicas.back().push_back(g[i * run + j]);
    }
  }
}

}  // namespace

GroupPlan plan_groups(const ParallelLayout& l) {
  GroupPlan g;
  g.tp = groups_varying(l, {kTp});
  g.cp = groups_varying(l, {kCp});
  g.dp = groups_varying(l, {kDp});
  g.dp_cp = groups_varying(l, {kCp, kDp});  // dp_rank x cp + cp_rank
  g.pp = groups_varying(l, {kPp});
  if (l.pp > 1)
    for (const std::vector<int>& stages : g.pp) g.embedding.push_back({stages.front(), stages.back()});
  if (l.experts_whole) {  // a stage's ranks in rank order (tp, cp, dp): ep groups of consecutive ones
    g.tp_cp = groups_varying(l, {kTp, kCp});
    const int stage = l.tp * l.cp * l.dp;
    for (int pp_r = 0; pp_r < l.pp; ++pp_r) {  // (expert_dp: the copies in instance order, block by block)
      for (int block = 0; block < l.expert_dp_group(); ++block) {
        g.ep.emplace_back();
        for (int e = 0; e < l.ep; ++e) g.ep.back().push_back(pp_r * stage + block * l.ep + e);
      }
      for (int e = 0; e < l.ep; ++e) {
        g.expert_dp.emplace_back();
        for (int block = 0; block < l.expert_dp_group(); ++block)
          g.expert_dp.back().push_back(pp_r * stage + block * l.ep + e);
      }
    }
  } else {
    for (int pp_r = 0; pp_r < l.pp; ++pp_r)
      for (int cp_r = 0; cp_r < l.cp; ++cp_r)
        for (int tp_r = 0; tp_r < l.tp; ++tp_r)
          for (int block = 0; block < l.expert_dp(); ++block) {  // ep consecutive data-parallel ranks
            std::vector<int> grp;
            for (int e = 0; e < l.ep; ++e) grp.push_back(l.rank_of(tp_r, cp_r, block * l.ep + e, pp_r));
            g.ep.push_back(grp);
          }
    // The experts' gradients: every ep-th data-parallel rank, at every context-parallel rank (each
    // holds a share of the tokens), block-major as dp x cp is (dp rank x cp + cp rank).
    for (int pp_r = 0; pp_r < l.pp; ++pp_r)
      for (int tp_r = 0; tp_r < l.tp; ++tp_r)
        for (int e = 0; e < l.ep; ++e) {
          std::vector<int> grp;
          for (int block = 0; block < l.expert_dp(); ++block)
            for (int cp_r = 0; cp_r < l.cp; ++cp_r) grp.push_back(l.rank_of(tp_r, cp_r, block * l.ep + e, pp_r));
          g.expert_dp.push_back(grp);
        }
  }
  if (l.dist_opt_instances > 1) {
    split_groups(g.dp_cp, l.dist_opt_instances, g.dp_cp_shard, g.dp_cp_replicas);
    split_groups(g.expert_dp, l.dist_opt_instances, g.expert_dp_shard, g.expert_dp_replicas);
  }
  return g;
}

std::unique_ptr<ParallelState> ParallelState::single() {
  auto s = std::make_unique<ParallelState>();
  s->world_ = make_local_comm("world");
  s->tp_ = make_local_comm("tp");
  s->dp_ = make_local_comm("dp");
  s->pp_ = make_local_comm("pp");
  s->ep_ = make_local_comm("ep");
  s->cp_ = make_local_comm("cp");
  return s;
}

std::unique_ptr<ParallelState> ParallelState::create(int tp, int pp, double timeout_seconds, int ep, int cp,
                                                     int dist_opt_instances, int etp, bool tp_pp_dp) {
  if (!launched_by_mpirun()) {
    // names the flag when tp, pp, ep, cp or the instances > 1 cannot fit one process
    make_layout(1, tp, pp, ep, cp, dist_opt_instances, etp, tp_pp_dp);
    return single();
  }
  const int world = mpi_init_world();
  set_comm_timeout_seconds(timeout_seconds);
  auto s = std::make_unique<ParallelState>();
  s->layout_ = make_layout(world, tp, pp, ep, cp, dist_opt_instances, etp, tp_pp_dp);
  s->world_rank_ = mpi_world_rank();
  s->uses_mpi_ = true;
  GroupPlan g = plan_groups(s->layout_);
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  s->world_ = make_mpi_comm("world", {all});
  s->tp_ = make_mpi_comm("tp", g.tp);
  s->dp_ = make_mpi_comm("dp", g.dp);
  s->pp_ = make_mpi_comm("pp", g.pp);
  if (!g.embedding.empty()) s->embedding_ = make_mpi_comm("embedding", g.embedding);
  if (cp > 1) {
    s->cp_ = make_mpi_comm("cp", g.cp);
    s->dp_cp_ = make_mpi_comm("dp_cp", g.dp_cp);
  } else {
    s->cp_ = make_local_comm("cp", s->world_rank_);
  }
  if (ep > 1) {
    s->ep_ = make_mpi_comm("ep", g.ep);
  } else {
    s->ep_ = make_local_comm("ep", s->world_rank_);
  }
  // (whole experts without expert parallelism: one copy on every tensor- and data-parallel rank)
  if (ep > 1 || s->layout_.experts_whole) s->expert_dp_ = make_mpi_comm("expert_dp", g.expert_dp);
  if (!g.tp_cp.empty() && cp > 1) s->tp_cp_ = make_mpi_comm("tp_cp", g.tp_cp);
  if (dist_opt_instances > 1) {
    s->dp_cp_shard_ = make_mpi_comm("dp_cp_shard", g.dp_cp_shard);
    s->dp_cp_replicas_ = make_mpi_comm("dp_cp_replicas", g.dp_cp_replicas);
    if (s->expert_dp_) {
      s->expert_dp_shard_ = make_mpi_comm("expert_dp_shard", g.expert_dp_shard);
      s->expert_dp_replicas_ = make_mpi_comm("expert_dp_replicas", g.expert_dp_replicas);
    }
  }
  if (kernels_on_gpu()) {
    // CUDA tensors travel over NCCL: one communicator per group, bootstrapped through the
    // group's MPI communicator (kept for that); world stays MPI (host data only).
    set_nccl_timeout_seconds(timeout_seconds);
    for (auto* c : {&s->tp_, &s->cp_, &s->dp_, &s->dp_cp_, &s->pp_, &s->embedding_, &s->ep_, &s->expert_dp_, &s->tp_cp_,
                    &s->dp_cp_shard_, &s->dp_cp_replicas_, &s->expert_dp_shard_, &s->expert_dp_replicas_}) {
      // Without expert (context) parallelism the ep (cp) group carries nothing: nothing uses it.
      if (!*c || (c == &s->ep_ && ep == 1) || (c == &s->cp_ && cp == 1)) continue;
      // The pipeline group sends and receives between neighbouring stages: its channels.
      std::unique_ptr<Comm> nccl = make_nccl_comm(**c, (*c)->name(), /*point_to_point=*/c == &s->pp_);
      s->bootstrap_.push_back(std::move(*c));
      *c = std::move(nccl);
    }
  }
  return s;
}

CommStats ParallelState::total_stats() const {
  CommStats t;
  for (const Comm* c : {world_.get(), tp_.get(), cp_.get(), dp_.get(), dp_cp_.get(), pp_.get(), embedding_.get(),
                        ep_.get(), expert_dp_.get(), tp_cp_.get(), dp_cp_shard_.get(), dp_cp_replicas_.get(), expert_dp_shard_.get(),
                        expert_dp_replicas_.get()})
    if (c)
      for (int i = 0; i < kNumCommOps; ++i) {
      t.bytes[i] += c->stats().bytes[i];
      t.calls[i] += c->stats().calls[i];
      t.seconds[i] += c->stats().seconds[i];
    }
  return t;
}

void ParallelState::reset_stats() {
  for (Comm* c : {world_.get(), tp_.get(), cp_.get(), dp_.get(), dp_cp_.get(), pp_.get(), embedding_.get(), ep_.get(),
                  expert_dp_.get(), tp_cp_.get(), dp_cp_shard_.get(), dp_cp_replicas_.get(), expert_dp_shard_.get(),
                  expert_dp_replicas_.get()})
    if (c) c->stats().reset();
}

}  // namespace lattice
