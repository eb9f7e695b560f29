#include "optim/grad_sync.h"

#include <algorithm>
#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"

namespace lattice {

int64_t Bucket::shard_begin(int rank) const {
  int64_t b = begin;
  for (int r = 0; r < rank; ++r) b += shard_counts[size_t(r)];
  return b;
}

int64_t default_bucket_elements(int dp) { return std::max<int64_t>(40000000, int64_t(1000000) * dp); }

std::vector<Bucket> make_buckets(const ParamBuffer& params, int64_t bucket_elements, int dp, int expert_dp) {
  LATTICE_CHECK(bucket_elements > 0) << "--ddp-bucket-size must be positive";
  if (expert_dp <= 0) expert_dp = dp;
  const auto& infos = params.infos();
  std::vector<int> order;  // parameters by offset, last first
  for (int i = 0; i < int(infos.size()); ++i) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return infos[size_t(a)].offset > infos[size_t(b)].offset; });
  std::vector<Bucket> buckets;
  Bucket cur;
  cur.end = params.numel();
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    const bool expert = infos[size_t(i)].expert;
    cur.expert = expert;
    cur.params.push_back(i);
    cur.begin = infos[size_t(i)].offset;
    const bool kind_ends = k + 1 == order.size() || infos[size_t(order[k + 1])].expert != expert;
    if (cur.end - cur.begin >= bucket_elements || kind_ends) {
      if (k + 1 == order.size()) cur.begin = 0;
      else if (kind_ends) cur.begin = params.expert_begin();  // the alignment gap before the experts
      cur.shard_counts = even_split(cur.end - cur.begin, expert ? expert_dp : dp);
      buckets.push_back(cur);
      Bucket next;
      next.end = cur.begin;
      cur = next;
    }
  }
  return buckets;
}

GradSync::GradSync(ParamBuffer& params, Comm& dp, int64_t bucket_elements, bool overlap, bool reduce_scatter,
                   bool reduce_in_bf16, Comm* expert_dp, Comm* replicas, Comm* expert_replicas)
    : params_(params),
      dp_(dp),
      expert_dp_(expert_dp ? *expert_dp : dp),
      replicas_(replicas && replicas->size() > 1 ? replicas : nullptr),
      expert_replicas_(expert_replicas && expert_replicas->size() > 1 ? expert_replicas : replicas_),
      overlap_(overlap),
      reduce_scatter_(reduce_scatter),
      bf16_(reduce_in_bf16) {
  LATTICE_CHECK(reduce_scatter || (!replicas_ && !expert_replicas_))
      << "distributed-optimizer instances need the reduce-scatter (--use-distributed-optimizer)";
  buckets_ = make_buckets(params, bucket_elements, dp.size(), expert_dp_.size());
  bucket_of_param_.assign(params.infos().size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int p : buckets_[b].params) bucket_of_param_[size_t(p)] = int(b);
  pending_.assign(buckets_.size(), 0);
  started_.assign(buckets_.size(), false);
  requests_.resize(buckets_.size());
  replica_requests_.resize(buckets_.size());
  int64_t owned = 0;
  for (const Bucket& b : buckets_) owned += b.shard_counts[size_t(comm(b).rank())];
  if (bf16_) {
    bf16_send_.resize(size_t(params.numel()));
    if (reduce_scatter_) bf16_recv_.resize(size_t(owned));
  } else {
    scratch_.resize(size_t(owned));
  }
}

GradSync::~GradSync() = default;

void GradSync::begin_backward(bool last) {
  last_ = last;
  if (!last) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = int(buckets_[b].params.size());
    started_[b] = false;
  }
}

void GradSync::grad_ready(int index) {
  if (!last_ || !overlap_) return;
  const int b = bucket_of_param_[size_t(index)];
  if (--pending_[size_t(b)] == 0) start_bucket(size_t(b));
  // Drive progress of the reductions in flight (MPI progresses inside its calls).
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (started_[k] && requests_[k]) requests_[k]->test();
  // Instances: each finished reduce-scatter's shard summed with the other instances', in bucket order.
  while (next_replica_ < buckets_.size() && started_[next_replica_] && requests_[next_replica_] &&
         replica_group(buckets_[next_replica_]) && requests_[next_replica_]->test()) {
    requests_[next_replica_].reset();
    start_replica_sum(next_replica_++);
  }
}

int64_t GradSync::staging_offset(size_t b) const {
  int64_t off = 0;
  for (size_t k = 0; k < b; ++k) off += buckets_[k].shard_counts[size_t(comm(buckets_[k]).rank())];
  return off;
}

void GradSync::start_replica_sum(size_t b) {
  const Bucket& bk = buckets_[b];
  const int64_t n = bk.shard_counts[size_t(comm(bk).rank())], off = staging_offset(b);
  Comm* rep = replica_group(bk);
  replica_requests_[b] = bf16_ ? rep->iall_reduce_bf16(bf16_recv_.data() + off, n) : rep->iall_reduce(scratch_.data() + off, n);
}

void GradSync::start_bucket(size_t b) {
  const Bucket& bk = buckets_[b];
  float* g = params_.grads() + bk.begin;
  const int64_t n = bk.end - bk.begin;
  Comm& group = comm(bk);
  const int64_t off = reduce_scatter_ ? staging_offset(b) : 0;  // this rank's shard of bucket b in the staging buffers
  if (bf16_) {
    uint16_t* h = bf16_send_.data() + bk.begin;
    cast_fp32_to_bf16(h, g, n);
    requests_[b] = reduce_scatter_ ? group.ireduce_scatter_bf16(h, bf16_recv_.data() + off, bk.shard_counts)
                                   : group.iall_reduce_bf16(h, n);
  } else if (reduce_scatter_) {
    requests_[b] = group.ireduce_scatter(g, scratch_.data() + off, bk.shard_counts);
  } else {
    requests_[b] = group.iall_reduce(g, n);
  }
  started_[b] = true;
}

void GradSync::finish() {
  Timer t;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!started_[b] || !overlap_) start_bucket(b);
  // Other instances: each reduce-scatter's shard summed with theirs (the replica group's members hold the
  // same place), the all-reduces started in bucket order as the reduce-scatters end (some already did).
  for (size_t b = next_replica_; b < buckets_.size(); ++b) {
    if (!replica_group(buckets_[b])) continue;
    requests_[b]->wait();
    requests_[b].reset();
    start_replica_sum(b);
  }
  next_replica_ = 0;
  int64_t off = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (requests_[b]) {
      requests_[b]->wait();
      requests_[b].reset();
    }
    if (replica_requests_[b]) {
      replica_requests_[b]->wait();
      replica_requests_[b].reset();
    }
    const Bucket& bk = buckets_[b];
    if (reduce_scatter_) {
      const int rank = comm(bk).rank();
      const int64_t n = bk.shard_counts[size_t(rank)];
      float* mine = params_.grads() + bk.shard_begin(rank);
      if (bf16_)
        cast_bf16_to_fp32(mine, bf16_recv_.data() + off, n);
      else
        copy_on_device(mine, scratch_.data() + off, size_t(n) * sizeof(float));
      off += n;
    } else if (bf16_) {
      cast_bf16_to_fp32(params_.grads() + bk.begin, bf16_send_.data() + bk.begin, bk.end - bk.begin);
    }
    started_[b] = false;
  }
  exposed_seconds_ = t.seconds();
}

std::vector<std::pair<int64_t, int64_t>> GradSync::owned_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (const Bucket& b : buckets_) {
    const int rank = comm(b).rank();
    const int64_t s = b.shard_begin(rank);
    r.emplace_back(s, s + b.shard_counts[size_t(rank)]);
  }
  return r;
}

}  // namespace lattice
