#include "model/tensor_parallel.h"

#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "dist/comm.h"
#include "kernels/elementwise.h"
#include "model/linear.h"

namespace lattice {

int TensorParallel::rank() const { return comm ? comm->rank() : 0; }
int TensorParallel::size() const { return comm ? comm->size() : 1; }

void reduce_from_tensor_parallel_region(const TensorParallel& tp, float* partial, float* out,
                                        int64_t N, int64_t C) {
  if (tp.sp()) {
    const std::vector<int64_t> counts(size_t(tp.size()), tp.shard_rows(N) * C);
    tp.comm->reduce_scatter(partial, out, counts);
    return;
  }
  LATTICE_CHECK(partial == out) << "tensor-parallel all-reduce works in place";
  if (tp.size() > 1) tp.comm->all_reduce(out, N * C, ReduceOp::sum);
}

void gather_from_sequence_parallel_region(const TensorParallel& tp, float* full, int64_t N, int64_t C) {
  if (!tp.sp()) return;
  const std::vector<int64_t> counts(size_t(tp.size()), tp.shard_rows(N) * C);
  tp.comm->all_gather(full, counts);
}

void column_parallel_linear_backward(const TensorParallel& tp, float* dx_full, float* dx_shard,
                                     float* dW, float* db, const float* dy, LinearInput x,
                                     const float* W, int64_t N, int64_t in, int64_t out_local,
                                     const GemmSite& site, const uint16_t* dy_bf16) {
  LATTICE_CHECK(!site.packed_input_grad || tp.size() == 1)
      << "column_parallel_linear_backward: a bf16 input gradient that the tensor-parallel group reduces";
  GemmSite partial = site;
  partial.partial_sum = true;
  linear_backward(dx_full, dW, db, dy, x, W, N, in, out_local, false, partial, dy_bf16);
  float* dx = tp.sp() ? dx_shard : dx_full;
  reduce_from_tensor_parallel_region(tp, dx_full, dx, N, in);
  if (site.policy && !site.caller_rounds) site.policy->round_result(dx, tp.shard_rows(N) * in);
}

void row_parallel_linear_forward(const TensorParallel& tp, float* y, float* partial, LinearInput x,
                                 const float* W, const float* b, int64_t N, int64_t in_local, int64_t out,
                                 const GemmSite& site) {
  GemmSite partial_site = site;
  partial_site.partial_sum = true;
  linear_forward(partial, x, W, nullptr, N, in_local, out, partial_site);
  reduce_from_tensor_parallel_region(tp, partial, y, N, out);
  LATTICE_CHECK(!(site.caller_rounds && b)) << "row_parallel_linear_forward: a bias with a result the caller rounds";
  round_and_add_bias(y, b, tp.shard_rows(N), out, site.caller_rounds ? Rounding::none : rounding(site));
}

void row_parallel_linear_backward(const TensorParallel& tp, float* dx_local, float* dW, float* db,
                                  const float* dy, float* dy_full, LinearInput x, const float* W,
                                  int64_t N, int64_t in_local, int64_t out, const GemmSite& site,
                                  const uint16_t* dy_bf16) {
  LATTICE_CHECK(!(dy_bf16 && tp.sp())) << "row_parallel_linear_backward: a bf16 output gradient of a shard";
  const float* g = dy;
  if (tp.sp()) {
    const int64_t rows = tp.shard_rows(N);
    copy_on_device(dy_full + tp.shard_begin(N) * out, dy, size_t(rows * out) * sizeof(float));
    gather_from_sequence_parallel_region(tp, dy_full, N, out);
    g = dy_full;
  }
  linear_backward(dx_local, dW, db, g, x, W, N, in_local, out, false, site, dy_bf16);
}

}  // namespace lattice
