// ParallelState: the process groups of a run, in Megatron's rank order "tp-cp-ep-dp-pp"
// (tensor-parallel rank varies fastest, so TP peers are neighbours):
//   world_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
// or, with --use-tp-pp-dp-mapping (Megatron's "tp-cp-ep-pp-dp"; no context or expert parallelism, as
// in Megatron), pipeline stages before data-parallel copies:
//   world_rank = tp_rank + tp * (pp_rank + pp * dp_rank)
// One communicator per group: tp, cp, dp, pp, and the embedding group (first and last
// pipeline stage of the same tp/cp/dp position). Context parallelism (--context-parallel-size
// cp, model/context_parallel.h) splits every sequence over the cp ranks of a group, which read
// the same micro-batches: the gradients are summed over dp x cp (Megatron's dp_cp group, dp_cp()),
// the data and the losses over dp. Expert parallelism (--expert-model-parallel-size
// ep, Megatron's "tp-ep-dp-pp" order for the experts, whose tensor-parallel size is tp) splits
// the data-parallel ranks of a tp/pp position: ep_rank = dp_rank % ep, the expert-parallel group
// the ep consecutive data-parallel ranks that hold the experts between them, the expert
// data-parallel group (size dp / ep) the ranks holding copies of the same experts. With
// --expert-tensor-parallel-size 1 under tensor parallelism (ParallelLayout::experts_whole; Megatron's
// expert order "tp-ep-dp-pp" with an expert tensor-parallel size of 1) the experts are not split over
// the tensor-parallel ranks: a stage's tp x cp x dp ranks, in rank order, form the expert-parallel
// groups of ep consecutive ranks (ep_rank = (tp_rank + tp (cp_rank + cp dp_rank)) % ep), and the ranks
// holding the same experts the expert data-parallel group (size tp cp dp / ep). Every layer receives the groups it
// needs; nothing reaches for a global. On CPUs every group is an MPI communicator; with
// the kernels on a GPU (core/device.h: set_device before create) tp, dp, pp and
// embedding are NCCL communicators (dist/nccl_comm.h; their blocking operations also
// take host buffers) and world stays MPI.
#pragma once
#include <memory>
#include <vector>

#include "dist/comm.h"

namespace lattice {

struct ParallelLayout {
  int world = 1, tp = 1, pp = 1, dp = 1, ep = 1, cp = 1;
  // --num-distributed-optimizer-instances: the distributed optimizer's copies over dp x cp (Megatron's
  // partial distributed optimizer). Each instance is dp / instances consecutive data-parallel ranks with
  // all their context-parallel ranks (so whole model copies, every expert included: instances divides dp
  // and dp / ep): its part of a dp x cp group shards the dense weights, its part of an expert
  // data-parallel group an expert's (the gradients reduce-scattered and the parameters gathered over
  // it); the instances' shards are then summed over the ranks holding the same shard.
  int dist_opt_instances = 1;
  // --expert-tensor-parallel-size 1 with tp > 1: every expert whole on its rank, the expert-parallel
  // groups over the tensor- and data-parallel ranks (above).
  bool experts_whole = false;
  // The copies of each expert per context-parallel rank (dp / ep); the expert data-parallel group,
  // over which the experts' gradients are summed, holds them at every context-parallel rank.
  int expert_dp() const { return experts_whole ? tp * dp / ep : dp / ep; }
  int expert_dp_group() const { return experts_whole ? tp * cp * dp / ep : dp / ep * cp; }
  // --use-tp-pp-dp-mapping: data-parallel rank outermost (cp = ep = 1).
  bool tp_pp_dp = false;
  // The world rank of a position.
  int rank_of(int tp_r, int cp_r, int dp_r, int pp_r) const {
    return tp_pp_dp ? tp_r + tp * (cp_r + cp * (pp_r + pp * dp_r)) : tp_r + tp * (cp_r + cp * (dp_r + dp * pp_r));
  }
};

// The layout for `world` ranks, or an error naming the flag that cannot work. etp: the experts'
// tensor-parallel size (--expert-tensor-parallel-size; 0: tp); tp_pp_dp: --use-tp-pp-dp-mapping.
ParallelLayout make_layout(int world, int tp, int pp, int ep = 1, int cp = 1, int dist_opt_instances = 1,
                           int etp = 0, bool tp_pp_dp = false);

// Group membership (world ranks) for every group of each kind, in Megatron's order.
struct GroupPlan {
  std::vector<std::vector<int>> tp, cp, dp, dp_cp, pp, embedding, ep, expert_dp;
  std::vector<std::vector<int>> tp_cp;  // (experts_whole only) the ranks routing a micro-batch's rows
  // dist_opt_instances > 1: each dp_cp (expert_dp) group cut into that many runs of consecutive members
  // (the shard groups), and the groups of members at the same place in each run (the replica groups).
  std::vector<std::vector<int>> dp_cp_shard, dp_cp_replicas, expert_dp_shard, expert_dp_replicas;
};
GroupPlan plan_groups(const ParallelLayout& layout);

class ParallelState {
 public:
  // Builds the groups: over MPI when the process was launched by mpirun, else a
  // one-process state (which needs tp = pp = 1).
  static std::unique_ptr<ParallelState> create(int tp, int pp, double timeout_seconds, int ep = 1, int cp = 1,
                                               int dist_opt_instances = 1, int etp = 0, bool tp_pp_dp = false);
  // A one-process state without MPI (tests, the library quickstart).
  static std::unique_ptr<ParallelState> single();

  const ParallelLayout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return layout_.world; }
  int tp_rank() const { return tp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  int pp_rank() const { return pp_->rank(); }
  int cp_rank() const { return cp_->rank(); }
  Comm& world() { return *world_; }
  Comm& tp() { return *tp_; }
  Comm& dp() { return *dp_; }
  // The context-parallel group (one rank without context parallelism), and the ranks whose
  // gradients are summed: dp x cp (the data-parallel group itself without context parallelism).
  Comm& cp() { return *cp_; }
  Comm& dp_cp() { return dp_cp_ ? *dp_cp_ : *dp_; }
  Comm& pp() { return *pp_; }
  // The expert-parallel group (one rank without expert parallelism) and the expert
  // data-parallel group, over which the experts' gradients are summed (without expert parallelism
  // dp x cp, as every other gradient: a context-parallel rank's experts see its share of the tokens).
  Comm& ep() { return *ep_; }
  Comm& expert_dp() { return expert_dp_ ? *expert_dp_ : dp_cp(); }
  // The distributed optimizer's groups: the ranks its gradients are reduce-scattered and its parameters
  // gathered over (dp_cp() and expert_dp() themselves with one instance), and the ranks holding the same
  // shard in the other instances, over which the reduced shards are summed (null with one instance).
  Comm& dp_cp_shard() { return dp_cp_shard_ ? *dp_cp_shard_ : dp_cp(); }
  Comm* dp_cp_replicas() { return dp_cp_replicas_.get(); }
  // (Without expert parallelism the experts' are the others'.)
  Comm& expert_dp_shard() { return expert_dp_ ? (expert_dp_shard_ ? *expert_dp_shard_ : *expert_dp_) : dp_cp_shard(); }
  Comm* expert_dp_replicas() { return expert_dp_ ? expert_dp_replicas_.get() : dp_cp_replicas(); }
  int ep_rank() const { return ep_->rank(); }
  // The ranks whose rows make up a micro-batch's whole sequences, each routing its own with whole
  // experts: tensor x context-parallel (the tensor-parallel group without context parallelism).
  Comm& tp_cp() { return tp_cp_ ? *tp_cp_ : *tp_; }
  // The first and last pipeline stage of this rank's tp/dp position (they share the
  // tied word embedding); null on the other stages and without pipelining.
  Comm* embedding() { return embedding_.get(); }
  bool uses_mpi() const { return uses_mpi_; }
  // Sum of every group's counters.
  CommStats total_stats() const;
  void reset_stats();

 private:
  ParallelLayout layout_;
  int world_rank_ = 0;
  bool uses_mpi_ = false;
  // expert_dp_: null when ep = 1 (unless experts_whole); dp_cp_: null when cp = 1
  std::unique_ptr<Comm> world_, tp_, cp_, dp_, dp_cp_, pp_, embedding_, ep_, expert_dp_;
  std::unique_ptr<Comm> tp_cp_;  // experts_whole with cp > 1 only
  // null with one distributed-optimizer instance (expert_dp_shard_, expert_dp_replicas_: or when ep = 1)
  std::unique_ptr<Comm> dp_cp_shard_, dp_cp_replicas_, expert_dp_shard_, expert_dp_replicas_;
  std::vector<std::unique_ptr<Comm>> bootstrap_;  // the MPI groups the NCCL ones were made from
};

}  // namespace lattice
