// Megatron's --check-weight-hash-across-dp-replicas-interval N: every N iterations each rank
// hashes its parameters (CRC-32 of each tensor's fp32 bytes, checkpoint/checksum.h) and the
// data-parallel replicas compare them, so a replica that drifted (a missed gradient reduction,
// a bad parameter gather, a flipped bit) stops the run at the iteration it is seen instead of
// training on silently. The dense parameters are replicas over the data- and context-parallel
// group; a routed expert's weights over the expert data-parallel group (the ranks holding the
// same experts). Collective over both groups: every rank of them calls it together.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "dist/comm.h"
#include "optim/param_buffer.h"

namespace lattice {

// The first parameter (in registration order; the dense ones, then the experts') whose hash
// differs between replicas, the group rank of the lowest replica that differs from the group's
// rank 0, and both hashes.
struct WeightHashMismatch {
  std::string param;
  int rank = 0;        // in the group (its world rank below)
  int world_rank = 0;  // of that replica
  int rank0_world_rank = 0;
  uint32_t rank0_hash = 0, hash = 0;
};

// Nothing when every replica holds the same bits. dense: the data-parallel (with context
// parallelism, data- and context-parallel) group; expert: the expert data-parallel group (the
// same group without expert parallelism), inside it. Every rank of the dense group gets the
// same answer (a difference between one expert group's replicas included).
std::optional<WeightHashMismatch> find_weight_hash_mismatch(const ParamBuffer& params, Comm& dense, Comm& expert);

// find_weight_hash_mismatch, then over `world` (every rank): when any replicas differ, every
// rank throws a lattice::Error, those of the group concerned naming the parameter, both ranks
// and the iteration.
void check_weight_hashes_across_dp_replicas(const ParamBuffer& params, Comm& dense, Comm& expert, Comm& world,
                                            int64_t iteration);

// Tests only: with LATTICE_TEST_PERTURB_REPLICA=R in the environment, world rank R adds 1e-3 to
// the first element of its last dense parameter (the final norm's), so that a run under mpirun
// shows the check's error end to end.
void apply_test_replica_perturbation(const ParamBuffer& params, int world_rank);

}  // namespace lattice
