// Megatron's model FLOPs per iteration (training: forward + backward = 3x forward),
// used for TFLOP/s and MFU.
#pragma once
#include <cstdint>

#include "model/transformer_config.h"

namespace lattice {

// per_token = L*(6*h*ffn*ffn_mult + 6*(h*(q+k+v) + q*h)) + 6*h*V_padded
// FLOPs = GBS*s*per_token + GBS*s*s*6*q*L   (causal attention, already halved)
double megatron_flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size,
                                    int64_t seq_length);

// Peak fp32 GEMM throughput of this machine in TFLOP/s, measured with a short
// calibration (n=1024 sgemms through the GEMM facade for ~0.4 s, best call; on a GPU
// n=4096 sgemms on device buffers). A bf16 run on a GPU compares against its dense bf16
// peak instead: give --peak-tflops (989 on an H100/H200).
double measure_peak_tflops();

}  // namespace lattice
