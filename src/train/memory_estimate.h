// The memory of one rank, estimated from the parallel layout and the precision without
// allocating the model (--log-memory, --dry-run; docs/memory.md). Megatron's accounting:
//   model state = parameters x (weight bytes + gradient bytes) + owned parameters x
//                 optimizer-state bytes, where a rank owns all of its parameters, or
//                 1/DP of every gradient bucket with the distributed optimizer;
//   activations = the stage's activation arena: micro-batches in flight under the
//                 pipeline schedule x the bytes of one micro-batch, plus shared scratch;
//   peak        = model state + activations + the process baseline (resident memory
//                 before the model exists: binary, libraries, oneDNN, MPI).
// fp32 today: 4 + 4 bytes per parameter plus Adam's 8 (SGD's 4) per owned one, i.e.
// 16 -> 8 + 8/d with the distributed optimizer (d = DP).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer_config.h"
#include "optim/muon.h"
#include "pipeline/schedule.h"

namespace lattice {

// Bytes per parameter of each copy of the model's state. fp32: main 4, grads 4, no
// copy. bf16 with fp32 main parameters and gradients: weight_copy 2 as well (18 bytes
// per parameter with Adam, 10 + 8/d with the distributed optimizer, since lattice keeps
// the fp32 parameters whole on every rank and all-gathers them after the update).
struct PrecisionBytes {
  int main_params = 4;   // the parameters the optimizer updates, whole on every rank
  int weight_copy = 0;   // the copy the GEMMs read (bf16: 2; widened to fp32 on a CPU without AMX: 4), 0 without
  int grads = 4;         // the gradient buffer, whole on every rank
};

// Everything the estimate depends on; a pure function of the flags.
struct MemoryLayout {
  TransformerConfig config;               // finalized: padded vocabulary filled in
  int64_t micro_batch_size = 1, seq_length = 0;
  int tp = 1, pp = 1, dp = 1;
  int ep = 1;                             // --expert-model-parallel-size: E / ep experts per rank
  int cp = 1;                             // --context-parallel-size: seq_length / cp tokens per rank
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  int dist_opt_instances = 1;             // --num-distributed-optimizer-instances: each shards over dp x cp / it
  bool tp_pp_dp = false;                  // --use-tp-pp-dp-mapping: world ranks in tp-pp-dp order
  bool grad_reduce_in_bf16 = false;       // bf16 copies of the buckets for the DP reduction
  int64_t ddp_bucket_size = 0;            // elements per gradient bucket; 0: the default
  int64_t ddp_num_buckets = 0;            // > 0: buckets of (the rank's parameters) / this instead
  PipelineLayout pipeline;                // stages == pp
  int64_t num_micro_batches = 1;          // per rank and iteration
  std::string optimizer = "adam";         // adam: 8 bytes of state per owned parameter, sgd: 4; muon: 4 per
                                          // matrix element it updates, 8 per other
  MuonConfig muon;                        // muon: its scratch too (optim/muon.h)
  bool exp_avg_bf16 = false, exp_avg_sq_bf16 = false;  // --exp-avg(-sq)-dtype bf16: 2 bytes per moment
  PrecisionBytes precision;
  // Optimizer state per owned parameter: SGD's momentum 4; Adam's two moments 4 each, 2 in bf16 (Muon: at
  // most, 4 for the elements of the matrices it updates, their momentum).
  int optimizer_state_bytes() const {
    return optimizer == "sgd" ? 4 : (exp_avg_bf16 ? 2 : 4) + (exp_avg_sq_bf16 ? 2 : 4);
  }
  // The ranks the distributed optimizer shards over: dp x cp, or an instance's part of it.
  int shard_ranks() const { return dp * cp / dist_opt_instances; }
};

struct RankMemory {
  int world_rank = 0, tp_rank = 0, pp_rank = 0, dp_rank = 0, cp_rank = 0;
  int64_t parameters = 0;        // this rank's parameter elements (its TP parts of its stage)
  int64_t buffer_elements = 0;   // the flat buffer: parameters plus 64-byte alignment padding
  int64_t owned_parameters = 0;  // elements whose optimizer state this rank keeps
  size_t param_bytes = 0;        // buffer_elements x main_params
  size_t weight_copy_bytes = 0;  // buffer_elements x weight_copy
  size_t grad_bytes = 0;         // buffer_elements x grads
  size_t optimizer_bytes = 0;    // owned_parameters x optimizer_state_bytes() (8 Adam | 4 SGD; Muon 4
                                 // fewer per matrix element, plus its scratch)
  size_t grad_staging_bytes = 0; // distributed optimizer: the reduce-scatter output, 4 per owned
                                 // (--grad-reduce-in-bf16: 2 per owned, plus 2 per element for
                                 // the buffer's bf16 copy whenever data parallelism runs)
  // The MPI library's temporary copies of the gradient buckets during the data-parallel
  // reduction (Open MPI's non-blocking collectives, libnbc: a binomial tree over the DP
  // group; every bucket is in flight at once when the reduction finishes). Reduce-scatter:
  // a rank that receives from k children holds min(k, 2) copies; in-place all-reduce: one
  // copy on a rank that receives, and on every rank when ceil(log2 DP) is odd.
  // With PP > 1 and tied embeddings the first and last stage also all-reduce the word
  // embedding's gradient (one copy of it); the larger of the two counts.
  size_t comm_staging_bytes = 0;
  int activation_slots = 1;      // micro-batches a chunk keeps at once (the schedule's in-flight)
  size_t activation_bytes_per_micro_batch = 0;  // one slot of every chunk
  size_t activation_bytes = 0;   // the whole arena: slots x per micro-batch + shared scratch
  size_t baseline_bytes = 0;     // resident before the model (measured, not estimated)

  size_t model_state_bytes() const {
    return param_bytes + weight_copy_bytes + grad_bytes + optimizer_bytes + grad_staging_bytes + comm_staging_bytes;
  }
  size_t peak_bytes() const { return model_state_bytes() + activation_bytes + baseline_bytes; }
};

// World rank -> (tp, dp, pp) ranks in Megatron's order: w = tp_rank + TP*(dp_rank + DP*pp_rank).
RankMemory estimate_rank_memory(const MemoryLayout& layout, int world_rank, size_t baseline_bytes);
// Every rank's estimate, in world-rank order, each with the same baseline.
std::vector<RankMemory> estimate_all_ranks(const MemoryLayout& layout, size_t baseline_bytes);

// This process's resident memory (VmRSS) and its peak so far (VmHWM) from
// /proc/self/status, in bytes; 0 where the file or field is missing.
size_t resident_bytes();
size_t peak_resident_bytes();
// Device memory in use on this process's GPU (cudaMemGetInfo: total - free, the CUDA
// context and every allocation of this and other processes on it); 0 unless the
// kernels run on a GPU. The --log-memory baseline and measurement under --device cuda
// (device buffers are allocated once, so the value after the first iterations is the
// peak).
size_t device_used_bytes();

}  // namespace lattice
