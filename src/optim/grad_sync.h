// Data-parallel gradient synchronisation over the flat gradient buffer, as Megatron's
// DistributedDataParallel: the buffer is cut into buckets (in backward order: the last
// parameters first), and each bucket is sum-all-reduced (or, with the distributed
// optimizer, reduce-scattered so that each DP rank ends with the summed gradient of its
// shard of every bucket). Where Megatron pre-scales the gradients by 1/DP, lattice puts
// the 1/DP into the loss gradient's scale (train_step: 1/(micro-batches x DP)), so a
// micro-batch's backward computes the same numbers under every layout (fp16 overflows
// depend on magnitudes); the reduced gradient is the same average. With overlap, a bucket's
// non-blocking reduction starts as soon as all of its gradients are final in the last
// micro-batch's backward. Expert weights (ParamInfo::expert, the buffer's tail) form buckets of
// their own, reduced over the expert data-parallel group (the data-parallel group without expert
// parallelism). With reduce_in_bf16 (--grad-reduce-in-bf16) gradients are
// still accumulated in fp32; each bucket is rounded to bf16 for the reduction only (half
// the bytes) and widened back into the fp32 buffer afterwards. With several distributed-optimizer
// instances (--num-distributed-optimizer-instances) the reduce-scatter runs over the instance's
// shard group, then each reduced shard is sum-all-reduced over the replica group (the ranks holding
// the same shard in the other instances), in bf16 too with reduce_in_bf16: every rank then has the
// sum over all of dp x cp, as with one instance (Megatron's partial distributed optimizer).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/storage.h"
#include "dist/comm.h"
#include "optim/param_buffer.h"

namespace lattice {

struct Bucket {
  int64_t begin = 0, end = 0;          // element range of the flat buffer
  std::vector<int> params;             // parameter indices it covers
  bool expert = false;                 // expert weights: reduced over the expert data-parallel group
  std::vector<int64_t> shard_counts;   // per rank of its group: elements of [begin, end) it owns
  int64_t shard_begin(int rank) const; // first element owned by `rank`
};

// Megatron's default bucket size: max(40M, 1M x DP) elements.
int64_t default_bucket_elements(int dp);

// Buckets over the buffer, walking parameters from the last placed to the first (the experts',
// then the others'); expert_dp: the expert data-parallel size (0: dp).
std::vector<Bucket> make_buckets(const ParamBuffer& params, int64_t bucket_elements, int dp, int expert_dp = 0);

class GradSync {
 public:
  // expert_dp: the expert data-parallel group (null: dp). replicas, expert_replicas: with reduce_scatter,
  // the groups the reduced shards are summed over afterwards (null: none; expert_replicas null: replicas).
  GradSync(ParamBuffer& params, Comm& dp, int64_t bucket_elements, bool overlap, bool reduce_scatter,
           bool reduce_in_bf16 = false, Comm* expert_dp = nullptr, Comm* replicas = nullptr,
           Comm* expert_replicas = nullptr);
  ~GradSync();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The group a bucket is reduced over (and its shards gathered over).
  Comm& comm(const Bucket& b) const { return b.expert ? expert_dp_ : dp_; }
  // Call before each micro-batch's backward; `last` marks the last micro-batch.
  void begin_backward(bool last);
  // The gradient of parameter `index` is final for this micro-batch (called from the
  // model's backward). In the last micro-batch with overlap, completes buckets start.
  void grad_ready(int index);
  // Starts whatever has not started, and waits for every bucket's reduction.
  void finish();
  // Seconds spent waiting in finish() in the last step (communication not hidden).
  double exposed_seconds() const { return exposed_seconds_; }
  // Elements of the flat buffer this rank owns (the distributed optimizer's shard):
  // one [begin, end) range per bucket.
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;

 private:
  void start_bucket(size_t b);
  // Distributed-optimizer instances: the group bucket b's shard is summed over with the other instances'
  // (null: none), and that all-reduce started (once its reduce-scatter is complete). They start in bucket
  // order on every rank (one collective order per group), as soon as the reduce-scatters end: during the
  // backward with overlap (each grad_ready drives them), else in finish().
  Comm* replica_group(const Bucket& b) const { return reduce_scatter_ ? (b.expert ? expert_replicas_ : replicas_) : nullptr; }
  void start_replica_sum(size_t b);
  // b's first element in the reduce-scatter staging buffers.
  int64_t staging_offset(size_t b) const;

  ParamBuffer& params_;
  Comm& dp_;
  Comm& expert_dp_;
  Comm* replicas_;         // null or one rank: none
  Comm* expert_replicas_;
  bool overlap_, reduce_scatter_, bf16_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  std::vector<int> pending_;        // per bucket: params not yet ready
  std::vector<bool> started_;
  std::vector<std::unique_ptr<CommRequest>> requests_;
  std::vector<std::unique_ptr<CommRequest>> replica_requests_;  // per bucket: its cross-instance all-reduce
  size_t next_replica_ = 0;  // the first bucket whose cross-instance all-reduce has not started
  // Device staging buffers.
  DeviceArray<float> scratch_;      // reduce-scatter output staging
  DeviceArray<uint16_t> bf16_send_; // bf16: the buffer's gradients, rounded [numel]
  DeviceArray<uint16_t> bf16_recv_; // bf16 reduce-scatter output [owned elements]
  bool last_ = false;
  double exposed_seconds_ = 0;
};

}  // namespace lattice
