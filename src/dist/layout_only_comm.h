// A group of `size` ranks that only answers rank() and size(): enough to lay a model out as one rank of a
// tensor-parallel group would (GPTModel::parameter_registry, activation_bytes) without processes, for the
// memory estimate (train/memory_estimate.h) and for reading another layout's checkpoint
// (checkpoint/megatron_checkpoint.h). Any transfer is a bug.
#pragma once
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace lattice {

class LayoutOnlyComm : public Comm {
 public:
  LayoutOnlyComm(int rank, int size) : Comm("layout only"), rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) ranks_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void all_reduce(float*, int64_t, ReduceOp) override { no_transfer(); }
  void all_reduce(double*, int64_t, ReduceOp) override { no_transfer(); }
  std::unique_ptr<CommRequest> iall_reduce(float*, int64_t) override { no_transfer(); }
  std::unique_ptr<CommRequest> ireduce_scatter(const float*, float*, const std::vector<int64_t>&) override {
    no_transfer();
  }
  std::unique_ptr<CommRequest> iall_gather(float*, const std::vector<int64_t>&) override { no_transfer(); }
  void broadcast(void*, int64_t, int) override { no_transfer(); }
  void send(const float*, int64_t, int, int) override { no_transfer(); }
  void recv(float*, int64_t, int, int) override { no_transfer(); }
  std::unique_ptr<CommRequest> isend(const float*, int64_t, int, int) override { no_transfer(); }
  std::unique_ptr<CommRequest> irecv(float*, int64_t, int, int) override { no_transfer(); }
  void barrier() override { no_transfer(); }

 private:
  [[noreturn]] static void no_transfer() { LATTICE_FAIL() << "a layout-only group cannot communicate"; }
  int rank_, size_;
  std::vector<int> ranks_;
};

}  // namespace lattice
