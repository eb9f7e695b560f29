#include "train/data_parallel.h"

#include "core/device.h"
#include "core/error.h"
#include "core/storage.h"

namespace lattice {

DataParallel::DataParallel(GPTModel& model, Comm& dp, const DataParallelConfig& cfg, Comm* ep, Comm* expert_dp,
                           Comm* dp_cp, Comm* replicas, Comm* expert_replicas)
    : model_(model),
      params_(model.params()),
      dp_(dp),
      grads_(dp_cp ? *dp_cp : dp),
      ep_(ep && ep->size() > 1 ? ep : nullptr),
      cfg_(cfg),
      sync_(params_, grads_, cfg.bucket_elements > 0 ? cfg.bucket_elements : default_bucket_elements(grads_.size()),
            cfg.overlap_grad_reduce, cfg.distributed_optimizer, cfg.grad_reduce_in_bf16, expert_dp, replicas,
            expert_replicas) {
  // (whole experts: the expert-parallel groups span the tensor-parallel ranks too)
  const int expert_ranks = grads_.size() * (model.experts_whole() ? model.tensor_parallel().size() : 1);
  LATTICE_CHECK((!ep_ && !model.experts_whole()) ||
                (expert_dp && expert_dp->size() * (ep_ ? ep_->size() : 1) == expert_ranks))
      << "expert parallelism needs the expert data-parallel group";
  whole_ = WholeExperts{cfg.distributed_optimizer ? expert_dp : nullptr, ep_};
  model_.set_grad_ready_hook([this](int index) { sync_.grad_ready(index); });
}

DataParallel::~DataParallel() { model_.set_grad_ready_hook(nullptr); }

int64_t DataParallel::first_sample(int64_t step_first, int64_t micro_batch, int64_t m) const {
  return step_first + m * micro_batch * size() + rank() * micro_batch;
}

ElementRanges DataParallel::owned_ranges() const {
  if (!cfg_.distributed_optimizer) return {};
  return sync_.owned_ranges();
}

void DataParallel::finish_grad_sync() { sync_.finish(); }

// With the distributed optimizer the shards of every rank of the data-parallel group cover each
// element of the model once, the experts of every expert-parallel rank included; without it the
// expert-parallel ranks add their experts. Whole experts (whole_experts) are summed apart.
double DataParallel::grad_norm(Comm* tp, Comm* pp) {
  return lattice::grad_norm(params_, owned_ranges(), shard_group(), tp, pp, expert_group(), whole_experts());
}

// The owned shards with the distributed optimizer: right after the update they are the only
// current parameters (the others arrive with the next gather).
double DataParallel::params_norm(Comm* tp, Comm* pp) {
  return lattice::params_norm(params_, owned_ranges(), shard_group(), tp, pp, expert_group(), whole_experts());
}

int64_t DataParallel::count_zero_grads(Comm* tp, Comm* pp) {
  return lattice::count_zero_grads(params_, owned_ranges(), shard_group(), tp, pp, expert_group(), whole_experts());
}

void DataParallel::start_param_gather() {
  if (!cfg_.distributed_optimizer) return;
  for (const Bucket& b : sync_.buckets())
    gathers_.push_back(sync_.comm(b).iall_gather(params_.params() + b.begin, b.shard_counts));
}

void DataParallel::finish_param_gather() {
  for (auto& g : gathers_) g->wait();
  gathers_.clear();
}

void DataParallel::gather_shards(float* flat) {
  if (current_device() == Device::cpu) {
    for (const Bucket& b : sync_.buckets()) sync_.comm(b).all_gather(flat + b.begin, b.shard_counts);
    return;
  }
  // flat is host memory (a checkpoint's staging) and the group may be NCCL, which gathers
  // device memory: each bucket goes through a device buffer.
  DeviceArray<float> staging;
  for (const Bucket& b : sync_.buckets()) {
    const size_t n = size_t(b.end - b.begin);
    float* d = staging.resize(n);
    copy_to_device(d, flat + b.begin, n * sizeof(float));
    sync_.comm(b).all_gather(d, b.shard_counts);
    copy_to_host(flat + b.begin, d, n * sizeof(float));
  }
}

}  // namespace lattice
