// fp8 with current scaling: Megatron's --fp8-recipe tensorwise, blockwise and mxfp8
// (Transformer Engine's Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling). Each
// GEMM operand is quantized with scales taken from its own values at the GEMM that reads it,
// so nothing is carried from step to step (no amax history, nothing in checkpoints, and a
// recomputed forward quantizes exactly as the first).
//   tensorwise: one scale per tensor, fp8_max / amax (kernels/cast_math.h fp8_tensor_scale).
//       The amax is the whole tensor's: MAX-reduced over the tensor-parallel group (a weight's
//       or a gradient's shards) and, for activations and gradients, the context-parallel group
//       (the sequence's other chunks), so every layout quantizes with the single process's
//       scales. Transformer Engine scales each rank's shard by its own amax instead.
//   blockwise: 1 x 128 blocks along the GEMM's inner dimension for activations and output
//       gradients (128 x 1 for the weight gradient's GEMM, whose inner dimension is the
//       tokens), 128 x 128 blocks for weights; scales powers of 2.
//   mxfp8: 32 values along the inner dimension (1 x 32 or 32 x 1; a weight has one copy for
//       the forward and one for the input gradient), E8M0 scales (powers of 2).
//   A block-scaled operand is handed to the GEMM as the values it stands for (fp8 value
//   divided by a power of 2: exact in bf16), a tensorwise one as its fp8 values with the
//   scales undone by the GEMM's alpha; products are exact in fp32 and summed in fp32.
//   Block scales need no communication. A block that a tensor-parallel or context-parallel
//   split cuts (shards not a multiple of the block) holds other values than the single
//   process's, so its scale, and the run's numbers, differ from the single process's
//   within fp8 rounding.
#pragma once
#include <memory>

#include "model/mixed_precision.h"

namespace lattice {

std::unique_ptr<MixedPrecisionPolicy> make_fp8_current_scaling_policy(const Fp8Recipe& recipe, Comm* tp,
                                                                      const Fp8Params& params);

}  // namespace lattice
