// Tensor parallelism (Megatron's tensor_parallel package) for one model chunk: the
// group, the sequence-parallel switch, the communication operators and the parallel
// layers built on linear_forward/linear_backward. With one rank every operator is an
// identity, so the model runs the same code for every T.
//
// Activations are [N, C] with N = B*S tokens in batch-major order. With sequence
// parallelism rank r holds the token rows [r*N/T, (r+1)*N/T) of the residual stream
// ([N/T, C], the "shard"); Megatron's [s, b, h] layout shards the sequence dimension,
// lattice's [b, s, h] layout shards the flattened tokens: the same bytes and the same
// per-token work (docs/distributed.md).
#pragma once
#include <cstdint>

#include "model/linear.h"

namespace lattice {

class Comm;

struct TensorParallel {
  Comm* comm = nullptr;            // the tensor-parallel group; null: one rank
  bool sequence_parallel = false;  // --sequence-parallel (ignored with one rank)

  int rank() const;
  int size() const;
  bool sp() const { return sequence_parallel && size() > 1; }
  // Token rows of this rank's shard of N rows: N/T with sequence parallelism, else N.
  int64_t shard_rows(int64_t N) const { return sp() ? N / size() : N; }
  int64_t shard_begin(int64_t N) const { return sp() ? shard_rows(N) * rank() : 0; }
};

// g (reduce_from_tensor_model_parallel_region) forward / f backward, and their
// sequence-parallel form (reduce_scatter_to_sequence_parallel_region):
// partial [N, C] holds this rank's partial sum. Without sequence parallelism the sum is
// all-reduced in place (out must be partial); with it, this rank's rows of the sum are
// reduce-scattered into out [N/T, C].
void reduce_from_tensor_parallel_region(const TensorParallel& tp, float* partial, float* out,
                                        int64_t N, int64_t C);

// gather_from_sequence_parallel_region: full [N, C] holds this rank's shard at its rows
// (shard_begin); afterwards every rank's shard. Nothing without sequence parallelism.
void gather_from_sequence_parallel_region(const TensorParallel& tp, float* full, int64_t N, int64_t C);

// ColumnParallelLinear backward: dW [out_local, in] and db [out_local] accumulate;
// dx_full [N, in] = dy W_local is this rank's partial input gradient, then reduced as
// the f operator's backward: all-reduced in place, or reduce-scattered into
// dx_shard [N/T, in] with sequence parallelism. (Forward is linear_forward on the full
// input: no communication.) dy_bf16: as in linear_backward.
void column_parallel_linear_backward(const TensorParallel& tp, float* dx_full, float* dx_shard,
                                     float* dW, float* db, const float* dy, LinearInput x,
                                     const float* W, int64_t N, int64_t in, int64_t out_local,
                                     const GemmSite& site = {}, const uint16_t* dy_bf16 = nullptr);

// RowParallelLinear forward: partial [N, out] = x_local [N, in_local] W_local^T, reduced
// (all-reduce in place, or reduce-scatter into y [N/T, out] with sequence parallelism),
// then the bias added to the reduced rows. Without sequence parallelism y must be partial.
void row_parallel_linear_forward(const TensorParallel& tp, float* y, float* partial, LinearInput x,
                                 const float* W, const float* b, int64_t N, int64_t in_local, int64_t out,
                                 const GemmSite& site = {});

// RowParallelLinear backward: dy is [N, out] (replicated) or, with sequence parallelism,
// this rank's [N/T, out] shard, all-gathered first into dy_full [N, out] (unused
// otherwise). db [out] gets the bias gradient of all N rows on every rank; dW
// [out, in_local] accumulates; dx_local [N, in_local] is written. dy_bf16 (without sequence
// parallelism only): dy's bf16 cast for the GEMMs, as linear_backward takes it.
void row_parallel_linear_backward(const TensorParallel& tp, float* dx_local, float* dW, float* db,
                                  const float* dy, float* dy_full, LinearInput x, const float* W,
                                  int64_t N, int64_t in_local, int64_t out, const GemmSite& site = {},
                                  const uint16_t* dy_bf16 = nullptr);

}  // namespace lattice
