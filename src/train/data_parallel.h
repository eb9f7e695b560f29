// Data parallelism for the training step: which samples this DP rank takes, the
// gradient reduction (all-reduce, or reduce-scatter with the distributed optimizer),
// the gradient norm across shards, and the parameter all-gather after a sharded update. With
// expert parallelism the experts' weights are reduced, sharded and gathered over the expert
// data-parallel group, and the norms add the other expert-parallel ranks' experts. With context
// parallelism the gradients are summed, sharded and gathered over dp x cp (each context-parallel
// rank's gradients are its tokens' part of its data-parallel rank's), the data split over dp.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/comm.h"
#include "model/gpt_model.h"
#include "optim/grad_sync.h"
#include "optim/optimizer.h"
#include "optim/param_buffer.h"

namespace lattice {

struct DataParallelConfig {
  bool distributed_optimizer = false;  // --use-distributed-optimizer (ZeRO-1)
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  int64_t bucket_elements = 0;         // 0: Megatron's default
  bool grad_reduce_in_bf16 = false;    // --grad-reduce-in-bf16 (fp32 accumulation, bf16 reduction)
};

class DataParallel {
 public:
  // Connects the model's gradient-ready hook to the bucketed reduction. ep, expert_dp: the
  // expert-parallel and expert data-parallel groups (null: no expert parallelism); dp_cp: the
  // ranks the gradients are summed over (null: dp). With several distributed-optimizer instances
  // (ParallelState::dp_cp_shard): expert_dp and dp_cp are an instance's shard groups, and replicas,
  // expert_replicas the groups the reduced shards are summed over (grad_sync.h).
  DataParallel(GPTModel& model, Comm& dp, const DataParallelConfig& cfg, Comm* ep = nullptr,
               Comm* expert_dp = nullptr, Comm* dp_cp = nullptr, Comm* replicas = nullptr,
               Comm* expert_replicas = nullptr);
  ~DataParallel();

  int rank() const { return dp_.rank(); }
  int size() const { return dp_.size(); }
  Comm& comm() { return dp_; }          // the data (and losses) of the step
  Comm& grad_comm() { return grads_; }  // the gradients' (dp x cp; an instance's part of it)
  const DataParallelConfig& config() const { return cfg_; }
  GradSync& grad_sync() { return sync_; }

  // Megatron's sampler: micro-step m of an iteration covers MBS x DP consecutive samples
  // of the global batch, and DP rank r takes the r-th MBS of them. Returns the first
  // sample of this rank's micro-batch (the global batch starting at sample `step_first`),
  // and the micro-batch's index in the global batch as a single process would number it
  // (dropout masks are keyed by it).
  int64_t first_sample(int64_t step_first, int64_t micro_batch, int64_t m) const;
  int64_t global_micro_batch_index(int64_t m) const { return m * size() + rank(); }

  // The elements this rank's optimizer updates (its shard, or everything).
  ElementRanges owned_ranges() const;

  // After the last micro-batch's backward: finish the gradient reduction.
  void finish_grad_sync();
  // Global gradient norm over the owned elements' ranks; `tp`, `pp`: the tensor- and
  // pipeline-parallel groups the norm also sums over.
  double grad_norm(Comm* tp = nullptr, Comm* pp = nullptr);
  // The parameters' norm and the zero gradients, counted the same way (optimizer.h).
  double params_norm(Comm* tp = nullptr, Comm* pp = nullptr);
  int64_t count_zero_grads(Comm* tp = nullptr, Comm* pp = nullptr);
  // After the optimizer step: all-gather the updated shards (distributed optimizer).
  void start_param_gather();
  void finish_param_gather();
  // Completes a flat host buffer (the parameter layout) of which each rank filled its shard.
  void gather_shards(float* flat);

 private:
  // The groups the norms and counts sum over besides tp and pp (optimizer.h): the data-parallel
  // group when each rank holds a shard, else none; the expert-parallel group when the ranks hold
  // whole copies but their own experts, else none.
  Comm* shard_group() { return cfg_.distributed_optimizer ? &grads_ : nullptr; }
  Comm* expert_group() const { return cfg_.distributed_optimizer || model_.experts_whole() ? nullptr : ep_; }
  // Whole experts (GPTModel::experts_whole): their squares over their shards' group, then ep (null: not whole).
  const WholeExperts* whole_experts() const { return model_.experts_whole() ? &whole_ : nullptr; }

  GPTModel& model_;
  ParamBuffer& params_;
  Comm& dp_;
  Comm& grads_;  // dp, or dp x cp
  Comm* ep_;  // null or one rank: no expert parallelism
  WholeExperts whole_;  // (whole_experts)
  DataParallelConfig cfg_;
  GradSync sync_;
  std::vector<std::unique_ptr<CommRequest>> gathers_;
};

}  // namespace lattice
